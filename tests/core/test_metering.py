"""Metering arithmetic: slice-seconds are the integral of held slices, and cost follows the price book."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.metering import (
    DAY_S,
    HeldSlice,
    PodInterval,
    PriceBook,
    PriceVersion,
    SliceShare,
    Tier,
    UsageKey,
    aggregate,
    day_of,
    totals,
)

GIB = 1024
A100 = 80 * GIB


def book(*versions: PriceVersion) -> PriceBook:
    return PriceBook(versions or (PriceVersion(0.0, {"a100": 2.0}),))


def pod(start: float, end: float, *slices: HeldSlice, tenant: str = "t", cls: str = "normal",
        pod_id: str = "p") -> PodInterval:
    return PodInterval(pod_id, tenant, "q", cls, "n0", start, end, slices)


def test_a_slice_is_priced_by_its_dominant_share_so_memory_counts() -> None:
    small = pod(0, 3600, HeldSlice("A100", 250, 8 * GIB, A100))
    large = pod(0, 3600, HeldSlice("A100", 250, 40 * GIB, A100), pod_id="p2")
    [a] = aggregate([small], book(), [UsageKey.TENANT])
    [b] = aggregate([large], book(), [UsageKey.TENANT])
    assert math.isclose(a.cost, 2.0 * 0.25) and math.isclose(b.cost, 2.0 * 0.5)
    assert a.device_hours == b.device_hours == 0.25
    assert math.isclose(b.memory_gib_hours, 40.0)
    assert a.dedicated_cost == b.dedicated_cost == 2.0  # one whole device each


def test_weighted_share_and_class_multiplier() -> None:
    version = PriceVersion(0.0, {"a100": 2.0}, class_multipliers={"best-effort": 0.5},
                           share=SliceShare.WEIGHTED, compute_weight=0.5)
    [row] = aggregate([pod(0, 3600, HeldSlice("A100", 250, 40 * GIB, A100), cls="best-effort")],
                      book(version), [UsageKey.TENANT])
    assert math.isclose(row.cost, 2.0 * (0.5 * 0.25 + 0.5 * 0.5) * 0.5)


def test_a_bill_uses_the_prices_in_force_at_each_moment() -> None:
    versions = (PriceVersion(0.0, {"a100": 1.0}), PriceVersion(DAY_S, {"a100": 3.0}))
    interval = pod(DAY_S - 3600, DAY_S + 3600, HeldSlice("A100", 1000, A100, A100))
    [row] = aggregate([interval], book(*versions), [UsageKey.TENANT])
    assert math.isclose(row.cost, 1.0 + 3.0)
    days = aggregate([interval], book(*versions), [UsageKey.DAY])
    assert [(r.keys["day"], round(r.cost, 9)) for r in days] == [("1970-01-01", 1.0), ("1970-01-02", 3.0)]


def test_an_hourly_price_is_what_a_bill_of_that_interval_charges_a_device() -> None:
    night = Tier(22 * 3600.0, 6 * 3600.0, 0.5)
    versions = book(PriceVersion(0.0, {"a100": 1.0}), PriceVersion(DAY_S, {"a100": 3.0}, tiers=(night,)),
                    PriceVersion(10 * DAY_S, {"a100": 9.0}))
    assert versions.hourly_price("A100", 3600, 7200) == 1.0  # later versions not yet in force
    interval = pod(DAY_S - 3600, DAY_S + 3600, HeldSlice("A100", 1000, A100, A100))
    [row] = aggregate([interval], versions, [UsageKey.TENANT])
    assert math.isclose(versions.hourly_price("A100", DAY_S - 3600, DAY_S + 3600) * 2, row.cost)
    assert versions.hourly_price("A100", DAY_S + 12 * 3600, DAY_S + 12 * 3600) == 3.0  # an instant
    assert versions.hourly_price("G2", 0, 3600) == 0.0


def test_time_of_day_tiers_wrap_past_midnight() -> None:
    night = Tier(22 * 3600.0, 6 * 3600.0, 0.5)
    version = PriceVersion(0.0, {"a100": 1.0}, tiers=(night,))
    [row] = aggregate([pod(0, DAY_S, HeldSlice("A100", 1000, 0, A100))], book(version), [UsageKey.TENANT])
    assert math.isclose(row.cost, 16 + 8 * 0.5)


def test_an_unpriced_model_costs_nothing_and_says_so() -> None:
    [row] = aggregate([pod(0, 3600, HeldSlice("G2", 500, 0))], book(), [UsageKey.MODEL])
    assert (row.cost, row.priced, row.keys) == (0.0, False, {"model": "G2"})
    assert math.isclose(row.device_hours, 0.5)


def test_simulated_devices_are_metered_apart() -> None:
    rows = aggregate([pod(0, 10, HeldSlice("A100", 1000, 0, A100)),
                      pod(0, 10, HeldSlice("A100", 1000, 0, A100, simulated=True), pod_id="p2")],
                     book(), [UsageKey.MODEL])
    assert [(r.simulated, r.compute_milli_s) for r in rows] == [(False, 10_000.0), (True, 10_000.0)]


def test_day_of_matches_the_calendar() -> None:
    assert day_of(0) == "1970-01-01"
    assert day_of(1_796_083_200) == "2026-12-01"  # 2026-12-01T00:00Z
    assert day_of(1_796_083_199) == "2026-11-30"
    assert day_of(951_782_400) == "2000-02-29"


# ----------------------------------------------------------------- the metering property

_SLICE = st.builds(HeldSlice, st.just("A100"), st.integers(1, 1000), st.integers(0, A100), st.just(A100),
                   st.booleans())


@st.composite
def _workload_history(draw: st.DrawFn) -> list[PodInterval]:
    """Workloads run in attempts (a preemption or requeue ends one, the next starts later), some pods
    never start, and a restart at `crash` closes the pods the provider lost there."""
    pods: list[PodInterval] = []
    crash = draw(st.integers(0, 3 * 86_400))
    for w in range(draw(st.integers(0, 6))):
        at = draw(st.integers(0, 2 * 86_400))
        for attempt in range(draw(st.integers(1, 3))):
            length = draw(st.integers(0, 40_000))
            end = at + length
            if draw(st.booleans()) and at < crash < end:
                end = crash  # lost across the restart: closed when the server came back
            for rank in range(draw(st.integers(1, 2))):
                slices = tuple(draw(st.lists(_SLICE, min_size=1, max_size=2)))
                pods.append(PodInterval(f"w{w}-a{attempt}-r{rank}", f"t{w % 2}", "q", "normal", f"n{rank}",
                                        float(at), float(end), slices))
            at = end + draw(st.integers(0, 5000))  # waits (pending, waiting) are not metered
    return pods


@settings(max_examples=60, deadline=None)
@given(_workload_history(), st.integers(0, 86_400), st.integers(1, 3 * 86_400),
       st.lists(st.sampled_from(list(UsageKey)), max_size=3, unique=True))
def test_metered_slice_seconds_are_the_integral_of_held_slices(pods: list[PodInterval], since: int,
                                                              span: int, by: list[UsageKey]) -> None:
    until = since + span
    rows = aggregate(pods, book(), by, float(since), float(until))
    # the integral, by sweeping every boundary of the window and the pods
    edges = sorted({since, until} | {int(p.start_s) for p in pods} | {int(p.end_s) for p in pods})
    edges = [e for e in edges if since <= e <= until]
    integral = mem = 0.0
    for lo, hi in itertools.pairwise(edges):
        mid = (lo + hi) / 2
        held = [s for p in pods if p.start_s <= mid < p.end_s for s in p.slices]
        integral += sum(s.compute_milli for s in held) * (hi - lo)
        mem += sum(s.memory_mib for s in held) * (hi - lo)
    total = totals(rows)
    assert math.isclose(total.compute_milli_s, integral, rel_tol=1e-9, abs_tol=1e-6)
    assert math.isclose(total.memory_mib_s, mem, rel_tol=1e-9, abs_tol=1e-6)
    assert total.cost <= total.dedicated_cost + 1e-9  # a share never exceeds the whole device
