"""A head's reservation is carried across runs that started and ended where they leave the pool the
same from the head's first passing group on (`backfill.KeptReservation.carries`): it must be the
reservation a search made afresh finds, and each change that may move it makes it afresh."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
import test_admission_properties as props
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kept_search import _new_run, _start, _step

from factories import cluster, pod, workload
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.model import Workload, WorkloadInfo
from gpupool.core.scheduling import backfill
from gpupool.core.scheduling.backfill import KeptReservation, Reservation
from gpupool.core.scheduling.cycle import Policies, cycle_on
from gpupool.core.scheduling.policies.base import NoFit, PlacementPolicy, make_policy
from gpupool.core.scheduling.topology import FabricView
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.state import ClusterState, clone_state

SLOT = "kept_leaf_reservation"  # a slot the cycles that start the runs never write (no fabric)
_search = backfill._reserve


def _pool(state: ClusterState) -> tuple[object, ...]:
    """What a placement reads of a shadow (node versions aside: `carries`' docstring)."""
    arrays = (state.cpu_free, state.mem_free, state.dev_milli_free, state.dev_mem_free)
    kinds = [sorted(k.items()) for k in state.node_pod_kinds]
    return (*(a.tolist() for a in arrays), state.heavy_slices, kinds)


def _key(r: Reservation | None) -> tuple[object, ...] | None:
    if r is None:
        return None
    fits_on = None if r.fits_on is None else r.fits_on.tolist()
    return (r.start_s, fits_on, r.narrow, _pool(r.shadow))


def _afresh(head: Workload, view: ClusterView, now: float, policy: PlacementPolicy) -> Reservation | None:
    return _search(head, view, now, policy, random.Random(0))[0]


class _Count:
    """Counts `carries` answers and searches made (`_reserve` calls)."""

    def __init__(self, mp: pytest.MonkeyPatch) -> None:
        self.carried = self.searched = 0
        carries, search = KeptReservation.carries, backfill._reserve

        def counted_carries(kept: KeptReservation, *args: object) -> bool:
            found = carries(kept, *args)  # type: ignore[arg-type]
            self.carried += found
            return found

        def counted_search(*args: object, **kwargs: object) -> tuple[Reservation | None, float]:
            self.searched += 1
            return search(*args, **kwargs)  # type: ignore[arg-type]

        mp.setattr(KeptReservation, "carries", counted_carries)
        mp.setattr(backfill, "_reserve", counted_search)


def _busy(seed: int, heads: int) -> tuple[ClusterView, random.Random]:
    rng = random.Random(seed)
    view = ClusterView.empty(cluster(5, devices=4))
    for k in range(12 + heads):
        _start(view, _new_run(rng, 1000 + k, 0.0), 0.0, k)
    return view, rng


HEADS = [
    workload(pod(4), pod(4), wid="whole-nodes"),
    workload(pod(2), pod(2), pod(1), wid="gang"),
    workload(pod(3), wid="one"),
    workload(pod(0.5), pod(0.5), wid="shares"),
]


@pytest.mark.parametrize("head", HEADS, ids=[h.id for h in HEADS])
@pytest.mark.parametrize("placement", ["first-fit", "best-fit", "fgd-strand", "gpu-clustering"])
@pytest.mark.parametrize("seed", range(6))
def test_a_carried_reservation_is_the_one_a_search_made_afresh_finds(
    seed: int, placement: str, head: Workload, monkeypatch: pytest.MonkeyPatch
) -> None:
    """80 random changes (runs started, some ending before the reserved start, ended, preempted and
    started again, with another estimate, the clock passing planned and corrected ends, the policy
    prepared again): after each, the kept reservation is the one found afresh."""
    view, rng = _busy(seed, HEADS.index(head))
    policy = make_policy(placement)
    count = _Count(monkeypatch)
    assert _changes_compared(view, rng, head, policy) > 20
    if head.id != "shares":  # (two shares seldom wait past the first group)
        assert count.carried >= 3  # carried, not only found again


def _changes_compared(view: ClusterView, rng: random.Random, head: Workload, policy: PlacementPolicy) -> int:
    """80 random changes; after each the kept reservation must be the one found afresh. Returns how
    many of them found one."""
    now, compared = 0.0, 0
    for k in range(80):
        now = _step(view, rng, k, now, policy)
        if rng.random() < 0.5:  # a short run: ends before most reserved starts
            short = replace(_new_run(rng, 5000 + k, now), runtime_estimate_s=rng.choice([5.0, 15.0, 30.0]))
            _start(view, short, now, k)
        view.materialize()
        kept = backfill.kept_reserve(head, view, now, policy, random.Random(k), slot=SLOT)
        afresh = _afresh(head, view, now, policy)
        assert _key(kept) == _key(afresh), k
        compared += afresh is not None
    return compared


def _busy_on_fabric(seed: int, heads: int) -> tuple[ClusterView, random.Random]:
    """`_busy` on 8 nodes in a two-level fat tree (4 leaves of 2)."""
    rng = random.Random(seed)
    nodes = cluster(8, devices=4)
    view = ClusterView.empty(nodes)
    view.set_topology(FabricView.from_fabric(fat_tree(4, levels=2), nodes))
    for k in range(20 + heads):
        _start(view, _new_run(rng, 1000 + k, 0.0), 0.0, k)
    return view, rng


@pytest.mark.parametrize("head", HEADS, ids=[h.id for h in HEADS])
@pytest.mark.parametrize("placement", ["network-aware", "first-fit"])
@pytest.mark.parametrize("seed", range(4))
def test_with_a_fabric_a_carried_reservation_is_the_one_a_search_made_afresh_finds(
    seed: int, placement: str, head: Workload, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The random changes above on a pool with a fabric bound to the policy (gangs of several nodes
    start and end among them, so the flows on its links change): the kept reservation is the one
    found afresh after each, and it is carried."""
    view, rng = _busy_on_fabric(seed, HEADS.index(head))
    policy = make_policy(placement)
    policy.bind_topology(view.topology_context())
    assert policy.topology is not None
    count = _Count(monkeypatch)
    assert _changes_compared(view, rng, head, policy) > 20
    if len(head.pods) == 1:
        assert count.carried >= 2


def _gang_on_fabric() -> tuple[ClusterView, PlacementPolicy, Workload]:
    """8 nodes of 4 devices in a two-level fat tree, every one busy with work of one pod (which puts
    nothing on the fabric's links): n0 until 1000, n1 until 2000, n2 with c (2 devices, until 500)
    and d (2, until 700), the rest until 3000. A gang of two 4-device pods (network-aware) is
    reserved at 1000 on n0 and n2, past the floor at d's end (700)."""
    nodes = cluster(8, devices=4)
    view = ClusterView.empty(nodes)
    view.set_topology(FabricView.from_fabric(fat_tree(4, levels=2), nodes))
    runs = [("a", 4, 1000.0), ("b", 4, 2000.0), ("c", 2, 500.0), ("d", 2, 700.0),
            *((f"x{i}", 4, 3000.0) for i in range(5))]
    for wid, gpus, est in runs:
        _run(view, wid, gpus, est, 0.0)
    head = replace(workload(pod(4, name="p0"), pod(4, name="p1"), wid="gang"), runtime_estimate_s=600.0)
    policy = make_policy("network-aware")
    policy.bind_topology(view.topology_context())
    found = backfill.kept_reserve(head, view, 10.0, policy, random.Random(0), slot=SLOT)
    assert found is not None and found.start_s == 1000.0
    assert found.fits_on is not None and np.flatnonzero(found.fits_on).tolist() == [0, 2]
    kept = view.kept_leaf_reservation
    assert kept is not None and kept.floor_s == 700.0
    return view, policy, head


def test_with_a_fabric_a_gang_s_reservation_is_carried_while_the_fabric_reads_the_same(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """c ends early and e, ending before the floor, starts in its place: the fabric is as it was
    (no gang started or ended, no link changed), so the gang's reservation is carried."""
    view, policy, head = _gang_on_fabric()
    version = view.topology.version if view.topology is not None else -1
    view.remove("c")
    _run(view, "e", 2, 300.0, 100.0)
    assert view.topology is not None and view.topology.version == version
    found, count = _again(view, policy, head, 100.0, monkeypatch)
    assert found is not None and found.start_s == 1000.0
    assert (count.carried, count.searched) == (1, 0)


@pytest.mark.parametrize("change", ["link", "estimate"])
def test_with_a_fabric_a_gang_s_reservation_is_searched_again_when_what_it_read_changed(
    change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same change below the floor, and a link's load or the head's estimated run time (a gang's
    placement weighs both) changed: searched afresh. With nothing started or ended, the same holds
    for the reservation reused whole."""
    view, policy, head = _gang_on_fabric()
    fabric = view.topology
    assert fabric is not None
    if change == "link":
        assert fabric.set_link(next(iter(fabric.link_index)), utilization=0.9)
    else:
        view.info[head.id] = WorkloadInfo(progress_s=300.0)  # half its work kept from an earlier run
    found, count = _again(view, policy, head, 10.0, monkeypatch)
    assert (count.carried, count.searched) == (0, 1)
    monkeypatch.undo()
    view.remove("c")
    _run(view, "e", 2, 300.0, 100.0)
    if change == "link":
        assert fabric.set_link(next(iter(fabric.link_index)), utilization=0.1)
    else:
        view.info[head.id] = WorkloadInfo(progress_s=100.0)
    found, count = _again(view, policy, head, 100.0, monkeypatch)
    assert found is not None
    assert (count.carried, count.searched) == (0, 1)


def test_a_policy_that_changed_its_mode_drops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """network-aware places whole devices as best-fit until it places a share of one, then as
    fgd-strand (`auto`): a reservation kept from before is searched afresh, as its search placements are."""
    view, policy, head = _three_nodes()
    aware = make_policy("network-aware")
    found = backfill.kept_reserve(head, view, 10.0, aware, random.Random(0), slot=SLOT)
    assert found is not None and aware.mode() is True
    found, count = _again(view, aware, head, 10.0, monkeypatch)
    assert (count.carried, count.searched) == (0, 0)  # the same: reused whole
    monkeypatch.undo()
    trial = clone_state(view.state, empty=True)  # (any state: the choice is not used)
    assert not isinstance(aware.place(pod(0.5), trial, random.Random(0)), NoFit)
    assert aware.mode() is False
    found, count = _again(view, aware, head, 10.0, monkeypatch)
    assert (count.carried, count.searched) == (0, 1)
    assert policy is not aware


def test_a_policy_that_changed_its_mode_places_the_head_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search's placements kept for the next search of the same head (`KeptSearch.placements`)
    are not reused once the policy places another way."""
    view, _, head = _three_nodes()
    aware = make_policy("network-aware")
    search = backfill.KeptSearch.fresh(view.state)
    placed = backfill.place_gang
    calls = [0]

    def counted(*args: object) -> object:
        calls[0] += 1
        return placed(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(backfill, "place_gang", counted)
    first = _search(head, view, 10.0, aware, random.Random(0), kept=search)[0]
    assert first is not None and calls[0] >= 1
    calls[0] = 0
    assert _key(_search(head, view, 10.0, aware, random.Random(0), kept=search)[0]) == _key(first)
    assert calls[0] == 0  # reused
    assert not isinstance(aware.place(pod(0.5), clone_state(view.state, empty=True), random.Random(0)), NoFit)
    _search(head, view, 10.0, aware, random.Random(0), kept=search)
    assert calls[0] >= 1


def test_carried_reservations_are_used_often_enough_to_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the seeds and heads above with first-fit, a fair share of the searches is saved."""
    count = _Count(monkeypatch)
    calls = 0
    for seed in range(6):
        for head in HEADS:
            view, rng = _busy(seed, HEADS.index(head))
            policy = make_policy("first-fit")
            now = 0.0
            for k in range(80):
                now = _step(view, rng, k, now, policy)
                if rng.random() < 0.5:
                    _start(view, replace(_new_run(rng, 5000 + k, now), runtime_estimate_s=15.0), now, k)
                view.materialize()
                backfill.kept_reserve(head, view, now, policy, random.Random(k), slot=SLOT)
                calls += 1
    assert count.carried > calls // 20, (count.carried, count.searched, calls)


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(props.ops, props.narrow_ops),
    st.sampled_from(["fifo", "priority-fifo", "drf", "las"]),
    st.sampled_from(["first-fit", "fgd-strand", "best-fit", "gpu-clustering", "random"]),
    st.booleans(),
)
def test_whole_cycles_decide_as_without_carried_reservations(
    sequence: list, ordering: str, placement: str, preemption: bool  # type: ignore[type-arg]
) -> None:
    policies = replace(props.BASE, ordering=ordering, placement=placement, preemption=preemption,
                       backfill=True)
    carried = props._drive(sequence, policies, seed=11)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backfill, "carry_reservations", False)
        afresh = props._drive(sequence, policies, seed=11)
    assert carried == afresh


def _busy_cycles(seed: int, policies: Policies) -> list[object]:
    """120 cycles on 4 nodes of 4 devices (no preemption): a few arrivals each (a share to two whole
    nodes, most with an estimate), runs ending at their estimate or earlier, the clock moving by 1
    to 40 s."""
    rng = random.Random(seed)
    view = ClusterView.empty(cluster(4, devices=4))
    pending: dict[str, Workload] = {}
    decisions: list[object] = []
    now = 0.0
    for step in range(120):
        now += rng.choice([1.0, 5.0, 10.0, 40.0])
        for rid, run in sorted(view.running.items()):
            if run.planned_end_s <= now or rng.random() < 0.03:
                view.remove(rid)
        for k in range(rng.choice([0, 1, 1, 2])):
            gpus = rng.choice([0.5, 1, 1, 2, 4])
            pods = tuple(pod(gpus, name=f"p{i}") for i in range(rng.choice([1, 1, 2])))
            estimate = rng.choice([None, 20.0, 60.0, 120.0, 300.0, 600.0])
            w = replace(workload(*pods, wid=f"w{step}-{k}", submit_s=now), runtime_estimate_s=estimate)
            pending[w.id] = w
        result = cycle_on(view, list(pending.values()), policies, now, rng)
        for admission in result.admitted:
            pending.pop(admission.workload_id)
        for rejection in result.rejected:
            if rejection.final:
                pending.pop(rejection.workload_id)
        decisions.append(result.decisions)
    return decisions


@pytest.mark.parametrize("placement", ["first-fit", "best-fit", "gpu-clustering"])
@pytest.mark.parametrize("seed", range(4))
def test_busy_cycles_decide_as_without_carried_reservations(
    seed: int, placement: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy pool's cycles (backfill, fifo order): the same decisions, with reservations carried."""
    policies = Policies(placement=placement, ordering="fifo", backfill=True)
    with monkeypatch.context() as mp:
        count = _Count(mp)
        carried = _busy_cycles(seed, policies)
        used = count.carried
    with monkeypatch.context() as mp:
        mp.setattr(backfill, "carry_reservations", False)
        afresh = _busy_cycles(seed, policies)
    assert carried == afresh
    assert used > 0


# ------------------------------------------------------------ each change that must drop it

def _run(view: ClusterView, wid: str, gpus: float, estimate: float | None, now: float) -> None:
    w = replace(workload(pod(gpus), wid=wid, submit_s=now), runtime_estimate_s=estimate)
    _start(view, w, now, 0)
    assert wid in view.running


def _three_nodes() -> tuple[ClusterView, PlacementPolicy, Workload]:
    """n0: a (4 devices, ends at 1000); n1: b (4, at 2000); n2: c (2, at 500) and d (2, at 700).
    A head of one 4-device pod fits first when d ends: reserved at 700 on n2, past c's end (the
    floor, 500)."""
    view = ClusterView.empty(cluster(3, devices=4))
    for wid, gpus, est in [("a", 4, 1000.0), ("b", 4, 2000.0), ("c", 2, 500.0), ("d", 2, 700.0)]:
        _run(view, wid, gpus, est, 0.0)
    head = workload(pod(4), wid="head")
    policy = make_policy("first-fit")
    found = backfill.kept_reserve(head, view, 10.0, policy, random.Random(0), slot=SLOT)
    assert found is not None and found.start_s == 700.0
    assert found.fits_on is not None and found.fits_on.tolist() == [False, False, True]
    kept = view.kept_leaf_reservation
    assert kept is not None and kept.floor_s == 500.0
    return view, policy, head


def _again(view: ClusterView, policy: PlacementPolicy, head: Workload, now: float,
           mp: pytest.MonkeyPatch) -> tuple[Reservation | None, _Count]:
    count = _Count(mp)
    found = backfill.kept_reserve(head, view, now, policy, random.Random(0), slot=SLOT)
    assert _key(found) == _key(_afresh(head, view, now, policy))
    return found, count


def test_a_run_replaced_below_the_floor_keeps_the_reservation(monkeypatch: pytest.MonkeyPatch) -> None:
    """c ends early and e, ending before the floor, starts in its place: carried, no search."""
    view, policy, head = _three_nodes()
    view.remove("c")
    _run(view, "e", 2, 300.0, 100.0)  # ends at 400
    found, count = _again(view, policy, head, 100.0, monkeypatch)
    assert found is not None and found.start_s == 700.0
    assert (count.carried, count.searched) == (1, 0)


def test_a_run_without_an_estimate_in_a_run_s_place_drops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """c ends early and a run without an estimate (never ending, as the search reckons) takes its
    place: it holds n2 at 700 too, so the head waits for a (1000). No run of the ends accounts for
    it: only the live state shows it."""
    view, policy, head = _three_nodes()
    view.remove("c")
    _run(view, "forever", 2, None, 100.0)
    found, count = _again(view, policy, head, 100.0, monkeypatch)
    assert found is not None and found.start_s == 1000.0
    assert (count.carried, count.searched) == (0, 1)


def test_a_run_of_the_same_kind_of_another_size_drops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A share without an estimate on n2 gives way to a larger share: the pods per node are the same
    (one share), the free amounts are not, and the head (a share of 0.6) fits on n2 no more."""
    view = ClusterView.empty(cluster(2, devices=1))
    _run(view, "long", 1, 1000.0, 0.0)  # n0, ends at 1000
    _run(view, "small", 0.3, None, 0.0)  # n1, forever
    _run(view, "mid", 0.4, 500.0, 0.0)  # n1, ends at 500
    head = workload(pod(0.6), wid="head")
    policy = make_policy("first-fit")
    found = backfill.kept_reserve(head, view, 10.0, policy, random.Random(0), slot=SLOT)
    assert found is not None and found.start_s == 500.0  # on n1, beside the small share
    view.remove("small")
    _run(view, "larger", 0.5, None, 20.0)
    found, count = _again(view, policy, head, 20.0, monkeypatch)
    assert found is not None and found.start_s == 1000.0
    assert (count.carried, count.searched) == (0, 1)


def test_a_run_ending_past_the_floor_in_another_s_place_drops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """b (ending at 2000) ends early and f, ending at 600 (past the floor, before the reserved start),
    takes n1: the head fits on n1 at 600. The live state changed by b and f alike, so only the ends
    after the floor show it."""
    view, policy, head = _three_nodes()
    view.remove("b")
    _run(view, "f", 4, 500.0, 100.0)  # n1, ends at 600
    found, count = _again(view, policy, head, 100.0, monkeypatch)
    assert found is not None and found.start_s == 600.0
    assert (count.carried, count.searched) == (0, 1)


def test_the_clock_reaching_the_correction_waited_on_drops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing starts or ends, the clock passes a's planned end, then its corrected end: each time a
    is expected later (its estimate doubled), and only the ends show it."""
    view = ClusterView.empty(cluster(2, devices=4))
    _run(view, "a", 4, 1000.0, 0.0)  # n0
    _run(view, "b", 4, 3000.0, 0.0)  # n1
    head = workload(pod(4), wid="head")
    policy = make_policy("first-fit")
    found = backfill.kept_reserve(head, view, 10.0, policy, random.Random(0), slot=SLOT)
    assert found is not None and found.start_s == 1000.0
    found, count = _again(view, policy, head, 1200.0, monkeypatch)  # a overdue: expected at 2000
    assert found is not None and found.start_s == 2000.0
    assert (count.carried, count.searched) == (0, 1)
    monkeypatch.undo()
    found, count = _again(view, policy, head, 2000.0, monkeypatch)  # a expected at 4000: b first
    assert found is not None and found.start_s == 3000.0
    assert (count.carried, count.searched) == (0, 1)


def test_a_node_that_broke_drops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two devices of n2 break under c (ending before the floor), evicted: as if c ended, but n2 has
    no room for the head now; it waits for a on n0."""
    view, policy, head = _three_nodes()
    view.mark_unhealthy("n002", 0)
    view.mark_unhealthy("n002", 1)
    assert "c" not in view.running
    found, count = _again(view, policy, head, 100.0, monkeypatch)
    assert found is not None and found.start_s == 1000.0
    assert (count.carried, count.searched) == (0, 1)


def test_the_same_room_held_by_pods_of_another_kind_drops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run without an estimate of one 2-device pod on n0 gives way to one of two 1-device pods on
    the same devices with the same cpu and memory: the free amounts are the same, the pods per node
    are not, and gpu-clustering (which reads them) now reserves the head, a 1-device pod, on n0."""
    view = ClusterView.empty(cluster(2, devices=4))
    _run(view, "x", 2, None, 0.0)  # n0, devices 0-1, forever
    _run(view, "r0", 2, 500.0, 0.0)  # n0, devices 2-3
    _run(view, "r1", 4, 500.0, 0.0)  # n1
    head = workload(pod(1), wid="head")
    policy = make_policy("gpu-clustering")
    found = backfill.kept_reserve(head, view, 10.0, policy, random.Random(0), slot=SLOT)
    assert found is not None and found.start_s == 500.0
    assert found.fits_on is not None and found.fits_on.tolist() == [False, True]  # idle n1 beats n0
    view.remove("x")
    halves = replace(workload(pod(1, cpu_milli=500, memory_mib=512), pod(1, cpu_milli=500, memory_mib=512),
                              wid="x2", submit_s=20.0), runtime_estimate_s=None)
    _start(view, halves, 20.0, 0)
    assert "x2" in view.running
    found, count = _again(view, policy, head, 20.0, monkeypatch)
    assert found is not None and found.fits_on is not None and found.fits_on.tolist() == [True, False]
    assert (count.carried, count.searched) == (0, 1)


# ------------------------------------------------------------ runs that joined past the floor

def _four_nodes() -> tuple[ClusterView, PlacementPolicy, Workload]:
    """`_three_nodes` and n3, half held for good by e: the head (4 devices) reserved at 700 on n2
    (floor 500); n3 never holds it, and new runs land there."""
    view = ClusterView.empty(cluster(4, devices=4))
    runs = [("a", 4, 1000.0), ("b", 4, 2000.0), ("c", 2, 500.0), ("d", 2, 700.0), ("e", 2, None)]
    for wid, gpus, est in runs:
        _run(view, wid, gpus, est, 0.0)
    head = workload(pod(4), wid="head")
    policy = make_policy("first-fit")
    found = backfill.kept_reserve(head, view, 10.0, policy, random.Random(0), slot=SLOT)
    assert found is not None and found.start_s == 700.0
    assert view.kept_leaf_reservation is not None and view.kept_leaf_reservation.floor_s == 500.0
    return view, policy, head


@pytest.mark.parametrize("estimate", [900.0, 500.0], ids=["past-the-start", "before-the-start"])
def test_a_run_that_joined_past_the_floor_keeps_the_reservation(
    estimate: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """g starts on n3 and ends after the floor: past the reserved start (it still holds n3 there, so
    the head is placed again on the shadow without it) or before it (a new end time at which the
    head still fits nowhere). Carried, no search, and the reservation found afresh."""
    view, policy, head = _four_nodes()
    _run(view, "g", 1, estimate, 100.0)
    assert view.running["g"].allocs[0][1].node == 3
    found, count = _again(view, policy, head, 100.0, monkeypatch)
    assert found is not None and found.start_s == 700.0
    assert (count.carried, count.searched) == (1, 0)
    free_at_start = int(found.shadow.dev_milli_free[3].sum())
    assert free_at_start == (1000 if estimate > 600.0 else 2000)  # g holds one device there, or has ended


def test_a_run_that_joined_past_the_floor_drops_a_gang_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same join for a gang of two 4-device pods (reserved at 1000 on n0 and n2): a gang placed
    pod by pod may fit less room where it did not fit more, so it is searched afresh."""
    view, policy, _ = _four_nodes()
    gang = workload(pod(4), pod(4), wid="gang")
    found = backfill.kept_reserve(gang, view, 10.0, policy, random.Random(0), slot=SLOT)
    assert found is not None and found.start_s == 1000.0
    _run(view, "g", 1, 1500.0, 100.0)
    found, count = _again(view, policy, gang, 100.0, monkeypatch)
    assert found is not None and found.start_s == 1000.0
    assert (count.carried, count.searched) == (0, 1)


def test_a_run_that_joined_before_the_first_group_drops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no floor (the first end time passed the check), the search never saw the live pool:
    here the head fits n1 now, and is reserved at a's end (1000). g takes n1 until 900, a new first
    end time at which n1 is free again: the head is reserved there, not carried at 1000."""
    view = ClusterView.empty(cluster(2, devices=4))
    _run(view, "a", 4, 1000.0, 0.0)
    head = workload(pod(4), wid="head")
    policy = make_policy("first-fit")
    found = backfill.kept_reserve(head, view, 10.0, policy, random.Random(0), slot=SLOT)
    assert found is not None and found.start_s == 1000.0
    assert view.kept_leaf_reservation is not None and view.kept_leaf_reservation.floor_s == -float("inf")
    _run(view, "g", 4, 800.0, 100.0)
    found, count = _again(view, policy, head, 100.0, monkeypatch)
    assert found is not None and found.start_s == 900.0
    assert (count.carried, count.searched) == (0, 1)


def test_a_join_that_would_need_more_trials_than_allowed_drops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """g's end adds a time between the floor and the start: with one trial allowed, the search from
    the floor might place the head twice, so the reservation is searched afresh."""
    view, policy, head = _four_nodes()
    monkeypatch.setattr(backfill, "MAX_RESERVATION_TRIALS", 1)
    _run(view, "g", 1, 500.0, 100.0)  # ends at 600
    found, count = _again(view, policy, head, 100.0, monkeypatch)
    assert found is not None and found.start_s == 700.0
    assert (count.carried, count.searched) == (0, 1)
