"""Wait or spread: a gang waits for a leaf of its own only while spreading would cost more than waiting,
at most max_wait in all, with its leaf reserved against work that would delay it."""

from __future__ import annotations

import dataclasses
import random

import pytest
from net_helpers import busy, gang, leaves_of, nodes_of, run, two_level, view_on

from factories import cluster, node, pod, workload
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.model import Allocation, Reason, Workload
from gpupool.core.scheduling import backfill, cycle, locality
from gpupool.core.scheduling.cycle import CycleResult, Reserve
from gpupool.core.scheduling.locality import WaitCap
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.topology_spec import Tier

FREE_N001_N003 = [
    busy("n000", 8, "soon", estimate_s=100.0),  # leaf 0 is whole again at t=100
    *(busy(n, 8, f"r{n}", estimate_s=1e6) for n in ("n002", "n004", "n005", "n006", "n007")),
]
"""Free now: n001 (leaf 0) and n003 (leaf 1), so a 2-node gang can start now only across the spine."""


def congested(view: ClusterView, load: float = 0.95) -> ClusterView:
    """Every leaf uplink busy with other traffic: spreading is slow."""
    assert view.topology is not None
    fabric = two_level()
    for leaf in (n for n in fabric.nodes.values() if n.desc.startswith("leaf-")):
        for link in fabric.links_by_node[leaf.id]:
            if fabric.is_switch(link.other(leaf.id)):
                view.topology.set_link(link.key, utilization=load)
    return view


def job(wid: str, estimate_s: float | None, submit_s: float) -> Workload:
    return dataclasses.replace(gang(1, 8, wid=wid, estimate_s=estimate_s), submit_time_s=submit_s)


def test_a_gang_waits_for_its_leaf_when_spreading_costs_more() -> None:
    view = congested(view_on(running=FREE_N001_N003))
    result = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], placement="network-aware")
    (waiting,) = result.rejected
    assert waiting.reason is Reason.WAITING_FOR_LOCALITY and not waiting.final
    assert "expected in 100 s" in waiting.message
    assert result.reservation == Reserve("g", 100.0) and not result.admitted
    assert view.locality_waits == {"g": 0.0}
    assert view.state.dev_milli_free.sum() == 2 * 8 * 1000  # its place was given back


def test_a_gang_spreads_when_spreading_is_cheap() -> None:
    view = view_on(running=FREE_N001_N003)  # quiet links, and a gang that barely communicates
    light = gang(2, 8, spec="comm=0.005", wid="g", estimate_s=10_000.0)
    result = run(view, [light], placement="network-aware")
    assert leaves_of(view, nodes_of(result, "g")) == {0, 1}
    assert view.locality_waits == {}


def test_a_short_gang_spreads_rather_than_wait() -> None:
    view = congested(view_on(running=FREE_N001_N003))
    result = run(view, [gang(2, 8, wid="g", estimate_s=30.0)], placement="network-aware")
    assert leaves_of(view, nodes_of(result, "g")) == {0, 1}  # it would lose ~50 s, less than 100 s


def test_max_wait_caps_the_wait() -> None:
    view = congested(view_on(running=FREE_N001_N003))
    result = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], placement="network-aware",
                 max_locality_wait_s=60.0)  # the leaf is expected in 100 s: more than allowed
    assert nodes_of(result, "g")
    view = congested(view_on(running=FREE_N001_N003))
    assert run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], placement="network-aware").rejected
    later = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], now_s=300.0, placement="network-aware")
    assert nodes_of(later, "g") and "g" not in view.locality_waits  # waited 300 s already


def test_without_estimates_of_running_work_it_does_not_wait() -> None:
    running = [dataclasses.replace(a, workload=dataclasses.replace(a.workload, runtime_estimate_s=None))
               for a in FREE_N001_N003]
    view = congested(view_on(running=running))
    result = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], placement="network-aware")
    assert nodes_of(result, "g")


def test_a_leaf_only_overdue_work_would_free_is_waited_for_only_if_spreading_costs_the_whole_cap() -> None:
    """At t=150 n000's run is 50 s past its estimate: backfill counts it as ending now, but when it
    ends is unknown, so the wait is taken at its worst, the rest of max_wait (300 s)."""
    view = congested(view_on(running=FREE_N001_N003))
    result = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], now_s=150.0, placement="network-aware")
    (waiting,) = result.rejected  # spreading would cost it far more than 300 s
    assert waiting.reason is Reason.WAITING_FOR_LOCALITY and "may take up to 300 s" in waiting.message
    view = congested(view_on(running=FREE_N001_N003))
    result = run(view, [gang(2, 8, wid="g", estimate_s=60.0)], now_s=150.0, placement="network-aware")
    assert leaves_of(view, nodes_of(result, "g")) == {0, 1}  # ~160 s, less than 300 s: it spreads at once
    view = congested(view_on(running=FREE_N001_N003))
    result = run(view, [gang(2, 8, wid="g", estimate_s=60.0)], placement="network-aware")
    assert [r.reason for r in result.rejected] == [Reason.WAITING_FOR_LOCALITY]  # at t=0 the leaf is
    # expected in 100 s, less than what the same spread would cost


def test_backfill_uses_the_reserved_leaf_only_for_work_that_ends_before() -> None:
    view = congested(view_on(running=FREE_N001_N003))
    head = gang(2, 8, wid="g", estimate_s=10_000.0)
    result = run(view, [head, job("short", 50.0, 1.0)], placement="network-aware")
    assert nodes_of(result, "short") == ["n001"]  # ends at 50, before the leaf is due
    view = congested(view_on(running=FREE_N001_N003))
    result = run(view, [head, job("long", None, 1.0), job("long2", None, 2.0)], placement="network-aware")
    assert nodes_of(result, "long") == ["n003"]  # steered off the reserved leaf, to the room elsewhere
    refused = {r.workload_id: r.reason for r in result.rejected}
    assert refused == {"g": Reason.WAITING_FOR_LOCALITY, "long2": Reason.BACKFILL_BLOCKED}


def test_without_steering_work_that_outlasts_the_reservation_is_refused_on_the_reserved_leaf(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cycle, "steer_backfill", False)
    monkeypatch.setattr(cycle, "beside_reserved", False)  # which steers it off after the refusal
    view = congested(view_on(running=FREE_N001_N003))
    head = gang(2, 8, wid="g", estimate_s=10_000.0)
    result = run(view, [head, job("long", None, 1.0)], placement="network-aware")
    refused = {r.workload_id: r.reason for r in result.rejected}
    assert refused == {"g": Reason.WAITING_FOR_LOCALITY, "long": Reason.BACKFILL_BLOCKED}


HALF_OF_LEAF_0 = [
    busy("n000", 4, "half", estimate_s=100.0),
    busy("n001", 8, "soon", estimate_s=100.0),
    *(busy(n, 8, f"r{n}", estimate_s=1e6) for n in ("n002", "n004", "n005", "n006", "n007")),
]
"""Free now: half of n000 (leaf 0) and n003 (leaf 1): a 2-node gang fits nowhere now, and leaf 0
is whole again at t=100."""


def _stuck_head_and_small() -> list[Workload]:
    small = dataclasses.replace(gang(1, 4, wid="small", estimate_s=5_000.0), submit_time_s=1.0)
    return [gang(2, 8, wid="g", estimate_s=10_000.0), small]


def test_backfill_steers_work_off_the_leaf_a_stuck_gang_is_reserved_in() -> None:
    """The placement policy would put the small job in n000's free half (the fuller node); it would
    outlast the gang's reservation there, so it starts on n003 instead and leaf 0 stays the gang's."""
    view = view_on(running=HALF_OF_LEAF_0)
    result = run(view, _stuck_head_and_small(), placement="network-aware", backfill=True)
    assert result.reservation == Reserve("g", 100.0)
    assert nodes_of(result, "small") == ["n003"]


@pytest.mark.parametrize("keep", [True, False])
def test_backfill_never_spreads_a_gang_reserved_in_one_leaf(
    monkeypatch: pytest.MonkeyPatch, keep: bool,
) -> None:
    """Without steering the small job lands in n000's free half. The gang would still fit at t=100,
    but only across the spine (n001 and n003): with `keep_locality` that counts as delaying it, in
    the cycle that reserves and in the next, which reuses the reservation."""
    monkeypatch.setattr(cycle, "steer_backfill", False)
    monkeypatch.setattr(cycle, "beside_reserved", False)  # which would start it on n003 after the refusal
    monkeypatch.setattr(backfill, "keep_locality", keep)
    view = view_on(running=HALF_OF_LEAF_0)
    pending = _stuck_head_and_small()
    result = run(view, pending, placement="network-aware", backfill=True)
    assert result.reservation == Reserve("g", 100.0)
    if not keep:
        assert nodes_of(result, "small") == ["n000"]
        return
    reserving = backfill._reserve
    calls = []
    monkeypatch.setattr(backfill, "_reserve", lambda *a, **k: calls.append(1) or reserving(*a, **k))
    for now_s in (0.0, 10.0):
        result = run(view, pending, now_s=now_s, placement="network-aware", backfill=True)
        assert result.reservation == Reserve("g", 100.0)
        assert {r.workload_id: r.reason for r in result.rejected} == {
            "g": Reason.GANG_INCOMPLETE, "small": Reason.BACKFILL_BLOCKED}
    assert not calls  # both reused the first cycle's reservation, and with it the leaf it keeps


def test_the_default_policy_waits_too() -> None:
    view = congested(view_on(running=FREE_N001_N003))
    result = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)])
    assert [r.reason for r in result.rejected] == [Reason.WAITING_FOR_LOCALITY]


def _busy_pool_cycles(
    cap: WaitCap, *, seed: int, congested_every: int, shapes: list[tuple[int, int]],
    estimates: list[float | None], start: int, per_turn: int, step_s: float, policies: tuple[str, ...],
) -> list[CycleResult]:
    """Twelve cycles of a busy 64-node pool on a 2-level tree with every `congested_every`-th link
    at 90 % load, backfill on: `start` random gangs at first, then each turn `per_turn` of the running
    ones end and as many arrive; the policy of turn k is policies[k % len]. Every live and shadow
    state stays consistent after each cycle (checked)."""
    rng = random.Random(seed)
    view = view_on(cluster(64), fabric=fat_tree(16, levels=2, oversubscription=3.0))
    assert view.topology is not None
    for key in list(view.topology.link_index)[::congested_every]:
        view.topology.set_link(key, utilization=0.9)

    def arrival(i: int, now: float) -> Workload:
        pods, gpus = rng.choice(shapes)
        w = gang(pods, gpus, wid=f"w{i}", estimate_s=rng.choice(estimates))
        return dataclasses.replace(w, submit_time_s=now)

    waiting = {w.id: w for w in (arrival(i, 0.0) for i in range(start))}
    results: list[CycleResult] = []
    now, serial = 0.0, start
    for k in range(12):
        for wid in rng.sample(sorted(view.running), min(per_turn, len(view.running))):
            view.remove(wid)
        for _ in range(per_turn):
            w = arrival(serial, now)
            waiting[w.id] = w
            serial += 1
        result = run(view, list(waiting.values()), now_s=now, placement=policies[k % len(policies)],
                     backfill=True, locality_wait_cap=cap)
        view.state.check_invariants()
        results.append(result)
        for admission in result.admitted:
            del waiting[admission.workload_id]
        now += step_s
    return results


@pytest.mark.parametrize("cap", list(WaitCap))
def test_a_busy_pool_with_waiting_gangs_never_over_allocates(cap: WaitCap) -> None:
    """Many gangs waiting for locality beside backfilled work, cycle after cycle: every shadow and
    live state stays consistent (a gang that waits is never left held in the reservation's shadow)."""
    results = _busy_pool_cycles(
        cap, seed=5, congested_every=3, shapes=[(1, 1), (1, 4), (1, 8), (2, 8), (3, 8), (4, 4)],
        estimates=[None, 50.0, 500.0, 50_000.0], start=300, per_turn=8, step_s=30.0,
        policies=("network-aware", "fgd-strand"))
    waits = sum(r.reason is Reason.WAITING_FOR_LOCALITY for result in results for r in result.rejected)
    assert waits  # the scenario does exercise waiting


FREE_AT_1000 = [busy("n000", 8, "slow", estimate_s=1000.0), *FREE_N001_N003[1:]]
"""As FREE_N001_N003, but leaf 0 is whole again only at t=1000: beyond the 300 s default cap."""


def test_under_the_loss_cap_a_gang_waits_beyond_max_wait_while_spreading_costs_more() -> None:
    view = congested(view_on(running=FREE_AT_1000))
    fixed = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], placement="network-aware")
    assert leaves_of(view, nodes_of(fixed, "g")) == {0, 1}  # 1000 s is past the 300 s cap: it spreads
    view = congested(view_on(running=FREE_AT_1000))
    result = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], placement="network-aware",
                 locality_wait_cap=WaitCap.LOSS)
    (waiting,) = result.rejected
    assert waiting.reason is Reason.WAITING_FOR_LOCALITY and "expected in 1000 s" in waiting.message
    cap = view.locality_caps["g"]
    assert cap > 1000.0 and f"less than the {cap:.0f} s spreading would cost" in waiting.message
    assert f"at most {cap:.0f} s in all" in waiting.message
    assert result.reservation == Reserve("g", 1000.0)


def test_under_the_loss_cap_a_gang_never_waits_longer_in_all_than_spreading_would_cost() -> None:
    view = congested(view_on(running=FREE_AT_1000))
    assert run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], placement="network-aware",
               locality_wait_cap=WaitCap.LOSS).rejected
    cap = view.locality_caps["g"]
    still = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], now_s=cap - 1.0, placement="network-aware",
                locality_wait_cap=WaitCap.LOSS)  # n000 is overdue: the worst case is the cap's last second
    assert "may take up to 1 s" in still.rejected[0].message
    spread = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], now_s=cap + 1.0, placement="network-aware",
                 locality_wait_cap=WaitCap.LOSS)
    assert nodes_of(spread, "g") and "g" not in view.locality_waits and "g" not in view.locality_caps


def test_under_the_loss_cap_a_cheap_spread_keeps_the_fixed_cap() -> None:
    """A short gang whose spread costs less than max_wait: the cap stays max_wait, as without the option."""
    for cap in WaitCap:
        view = congested(view_on(running=FREE_N001_N003))
        result = run(view, [gang(2, 8, wid="g", estimate_s=60.0)], placement="network-aware",
                     locality_wait_cap=cap)
        (waiting,) = result.rejected
        assert "at most 300 s in all" in waiting.message and view.locality_caps == {"g": 300.0}


def test_under_the_loss_cap_overdue_work_is_waited_for_at_most_max_wait_at_a_time() -> None:
    """At t=1050 n000 is 50 s past its estimate: the worst case counted is 300 s (max_wait), not the
    rest of the loss; a gang that would lose more than 300 s spread waits, one that would lose less
    spreads."""
    view = congested(view_on(running=FREE_AT_1000))
    result = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], now_s=1050.0, placement="network-aware",
                 locality_wait_cap=WaitCap.LOSS)
    (waiting,) = result.rejected
    assert "may take up to 300 s" in waiting.message and view.locality_caps["g"] > 1000.0
    view = congested(view_on(running=FREE_AT_1000))
    result = run(view, [gang(2, 8, wid="g", estimate_s=60.0)], now_s=1050.0, placement="network-aware",
                 locality_wait_cap=WaitCap.LOSS)
    assert leaves_of(view, nodes_of(result, "g")) == {0, 1}


def test_under_the_queue_cap_the_loss_counts_for_the_work_queued_behind() -> None:
    """A 300 s gang would lose less spread (about 800 s on the congested uplinks) than the 1000 s
    until its leaf: alone it spreads, under LOSS as under QUEUE. With 40 whole-node jobs queued
    behind it, its spread would burn capacity all of them wait for: it holds 16 of the pool's 64
    GPUs, so under QUEUE the loss weighs 1 + 40 x 16/64 = 11 times as much, and it waits."""
    short = gang(2, 8, wid="g", estimate_s=300.0)
    for cap in (WaitCap.LOSS, WaitCap.QUEUE):
        view = congested(view_on(running=FREE_AT_1000))
        alone = run(view, [short], placement="network-aware", locality_wait_cap=cap)
        assert leaves_of(view, nodes_of(alone, "g")) == {0, 1}
    behind = [dataclasses.replace(gang(1, 8, wid=f"b{i}"), submit_time_s=1.0 + i) for i in range(40)]
    view = congested(view_on(running=FREE_AT_1000))
    loss = run(view, [short, *behind], placement="network-aware", locality_wait_cap=WaitCap.LOSS)
    assert "g" in {a.workload_id for a in loss.admitted}
    view = congested(view_on(running=FREE_AT_1000))
    queue = run(view, [short, *behind], placement="network-aware", locality_wait_cap=WaitCap.QUEUE)
    waiting = {r.workload_id: r for r in queue.rejected}["g"]
    assert waiting.reason is Reason.WAITING_FOR_LOCALITY and "expected in 1000 s" in waiting.message
    assert view.locality_caps["g"] > 1000.0


def test_under_the_loss_cap_every_waiting_gang_holds_its_nodes_not_only_the_first() -> None:
    """g1 waits for leaf 0 (free at t=100) and takes the cycle's reservation; g2, which runs only on
    A100s, waits for leaf 1 (free at t=200). Then x, which fits only n003 (leaf 1's free node):
    under the fixed cap nothing guards g2's leaf, so x takes it and g2's wait is in vain; under the
    loss cap g2 holds n002-n003, so x waits, unless it is expected to end before t=200."""
    a100 = frozenset({"A100"})
    nodes = [node(f"n{i:03d}", model="A100" if i in (2, 3, 4) else "V100M32",
                  cpu_milli=2000 if i == 4 else 64_000) for i in range(8)]
    running = [busy("n000", 8, "soon", estimate_s=100.0), busy("n002", 8, "later", estimate_s=200.0),
               *(busy(f"n00{i}", 8, f"r{i}", estimate_s=1e6) for i in (5, 6, 7))]
    g1 = gang(2, 8, wid="g1", estimate_s=10_000.0)
    g2 = dataclasses.replace(workload(*(pod(8, name=f"p{i}", models=a100) for i in range(2)), wid="g2"),
                             runtime_estimate_s=10_000.0, submit_time_s=1.0)

    def x(estimate_s: float | None) -> Workload:
        w = workload(pod(8, name="p0", models=a100, cpu_milli=4000), wid="x")
        return dataclasses.replace(w, runtime_estimate_s=estimate_s, submit_time_s=2.0)

    def cycle(cap: WaitCap, estimate_s: float | None) -> dict[str, Reason | None]:
        view = congested(view_on(nodes, running=running))
        result = run(view, [g1, g2, x(estimate_s)], placement="network-aware", locality_wait_cap=cap)
        verdicts: dict[str, Reason | None] = {r.workload_id: r.reason for r in result.rejected}
        verdicts.update({a.workload_id: None for a in result.admitted})
        return verdicts

    waiting = Reason.WAITING_FOR_LOCALITY
    assert cycle(WaitCap.FIXED, None) == {"g1": waiting, "g2": waiting, "x": None}
    assert cycle(WaitCap.LOSS, None) == {"g1": waiting, "g2": waiting, "x": Reason.BACKFILL_BLOCKED}
    assert cycle(WaitCap.LOSS, 150.0) == {"g1": waiting, "g2": waiting, "x": None}  # ends before t=200


def test_the_ceiling_bounds_what_stated_estimates_can_buy() -> None:
    """The gang would lose far more than the 1000 s to its leaf: with a 500 s ceiling it spreads at
    once, with a 2000 s ceiling it waits, at most 2000 s in all whatever its loss."""
    view = congested(view_on(running=FREE_AT_1000))
    low = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], placement="network-aware",
              locality_wait_cap=WaitCap.QUEUE, max_locality_wait_ceiling_s=500.0)
    assert leaves_of(view, nodes_of(low, "g")) == {0, 1}
    view = congested(view_on(running=FREE_AT_1000))
    high = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], placement="network-aware",
               locality_wait_cap=WaitCap.LOSS, max_locality_wait_ceiling_s=2000.0)
    assert "at most 2000 s in all" in high.rejected[0].message and view.locality_caps == {"g": 2000.0}


def _leaf_2_later(leaf_free_s: float) -> list[Allocation]:
    """Free now: n005 (leaf 2) only. n000 (leaf 0) frees at t=100, n004 (leaf 2) at `leaf_free_s`:
    a 2-node gang fits nowhere now, spread at t=100, inside leaf 2 at `leaf_free_s`."""
    return [
        busy("n000", 8, "soon", estimate_s=100.0),
        busy("n004", 8, "later", estimate_s=leaf_free_s),
        *(busy(n, 8, f"r{n}", estimate_s=1e6) for n in ("n001", "n002", "n003", "n006", "n007")),
    ]


@pytest.mark.parametrize(("leaf_free_s", "cap", "reserved_s"), [
    (150.0, WaitCap.FIXED, 150.0),  # 50 s later in a leaf: less than spreading costs, within 300 s
    (1000.0, WaitCap.FIXED, 100.0),  # 900 s later: past the 300 s cap, so the spread start stands
    (1000.0, WaitCap.LOSS, 1000.0),  # ... which the loss cap allows, spreading costing far more
])
def test_a_gang_that_fits_nowhere_now_is_reserved_in_a_leaf_when_the_delay_costs_less(
    leaf_free_s: float, cap: WaitCap, reserved_s: float,
) -> None:
    view = congested(view_on(running=_leaf_2_later(leaf_free_s)))
    result = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], placement="network-aware", backfill=True,
                 locality_wait_cap=cap)
    assert [r.reason for r in result.rejected] == [Reason.GANG_INCOMPLETE]
    assert result.reservation == Reserve("g", reserved_s)


def test_a_leaf_reservation_is_not_made_when_turned_off_or_for_a_light_gang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view = congested(view_on(running=_leaf_2_later(150.0)))
    light = gang(2, 8, spec="comm=0.0001", wid="g", estimate_s=100.0)  # spreading costs it < 50 s
    result = run(view, [light], placement="network-aware", backfill=True)
    assert result.reservation == Reserve("g", 100.0)
    monkeypatch.setattr(locality, "leaf_reservations", False)
    view = congested(view_on(running=_leaf_2_later(150.0)))
    result = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0)], placement="network-aware", backfill=True)
    assert result.reservation == Reserve("g", 100.0)


@pytest.mark.parametrize(("queued", "reserved_s"), [(0, 250.0), (1, 250.0), (3, 100.0)])
def test_the_queue_behind_a_stuck_gang_shrinks_how_much_later_its_leaf_may_be(
    queued: int, reserved_s: float,
) -> None:
    """Its leaf is free 150 s after the spread start. With `queued` whole-node jobs (8 GPUs each, of
    the pool's 64) behind it the cap is 300 s / (1 + 4 x queued x 8 / 64): 300 s and 200 s allow the
    delay, 120 s (3 jobs) does not, and the gang is reserved spread at t=100."""
    behind = [dataclasses.replace(gang(1, 8, wid=f"b{i}"), submit_time_s=1.0 + i) for i in range(queued)]
    view = congested(view_on(running=_leaf_2_later(250.0)))
    result = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0), *behind], placement="network-aware",
                 backfill=True)
    assert result.reservation == Reserve("g", reserved_s)


def test_work_that_ends_before_a_leaf_reservation_backfills_the_gangs_leaf() -> None:
    """Reserved in leaf 2 at t=150, the gang's leaf (n005 free now) takes only work that ends by then."""
    view = congested(view_on(running=_leaf_2_later(150.0)))
    long = dataclasses.replace(gang(1, 8, wid="long", estimate_s=5_000.0), submit_time_s=1.0)
    short = dataclasses.replace(gang(1, 8, wid="short", estimate_s=120.0), submit_time_s=2.0)
    result = run(view, [gang(2, 8, wid="g", estimate_s=10_000.0), long, short], placement="network-aware",
                 backfill=True)
    assert result.reservation == Reserve("g", 150.0)
    assert nodes_of(result, "short") == ["n005"]
    assert {r.workload_id: r.reason for r in result.rejected} == {
        "g": Reason.GANG_INCOMPLETE, "long": Reason.BACKFILL_BLOCKED}


def _busy_fabric_cycles(cap: WaitCap, seed: int) -> tuple[list[CycleResult], int, int]:
    """Twelve cycles of a busy pool, network-aware with backfill (`_busy_pool_cycles`): the cycles'
    results, and how many reservations backfill kept inside one leaf and how many stuck gangs it
    reserved inside one."""
    narrowed, leafed = 0, 0
    narrow, in_domain = backfill._narrow, cycle.reserve_in_domain

    def counting_narrow(*args: object, **kwargs: object) -> object:
        nonlocal narrowed
        found = narrow(*args, **kwargs)  # type: ignore[arg-type]
        narrowed += found is not None
        return found

    def counting_in_domain(*args: object, **kwargs: object) -> object:
        nonlocal leafed
        found = in_domain(*args, **kwargs)  # type: ignore[arg-type]
        leafed += found is not args[1]
        return found

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backfill, "_narrow", counting_narrow)
        mp.setattr(cycle, "reserve_in_domain", counting_in_domain)
        results = _busy_pool_cycles(
            cap, seed=seed, congested_every=2, shapes=[(1, 4), (1, 8), (2, 8), (3, 8), (4, 8)],
            estimates=[300.0, 3_000.0, 30_000.0], start=40, per_turn=6, step_s=60.0,
            policies=("network-aware",))
    return results, narrowed, leafed


@pytest.mark.parametrize("shrink", [0.0, locality.queue_shrink])
@pytest.mark.parametrize("cap", [WaitCap.FIXED, WaitCap.LOSS])
def test_leaf_keeping_reservations_kept_across_cycles_decide_as_reserving_afresh(
    monkeypatch: pytest.MonkeyPatch, cap: WaitCap, shrink: float,
) -> None:
    monkeypatch.setattr(locality, "queue_shrink", shrink)
    kept, narrowed, leafed = _busy_fabric_cycles(cap, seed=5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backfill, "keep_reservations", False)
        fresh, _, _ = _busy_fabric_cycles(cap, seed=5)
    assert kept == fresh
    assert narrowed and leafed  # the scenario does keep reservations in a leaf and reserve stuck gangs in one


def test_the_quick_device_check_of_a_gang_that_must_sit_in_one_leaf_counts_room_per_leaf() -> None:
    """n001 (leaf 0) and n003 (leaf 1) are free: room for two 8-GPU pods in all, in no one leaf, so
    a reservation for the gang required in a leaf does not place it at such an end time."""
    view = view_on(running=FREE_N001_N003)
    assert view.topology is not None
    head = gang(2, 8, wid="g")
    assert backfill._device_check(head)(view.state)
    assert not backfill._device_check(head, view.topology.domain_of(Tier.LEAF))(view.state)
    view.remove("rn002")  # leaf 1 (n002, n003) is whole
    assert backfill._device_check(head, view.topology.domain_of(Tier.LEAF))(view.state)
