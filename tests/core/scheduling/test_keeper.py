"""The kept view (`ViewKeeper`) decides exactly as a view built afresh from each snapshot."""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import product

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import cluster
from gpupool.core.model import (
    Allocation,
    AllocationChanges,
    ClusterSnapshot,
    Node,
    PodRequest,
    Workload,
    WorkloadInfo,
)
from gpupool.core.quota import DEVICE_MILLI, ClusterQueue, QuotaConfig, ResourceQuota
from gpupool.core.scheduling import keeper as keeper_module
from gpupool.core.scheduling.cycle import CycleResult, Policies, run_cycle
from gpupool.core.scheduling.keeper import ViewKeeper
from gpupool.core.scheduling.view import ClusterView

QUOTA = QuotaConfig(
    cluster_queues=(
        ClusterQueue("a", {DEVICE_MILLI: ResourceQuota(6000, borrowing_limit=3000)}, "pool"),
        ClusterQueue("b", {DEVICE_MILLI: ResourceQuota(4000, lending_limit=2000)}, "pool"),
        ClusterQueue("c", {DEVICE_MILLI: ResourceQuota(3000)}),
    )
)
CLASSES = ("critical", "high", "normal", "best-effort")

arrival = st.tuples(
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(CLASSES),
    st.sampled_from([(1, 0), (1, 250), (1, 500), (1, 1000), (2, 1000), (3, 1000)]),  # (pods, milli)
    st.integers(min_value=1, max_value=4),  # devices per pod when whole
    st.floats(min_value=1, max_value=60),  # runtime estimate
)
step = st.tuples(
    st.lists(arrival, max_size=4),  # arrivals
    st.integers(min_value=0, max_value=3),  # how many running workloads finish
    st.booleans(),  # the caller fails to carry out one admission
    st.booleans(),  # the caller records progress for one running workload
)
configs = st.sampled_from(
    [
        Policies(placement="first-fit"),
        Policies(placement="best-fit", ordering="fifo"),
        Policies(placement="first-fit", ordering="drf", quota=QUOTA, preemption=True, backfill=True),
        Policies(placement="best-fit", ordering="priority-fifo", preemption=True),
        Policies(placement="worst-fit", ordering="las", backfill=True),
        Policies(placement="first-fit", ordering="fifo", quota=QUOTA),
    ]
)


def _workload(i: int, spec: tuple, now: float) -> Workload:
    tenant, cls, (pods, milli), per_pod, runtime = spec
    count = 0 if milli == 0 else per_pod if milli == 1000 else 1
    return Workload(
        id=f"w{i}",
        pods=tuple(
            PodRequest(name=f"p{k}", cpu_milli=500, memory_mib=1024, num_devices=count, device_milli=milli)
            for k in range(pods)
        ),
        tenant=tenant,
        priority_class=cls,
        submit_time_s=now,
        runtime_estimate_s=runtime,
        checkpoint_interval_s=10.0,
    )


def _same(a: CycleResult, b: CycleResult) -> None:
    assert a.admitted == b.admitted
    assert a.preempted == b.preempted
    assert a.rejected == b.rejected
    assert a.requeued == b.requeued
    assert a.reservation == b.reservation


def _state_equal(kept: ClusterView, fresh: ClusterView) -> None:
    for name in ("cpu_free", "mem_free", "dev_milli_free", "dev_mem_free", "dev_milli_cap", "schedulable"):
        assert np.array_equal(getattr(kept.state, name), getattr(fresh.state, name)), name
    assert kept.state.node_pod_kinds == fresh.state.node_pod_kinds


@settings(max_examples=60, deadline=None)
@given(st.lists(step, min_size=1, max_size=14), configs, st.integers(0, 2**16))
def test_kept_view_decides_as_a_fresh_one(steps: list, policies: Policies, seed: int) -> None:
    """A caller's loop: each cycle's snapshot is what it carried out of the last cycle's decisions
    (minus finished work and an admission it did not carry out), and both ways decide alike."""
    nodes = tuple(cluster(3, devices=4))
    keeper = ViewKeeper()
    rng = random.Random(seed)
    running: dict[str, Allocation] = {}
    pending: dict[str, Workload] = {}
    info: dict[str, WorkloadInfo] = {}
    count = 0
    for k, (arrivals, finish, drop_one, progress) in enumerate(steps):
        now = 10.0 * k
        for spec in arrivals:
            w = _workload(count, spec, now)
            count += 1
            pending[w.id] = w
        for wid in rng.sample(sorted(running), min(finish, len(running))):
            del running[wid]
            info.pop(wid, None)
        if progress and running:
            wid = rng.choice(sorted(running))
            info[wid] = WorkloadInfo(progress_s=now / 2, runtime_estimate_s=40.0)
        snapshot = ClusterSnapshot(nodes, tuple(running.values()), dict(info))
        work = list(pending.values())
        fresh = run_cycle(snapshot, work, policies, now, random.Random(k))
        kept = keeper.cycle(snapshot, work, policies, now, random.Random(k))
        _same(kept, fresh)
        expected = ClusterView.from_snapshot(snapshot, policies.quota, policies.priority_classes)
        for stop in kept.preempted:
            expected.remove(stop.workload_id)
            pending[stop.workload_id] = running.pop(stop.workload_id).workload
        for admission in kept.admitted:
            w = pending[admission.workload_id]
            expected.add_allocation(Allocation(w, admission.placements, now))
        assert keeper.view is not None
        _state_equal(keeper.view, expected)
        admitted = list(kept.admitted)
        if drop_one and admitted:
            admitted.pop(rng.randrange(len(admitted)))  # e.g. cancelled while the cycle ran
        for admission in admitted:
            w = pending.pop(admission.workload_id)
            running[w.id] = Allocation(w, admission.placements, now)
        for rejection in kept.rejected:
            if rejection.final:
                pending.pop(rejection.workload_id, None)
    assert keeper.rebuilds == 1


def _whole(wid: str, devices: int, *, priority_class: str = "normal") -> Workload:
    return Workload(
        id=wid,
        pods=(PodRequest("p0", cpu_milli=100, num_devices=devices, device_milli=1000),),
        priority_class=priority_class,
        submit_time_s=0.0,
    )


def test_health_changes_apply_to_the_kept_view_and_evict() -> None:
    nodes = tuple(cluster(2, devices=4))
    keeper = ViewKeeper()
    policies = Policies(placement="first-fit")
    first = keeper.cycle(ClusterSnapshot(nodes), [_whole("a", 4)], policies, 0.0, random.Random(0))
    placed = first.admitted[0]
    w = _whole("a", 4)
    snapshot = ClusterSnapshot(nodes, (Allocation(w, placed.placements, 0.0),))
    keeper.cycle(snapshot, [], policies, 1.0, random.Random(0))
    assert keeper.rebuilds == 1
    # the node running it turns unhealthy: the snapshot's nodes change, the gang is evicted
    broken = tuple(
        replace(n, healthy=False) if n.name == placed.placements[0].node else n for n in nodes
    )
    result = keeper.cycle(ClusterSnapshot(broken, snapshot.allocations), [], policies, 2.0, random.Random(0))
    assert keeper.rebuilds == 1, "a health change is applied to the kept view, as the replay does"
    assert [p.workload_id for p in result.preempted] == ["a"]
    # the caller requeues it: it starts on the healthy node
    again = keeper.cycle(ClusterSnapshot(broken), [w], policies, 3.0, random.Random(0))
    assert [a.workload_id for a in again.admitted] == ["a"]
    assert again.admitted[0].placements[0].node != placed.placements[0].node
    moved = Allocation(w, again.admitted[0].placements, 3.0)
    # repaired: a second gang of 4 fits the repaired node, exactly as in a view built afresh
    second = _whole("b", 4)
    repaired = keeper.cycle(ClusterSnapshot(nodes, (moved,)), [second], policies, 4.0, random.Random(0))
    fresh = run_cycle(ClusterSnapshot(nodes, (moved,)), [second], policies, 4.0, random.Random(0))
    assert keeper.rebuilds == 1 and repaired.admitted == fresh.admitted and len(fresh.admitted) == 1
    # a node that leaves the pool builds the view afresh
    keeper.cycle(ClusterSnapshot(nodes[:1]), [], policies, 5.0, random.Random(0))
    assert keeper.rebuilds == 2


def test_changed_quota_builds_the_view_afresh() -> None:
    nodes = tuple(cluster(1, devices=4))
    keeper = ViewKeeper()
    loose = Policies(placement="first-fit", quota=QUOTA)
    keeper.cycle(ClusterSnapshot(nodes), [], loose, 0.0, random.Random(0))
    tight_quota = QuotaConfig(cluster_queues=(ClusterQueue("a", {DEVICE_MILLI: ResourceQuota(1000)}),))
    tight = replace(loose, quota=tight_quota)
    w = replace(_whole("x", 2), tenant="a")
    result = keeper.cycle(ClusterSnapshot(nodes), [w], tight, 1.0, random.Random(0))
    assert keeper.rebuilds == 2
    assert not result.admitted


def test_a_resubmitted_id_is_judged_by_its_new_contents() -> None:
    nodes = tuple(cluster(1, devices=4))
    keeper = ViewKeeper()
    policies = Policies(placement="first-fit")
    big = _whole("x", 8)  # can never fit a 4-device node
    first = keeper.cycle(ClusterSnapshot(nodes), [big], policies, 0.0, random.Random(0))
    assert first.rejected[0].final
    small = _whole("x", 2)
    second = keeper.cycle(ClusterSnapshot(nodes), [small], policies, 1.0, random.Random(0))
    assert [a.workload_id for a in second.admitted] == ["x"]
    assert len(second.admitted[0].placements[0].slices) == 2


def test_an_allocation_moved_elsewhere_is_taken_where_it_now_is() -> None:
    nodes: tuple[Node, ...] = tuple(cluster(2, devices=4))
    keeper = ViewKeeper()
    policies = Policies(placement="first-fit")
    result = keeper.cycle(ClusterSnapshot(nodes), [_whole("a", 4)], policies, 0.0, random.Random(0))
    placement = result.admitted[0].placements[0]
    other = next(n.name for n in nodes if n.name != placement.node)
    moved = Allocation(_whole("a", 4), (replace(placement, node=other),), 0.0)
    keeper.cycle(ClusterSnapshot(nodes, (moved,)), [], policies, 1.0, random.Random(0))
    fresh = ClusterView.from_snapshot(ClusterSnapshot(nodes, (moved,)))
    assert keeper.view is not None
    _state_equal(keeper.view, fresh)


def test_per_workload_caches_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-running caller sees ever new ids: what the view remembers of gone ones is trimmed."""
    monkeypatch.setattr(keeper_module, "PRUNE_SLACK", 16)
    nodes = tuple(cluster(1, devices=2))
    keeper = ViewKeeper()
    policies = Policies(placement="fgd-strand")
    for k in range(40):
        waiting = [_whole(f"w{k}-{i}", 1) for i in range(3)]  # admitted, then finish at once
        keeper.cycle(ClusterSnapshot(nodes), waiting, policies, float(k), random.Random(k))
    assert keeper.view is not None
    assert len(keeper.view.metas) <= 3 + 16
    assert len(keeper.view.policies.seen) <= 3 + 16


def test_an_audit_rebuilds_a_view_that_drifted() -> None:
    nodes = tuple(cluster(1, devices=4))
    keeper = ViewKeeper()
    policies = Policies(placement="first-fit")
    keeper.cycle(ClusterSnapshot(nodes), [], policies, 0.0, random.Random(0), audit=True)
    assert keeper.drifts == 0, "a view built afresh never drifts"
    view = keeper.view
    assert view is not None
    view.state.dev_milli_free[0, :] = 0  # a bug that leaked every device
    blocked = keeper.cycle(ClusterSnapshot(nodes), [_whole("a", 1)], policies, 1.0, random.Random(0))
    assert not blocked.admitted and keeper.drifts == 0
    healed = keeper.cycle(ClusterSnapshot(nodes), [_whole("a", 1)], policies, 2.0, random.Random(0),
                          audit=True)
    assert keeper.drifts == 1 and [a.workload_id for a in healed.admitted] == ["a"]


@pytest.mark.parametrize("seed", range(12))
def test_a_sync_finds_changed_allocations_wherever_they_are_listed(seed: int) -> None:
    """The kept view finds what changed in a snapshot by object identity: new allocations listed
    anywhere (not only last, e.g. in the store's order), held ones listed again as equal copies (a
    store read afresh) and an admission the caller did not carry out are all taken as a view built
    afresh takes them, cycle after cycle."""
    nodes = tuple(cluster(4, devices=4))
    policies = Policies(placement="first-fit", ordering="drf", quota=QUOTA, preemption=True, backfill=True)
    keeper = ViewKeeper()
    rng = random.Random(seed)
    running: dict[str, Allocation] = {}
    pending: dict[str, Workload] = {}
    specs = [(q, c, s, d, 30.0) for q in "abc" for c in CLASSES for s in [(1, 500), (1, 1000), (2, 1000)]
             for d in (1, 2)]
    count = 0
    for k in range(25):
        now = 10.0 * k
        for _ in range(rng.randrange(4)):
            w = _workload(count, rng.choice(specs), now)
            count += 1
            pending[w.id] = w
        for wid in rng.sample(sorted(running), min(rng.randrange(4), len(running))):
            del running[wid]
        listed = list(running.values())
        rng.shuffle(listed)  # new allocations anywhere in the list
        if listed and rng.random() < 0.5:  # some held ones read afresh: equal, other objects
            for i in rng.sample(range(len(listed)), rng.randint(1, len(listed))):
                listed[i] = running[listed[i].workload.id] = replace(listed[i])
        snapshot = ClusterSnapshot(nodes, tuple(listed))
        work = list(pending.values())
        fresh = run_cycle(snapshot, work, policies, now, random.Random(k))
        kept = keeper.cycle(snapshot, work, policies, now, random.Random(k))
        _same(kept, fresh)
        for stop in kept.preempted:
            pending[stop.workload_id] = running.pop(stop.workload_id).workload
        started = [Allocation(pending[a.workload_id], a.placements, now) for a in kept.admitted]
        assert keeper.view is not None  # what the view holds now: the snapshot and the cycle's decisions
        _state_equal(keeper.view, ClusterView.from_snapshot(
            ClusterSnapshot(nodes, (*running.values(), *started)), policies.quota, policies.priority_classes))
        if started and rng.random() < 0.3:
            started.pop(rng.randrange(len(started)))  # not carried out
        for alloc in started:
            running[alloc.workload.id] = alloc
            del pending[alloc.workload.id]
        for rejection in kept.rejected:
            if rejection.final:
                pending.pop(rejection.workload_id, None)
    assert keeper.rebuilds == 1 and count > 10


def test_a_workload_listed_twice_is_held_as_its_last_listing() -> None:
    """A snapshot that lists one workload twice (its held allocation and a new one, or one object
    twice) is taken as a dict of the list takes it: the last listing counts, whatever changes the
    snapshot hands over."""
    nodes: tuple[Node, ...] = tuple(cluster(2, devices=4))
    policies = Policies(placement="first-fit")
    first = ViewKeeper().cycle(ClusterSnapshot(nodes), [_whole("a", 2)], policies, 0.0, random.Random(0))
    placement = first.admitted[0].placements[0]
    held = Allocation(_whole("a", 2), (placement,), 0.0)
    other = next(n.name for n in nodes if n.name != placement.node)
    moved = Allocation(_whole("a", 2), (replace(placement, node=other),), 0.0)
    cases = (((held, moved), moved), ((moved, held), held), ((held, held), held), ((moved, moved), moved))
    for (listed, last), handed in product(cases, (False, True)):
        keeper = ViewKeeper()
        keeper.cycle(ClusterSnapshot(nodes, (held,), changes=AllocationChanges(0) if handed else None), [],
                     policies, 1.0, random.Random(0))
        keeper.cycle(ClusterSnapshot(nodes, (held,), changes=AllocationChanges(1) if handed else None), [],
                     policies, 1.5, random.Random(0))
        # (handed: changes that name the new object as started but not the held one as ended)
        changes = AllocationChanges(2, tuple({id(a): a for a in listed if a is not held}.values()))
        keeper.cycle(ClusterSnapshot(nodes, listed, changes=changes if handed else None), [], policies, 2.0,
                     random.Random(0))
        assert keeper.view is not None
        _state_equal(keeper.view, ClusterView.from_snapshot(ClusterSnapshot(nodes, (last,))))


@pytest.mark.parametrize("seed", range(12))
def test_a_sync_reads_the_changes_a_caller_hands_over(seed: int) -> None:
    """A caller that hands each snapshot the allocations that started and ended since the last
    (`AllocationChanges`) gets the view built afresh, cycle after cycle, without the keeper comparing
    the whole list; where the changes do not follow the snapshot synced last (a snapshot without
    them, a serial skipped) or leave listed what the view gave back (a stop not carried out), and
    on the sync after the view was built, the keeper compares, and only then."""
    nodes = tuple(cluster(4, devices=4))
    policies = Policies(placement="first-fit", ordering="drf", quota=QUOTA, preemption=True, backfill=True)
    keeper = ViewKeeper()
    compared = []
    plain_new_objects = keeper._new_objects
    keeper._new_objects = lambda *a: compared.append(k) or plain_new_objects(*a)  # type: ignore[method-assign]
    rng = random.Random(seed)
    running: dict[str, Allocation] = {}
    pending: dict[str, Workload] = {}
    started: dict[int, Allocation] = {}
    ended: list[Allocation] = []
    specs = [(q, c, s, d, 30.0) for q in "abc" for c in CLASSES for s in [(1, 500), (1, 1000), (2, 1000)]
             for d in (1, 2)]
    count = serial = 0
    expect_compared: list[int] = []
    follows, kept_stop = False, None

    def end(wid: str) -> Allocation:
        a = running.pop(wid)
        if started.pop(id(a), None) is None:
            ended.append(a)
        return a

    def start(a: Allocation) -> None:
        if a.workload.id in running:
            end(a.workload.id)
        running[a.workload.id] = a
        started[id(a)] = a

    for k in range(30):
        now = 10.0 * k
        for _ in range(rng.randrange(4)):
            w = _workload(count, rng.choice(specs), now)
            count += 1
            pending[w.id] = w
        for wid in rng.sample(sorted(running), min(rng.randrange(4), len(running))):
            end(wid)
        if running and rng.random() < 0.3:  # held ones read afresh: equal, other objects
            for wid in rng.sample(sorted(running), rng.randint(1, len(running))):
                start(replace(running[wid]))
        handed = rng.random()
        if handed < 0.1:  # a snapshot without changes
            changes = None
        else:
            serial += 2 if handed < 0.2 else 1  # (a serial skipped: the changes of one lost)
            changes = AllocationChanges(serial, tuple(started.values()), tuple(ended))
        left_listed = kept_stop is not None and all(a is not kept_stop for a in ended)
        if k == 1 or (k > 0 and (changes is None or not follows or left_listed or handed < 0.2)):
            expect_compared.append(k)
        follows = changes is not None
        started, ended = {}, []
        snapshot = ClusterSnapshot(nodes, tuple(running.values()), changes=changes)
        work = list(pending.values())
        fresh = run_cycle(snapshot, work, policies, now, random.Random(k))
        kept = keeper.cycle(snapshot, work, policies, now, random.Random(k))
        _same(kept, fresh)
        stopped = {s.workload_id for s in kept.preempted}
        assert keeper.view is not None  # what the view holds now: the snapshot and the cycle's decisions
        keeper.view.materialize()
        _state_equal(keeper.view, ClusterView.from_snapshot(ClusterSnapshot(nodes, (
            *(a for a in running.values() if a.workload.id not in stopped),
            *(Allocation(pending[a.workload_id], a.placements, now) for a in kept.admitted),
        )), policies.quota, policies.priority_classes))
        stops = list(kept.preempted)
        kept_stop = None
        if stops and rng.random() < 0.2:  # not carried out: still listed, no longer held
            kept_stop = running[stops.pop(rng.randrange(len(stops))).workload_id]
        for stop in stops:
            pending[stop.workload_id] = end(stop.workload_id).workload
        admitted = [Allocation(pending[a.workload_id], a.placements, now) for a in kept.admitted]
        if admitted and rng.random() < 0.3:
            admitted.pop(rng.randrange(len(admitted)))  # not carried out
        for alloc in admitted if kept_stop is None else ():  # (they may need what the stop frees)
            start(alloc)
            del pending[alloc.workload.id]
        for rejection in kept.rejected:
            if rejection.final:
                pending.pop(rejection.workload_id, None)
    assert keeper.rebuilds == 1 and count > 10
    assert compared == expect_compared and len(compared) < 20


def test_work_left_on_broken_hardware_is_evicted_again_whatever_the_changes_say() -> None:
    """Work on a broken node that the caller does not stop stays listed, the same object, in
    snapshots whose changes are empty: every cycle evicts it again, as a view built afresh does
    (the view does not hold it, so the keeper compares rather than read the changes)."""
    nodes = tuple(cluster(2, devices=4))
    policies = Policies(placement="first-fit")
    first = ViewKeeper().cycle(ClusterSnapshot(nodes), [_whole("a", 4)], policies, 0.0, random.Random(0))
    alloc = Allocation(_whole("a", 4), first.admitted[0].placements, 0.0)
    broken = tuple(replace(n, healthy=False) if n.name == alloc.placements[0].node else n for n in nodes)
    keeper = ViewKeeper()
    keeper.cycle(ClusterSnapshot(nodes, (alloc,), changes=AllocationChanges(0)), [], policies, 0.0,
                 random.Random(0))
    for k in range(1, 5):
        snapshot = ClusterSnapshot(broken, (alloc,), changes=AllocationChanges(k))
        kept = keeper.cycle(snapshot, [], policies, float(k), random.Random(k))
        _same(kept, run_cycle(snapshot, [], policies, float(k), random.Random(k)))
        assert [s.workload_id for s in kept.preempted] == ["a"], k
    assert keeper.rebuilds == 1
