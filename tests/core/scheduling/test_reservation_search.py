"""The reservation search finds the first end time at which the head passes the device check by
doubling and halving batches of end times (`backfill._first_passing`); it must reserve exactly as
checking every end time in turn does (the plain walk below, the search as it was)."""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import cluster, pod, workload
from gpupool.core.model import Workload
from gpupool.core.scheduling import backfill
from gpupool.core.scheduling.backfill import Reservation
from gpupool.core.scheduling.cycle import Policies, cycle_on
from gpupool.core.scheduling.gang import place_gang, release_gang
from gpupool.core.scheduling.policies.base import NoFit, make_policy
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.state import ClusterState, clone_state, release_many

EASY = Policies(placement="first-fit", ordering="fifo", backfill=True)


def _plain_first_fit_in_time(
    head: Workload, view: ClusterView, now_s: float, policy: object, rng: random.Random,
    ends: list[tuple[float, str]], end_milli: list[int],
) -> Reservation | None:
    """The search checking every end time in turn, from the first with enough compute free."""
    running = view.running
    shadow = clone_state(view.state)
    allowed = backfill._allowed(head, shadow)
    if bool(allowed.sum() == shadow.dev_valid.sum()):
        freed = np.cumsum(end_milli)
    else:
        freed = np.cumsum([backfill._allowed_milli(running[rid], allowed) for _, rid in ends])
    short = head.total_device_milli - int(shadow.dev_milli_free[allowed].sum())
    i = int(np.searchsorted(freed, short, side="left")) if short > 0 else 0
    if i >= len(ends):
        return None
    done = 0
    could_fit = backfill._device_check(head, backfill._required_domains(head, view, policy))  # type: ignore[arg-type]
    trials = 0
    while trials < backfill.MAX_RESERVATION_TRIALS:
        t = max(ends[i][0], now_s)
        i = bisect.bisect_right(ends, t, lo=i, key=backfill._end)
        release_many(shadow, [rec for _, rid in ends[done:i] for _, rec in running[rid].allocs])
        done = i
        if could_fit(shadow):
            trials += 1
            gang = place_gang(head, shadow, policy, rng)  # type: ignore[arg-type]
            if not isinstance(gang, NoFit):
                release_gang(gang, shadow)
                return Reservation(head, t, shadow, fits_on=backfill.nodes_mask(gang, shadow))
        if i >= len(ends):
            return None
    return None


def _state_key(state: ClusterState) -> tuple[object, ...]:
    arrays = (state.cpu_free, state.mem_free, state.dev_milli_free, state.dev_mem_free, state.node_version)
    kinds = [sorted(k.items()) for k in state.node_pod_kinds]
    return (*(a.tolist() for a in arrays), state.heavy_slices, kinds)


def _busy_pool(rng: random.Random) -> tuple[ClusterView, float]:
    """A pool of 6 nodes x 4 devices filled with whole and fractional pods and gangs of random
    estimates (some alike, some overdue by the time returned)."""
    view = ClusterView.empty(cluster(6, devices=4))
    now = 0.0
    for k in range(40):
        shape = rng.choice([0.25, 0.5, 1, 2, 4])
        pods = tuple(pod(shape) for _ in range(rng.choice([1, 1, 2, 3])))
        estimate = rng.choice([None, float(rng.choice([50, 100, 100, 200, 300, 400, 800]))])
        w = replace(workload(*pods, wid=f"r{k}", submit_s=now), runtime_estimate_s=estimate)
        cycle_on(view, [w], EASY, now, random.Random(k))
        now += rng.choice([0.0, 5.0, 10.0])
    return view, now + rng.choice([0.0, 60.0, 150.0])


@pytest.mark.parametrize("seed", range(40))
def test_the_batched_search_reserves_as_checking_every_end_time(seed: int) -> None:
    rng = random.Random(seed)
    view, now = _busy_pool(rng)
    view.materialize()
    if not view.ends:
        pytest.skip("no run with an estimate")
    ends, end_milli, _ = backfill._expected_ends(view, now, True)
    policy = make_policy("first-fit")
    checked = 0
    for h in range(12):
        shape = rng.choice([0.5, 1, 2, 3, 4])
        head = workload(*(pod(shape) for _ in range(rng.choice([1, 2, 3, 5]))), wid=f"head{h}")
        fast = backfill._first_fit_in_time(head, view, now, policy, random.Random(h), ends, end_milli)
        plain = _plain_first_fit_in_time(head, view, now, policy, random.Random(h), ends, end_milli)
        assert (fast is None) == (plain is None)
        if fast is not None and plain is not None:
            checked += 1
            assert fast.start_s == plain.start_s
            assert np.array_equal(fast.fits_on, plain.fits_on)  # type: ignore[arg-type]
            assert _state_key(fast.shadow) == _state_key(plain.shadow)
    assert checked or math.isfinite(now)


@pytest.mark.parametrize("seed", range(40))
def test_a_hinted_search_reserves_as_the_plain_walk_wherever_the_hint_lies(seed: int) -> None:
    """`hint_s` (the head's last reserved start) only says where to look first: at every end time,
    between two, before now and past the last, the search reserves as the plain walk does."""
    rng = random.Random(seed)
    view, now = _busy_pool(rng)
    view.materialize()
    if not view.ends:
        pytest.skip("no run with an estimate")
    ends, end_milli, _ = backfill._expected_ends(view, now, True)
    times = sorted({t for t, _ in ends})
    hints = [now - 1.0, *times, *(t + 0.5 for t in times), times[-1] + 1e6]
    policy = make_policy("first-fit")
    compared = 0
    for h in range(6):
        shape = rng.choice([0.5, 1, 2, 3, 4])
        head = workload(*(pod(shape) for _ in range(rng.choice([1, 2, 3, 5]))), wid=f"head{h}")
        plain = _plain_first_fit_in_time(head, view, now, policy, random.Random(h), ends, end_milli)
        for hint in hints:
            fast = backfill._first_fit_in_time(head, view, now, policy, random.Random(h), ends, end_milli,
                                               hint_s=hint)
            assert (fast is None) == (plain is None), hint
            if fast is not None and plain is not None:
                compared += 1
                assert fast.start_s == plain.start_s, hint
                assert np.array_equal(fast.fits_on, plain.fits_on), hint  # type: ignore[arg-type]
                assert _state_key(fast.shadow) == _state_key(plain.shadow), hint
    assert compared or math.isfinite(now)


def test_the_hinted_search_passes_over_every_group_before_the_hint_with_one_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the hint is right, the search checks the group before it and the hint's own group, and
    nothing else (the plain search checks its way up from the first group with enough compute)."""
    view = ClusterView.empty(cluster(4, devices=4))
    for k in range(16):  # a whole device each (first fit: node k // 4), the nodes' ends interleaved
        end_s = 100.0 * ((k % 4) * 4 + k // 4 + 1)  # node j's devices free at j+1, j+5, j+9, j+13 (x100 s)
        w = replace(workload(pod(1), wid=f"r{k:02d}", submit_s=0.0), runtime_estimate_s=end_s)
        cycle_on(view, [w], EASY, 0.0, random.Random(k))
    view.materialize()
    ends, end_milli, _ = backfill._expected_ends(view, 0.0, True)
    # two whole nodes: enough compute is free at 800 s, but the second whole node only at 1400 s
    head = workload(*(pod(4) for _ in range(2)), wid="head")
    policy = make_policy("first-fit")
    checks: list[int] = []
    device_check = backfill._device_check

    def counted(head: Workload, domains: object = None) -> object:
        check = device_check(head, domains)  # type: ignore[arg-type]

        def run(state: ClusterState) -> bool:
            checks.append(1)
            return check(state)

        return run

    monkeypatch.setattr(backfill, "_device_check", counted)
    plain = backfill._first_fit_in_time(head, view, 0.0, policy, random.Random(0), ends, end_milli)
    plain_checks = len(checks)
    checks.clear()
    hinted = backfill._first_fit_in_time(head, view, 0.0, policy, random.Random(0), ends, end_milli,
                                         hint_s=1400.0)
    assert plain is not None and hinted is not None
    assert plain.start_s == hinted.start_s == 1400.0
    assert len(checks) == 2 < plain_checks


@pytest.mark.parametrize("seed", range(30))
def test_a_bounded_search_finds_every_start_it_is_asked_for(seed: int) -> None:
    """`wanted` (a stuck gang's leaf search: a start of use only by less than the loss and no more
    than the cap after `not_before_s`) stops the search past those starts: it reserves as the whole
    search wherever that start is of use, and finds none where it is not (or there is none)."""
    rng = random.Random(seed)
    view, now = _busy_pool(rng)
    view.materialize()
    if not view.ends:
        pytest.skip("no run with an estimate")
    ends, _, _ = backfill._expected_ends(view, now, True)
    times = sorted({t for t, _ in ends})
    policy = make_policy("first-fit")
    used = unused = 0
    for h in range(4):
        shape = rng.choice([0.5, 1, 2, 3, 4])
        head = workload(*(pod(shape) for _ in range(rng.choice([1, 2, 3, 5]))), wid=f"head{h}")
        for not_before in (now, times[0], times[len(times) // 2]):
            whole, _ = backfill._reserve(head, view, now, policy, random.Random(h), not_before_s=not_before)
            # the limits at every end time's delay exactly, and just either side of it
            delays = [t - not_before for t in times] + [0.0, math.inf]
            for delay in delays:
                for loss, cap in ((delay, math.inf), (math.inf, delay), (delay + 0.5, delay),
                                  (delay, delay - 0.5), (delay + 0.5, math.inf)):
                    bounded, _ = backfill._reserve(head, view, now, policy, random.Random(h),
                                                   not_before_s=not_before, wanted=(loss, cap))
                    # reserve_in_domain's own test of a later start
                    if whole is not None and (whole.start_s - not_before < loss
                                              and whole.start_s - not_before <= cap):
                        used += 1
                        assert bounded is not None
                        assert bounded.start_s == whole.start_s
                        assert np.array_equal(bounded.fits_on, whole.fits_on)  # type: ignore[arg-type]
                        assert _state_key(bounded.shadow) == _state_key(whole.shadow)
                    else:
                        unused += 1
                        assert bounded is None
    assert unused
    if not used:
        pytest.skip("no head fits at any end time of this pool")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 8000), max_size=40), st.integers(-5, 200_000))
def test_the_first_end_time_reaching_the_shortfall_is_numpys(amounts: list[int], short: int) -> None:
    """`first_reaching` adds up only as far as it must, and finds what the sorted search over the
    whole running total finds (the reservation search starts there), a lazy iterable included."""
    expected = int(np.searchsorted(np.cumsum(amounts, dtype=np.int64), short, side="left"))
    assert backfill.first_reaching(amounts, short, len(amounts)) == expected
    assert backfill.first_reaching(iter(amounts), short, len(amounts)) == expected
