"""Victim selection: only lower priorities, fewest victims, least lost work, cohort reclaim."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from factories import cluster, pod, workload
from gpupool.core.model import Reason, Workload
from gpupool.core.quota import DEVICE_MILLI, ClusterQueue, QuotaConfig, ResourceQuota
from gpupool.core.scheduling.cycle import EventKind, Policies, cycle_on
from gpupool.core.scheduling.preemption import VictimIndex, candidates, checkpoint_split, lost_device_s
from gpupool.core.scheduling.reach import (
    BorrowWithinCohort,
    PreemptionRules,
    ReclaimWithinCohort,
    Scope,
    WithinQueue,
)
from gpupool.core.scheduling.view import ClusterView

FF = Policies(placement="first-fit", ordering="priority-fifo", preemption=True)


def _run(view: ClusterView, ws: list[Workload], now: float, policies: Policies = FF):
    return cycle_on(view, ws, policies, now, random.Random(0))


def _filled(view: ClusterView, ws: list[Workload], now: float = 0.0) -> None:
    result = _run(view, ws, now)
    assert len(result.admitted) == len(ws)


def test_checkpoint_split() -> None:
    assert checkpoint_split(250.0, 100.0) == (200.0, 50.0)
    assert checkpoint_split(250.0, None) == (0.0, 250.0)


def test_single_victim_with_least_lost_work_is_chosen() -> None:
    view = ClusterView.empty(cluster(1, devices=4))
    _filled(view, [workload(pod(1), wid="old", submit_s=0)], now=0.0)
    _filled(view, [workload(pod(1), wid="mid", submit_s=1)], now=50.0)
    _filled(view, [workload(pod(1), wid="new", submit_s=2), workload(pod(1), wid="x", submit_s=3)], now=90.0)
    high = replace(workload(pod(1), wid="urgent", submit_s=5), priority_class="high")
    result = _run(view, [high], now=100.0)
    assert [a.workload_id for a in result.admitted] == ["urgent"]
    assert [p.workload_id for p in result.preempted] in (["new"], ["x"])
    victim = result.preempted[0]
    assert victim.kind == EventKind.PREEMPT and victim.reason == Reason.PREEMPTED
    assert victim.lost_work_s == 10.0 and victim.preemptor_id == "urgent"
    assert [r.workload_id for r in result.requeued] == [victim.workload_id]


def test_fewest_victims_before_least_lost_work() -> None:
    view = ClusterView.empty(cluster(1, devices=4))
    _filled(view, [workload(pod(2), wid="pair")], now=0.0)  # big, old: most lost work
    _filled(view, [workload(pod(1), wid="s1"), workload(pod(1), wid="s2")], now=90.0)
    high = replace(workload(pod(2), wid="urgent"), priority_class="high")
    result = _run(view, [high], now=100.0)
    assert [p.workload_id for p in result.preempted] == ["pair"]


def test_victims_away_from_the_preemptors_node_are_all_spared() -> None:
    """The greedy search frees the cheapest work first, one device on each of 30 nodes, before any
    node has room for the gang: only the two victims on the node it lands on are stopped."""
    view = ClusterView.empty(cluster(30, devices=2))
    _filled(view, [workload(pod(1), wid=f"old{i:02d}") for i in range(60)], now=0.0)
    for i in range(1, 60, 2):  # one device free on every node ...
        view.remove(f"old{i:02d}")
    _filled(view, [workload(pod(1), wid=f"new{i:02d}") for i in range(30)], now=90.0)  # ... for young work
    view.materialize()
    where = {wid: {view.state.nodes[a.node].name for _, a in run.allocs} for wid, run in view.running.items()}
    high = replace(workload(pod(2), wid="urgent"), priority_class="high")
    result = _run(view, [high], now=100.0)
    assert [a.workload_id for a in result.admitted] == ["urgent"]
    node = result.admitted[0].placements[0].node
    assert len(result.preempted) == 2
    assert all(where[p.workload_id] == {node} for p in result.preempted)


def test_checkpoint_reduces_lost_work_and_sets_resume_point() -> None:
    view = ClusterView.empty(cluster(1, devices=1))
    w = replace(workload(pod(1), wid="ckpt"), checkpoint_interval_s=30.0)
    _filled(view, [w], now=0.0)
    result = _run(view, [replace(workload(pod(1), wid="u"), priority_class="critical")], now=100.0)
    assert result.preempted[0].lost_work_s == 10.0
    assert result.requeued[0].resume_progress_s == 90.0


def test_equal_or_higher_priority_is_never_preempted() -> None:
    view = ClusterView.empty(cluster(1, devices=2))
    _filled(view, [replace(workload(pod(1), wid=f"h{i}"), priority_class="high") for i in range(2)])
    result = _run(view, [replace(workload(pod(1), wid="h3"), priority_class="high")], now=10.0)
    assert not result.preempted and not result.admitted
    crit = _run(view, [replace(workload(pod(1), wid="c"), priority_class="critical")], now=10.0)
    assert len(crit.preempted) == 1


def test_critical_is_not_preemptible() -> None:
    view = ClusterView.empty(cluster(1, devices=1))
    _filled(view, [replace(workload(pod(1), wid="c1"), priority_class="critical")])
    result = _run(view, [replace(workload(pod(1), wid="c2", priority=5), priority_class="critical")], 1.0)
    assert not result.preempted


def test_reclaiming_lent_quota_from_a_borrower_of_any_priority() -> None:
    quota = QuotaConfig(
        cluster_queues=(
            ClusterQueue("a", {DEVICE_MILLI: ResourceQuota(2000)}, "pool"),
            ClusterQueue("b", {DEVICE_MILLI: ResourceQuota(2000)}, "pool"),
        )
    )
    policies = replace(FF, quota=quota)
    view = ClusterView.empty(cluster(1, devices=4), quota)
    borrowers = [replace(workload(pod(1), wid=f"b{i}", tenant="b"), priority_class="high") for i in range(4)]
    assert len(_run(view, borrowers, 0.0, policies).admitted) == 4
    assert view.quota.is_borrowing("b")
    result = _run(view, [workload(pod(2), wid="a-job", tenant="a")], 50.0, policies)
    assert [a.workload_id for a in result.admitted] == ["a-job"]
    assert len(result.preempted) == 2
    assert {p.reason for p in result.preempted} == {Reason.RECLAIMED}
    view.quota.check_invariants()


COHORT = QuotaConfig(
    cluster_queues=(
        ClusterQueue("a", {DEVICE_MILLI: ResourceQuota(4000, borrowing_limit=8000)}, "pool"),
        ClusterQueue("b", {DEVICE_MILLI: ResourceQuota(4000, borrowing_limit=8000)}, "pool"),
        ClusterQueue("c", {DEVICE_MILLI: ResourceQuota(8000)}, "pool"),
    )
)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from("abc"),
            st.sampled_from(("high", "normal", "best-effort", "critical")),
            st.integers(1, 3),
            st.floats(0, 500),
        ),
        min_size=1,
        max_size=16,
    ),
    st.sampled_from("abc"),
    st.sampled_from(("critical", "high", "normal")),
    st.integers(0, 5),
    st.builds(PreemptionRules, st.sampled_from(Scope), st.sampled_from(WithinQueue),
              st.sampled_from(ReclaimWithinCohort), st.sampled_from(BorrowWithinCohort)),
    st.floats(0, 500),
)
def test_the_cycle_index_streams_the_candidates_in_both_orders(
    running: list, queue: str, klass: str, gone: int, rules: PreemptionRules, submitted: float
) -> None:
    """`VictimIndex` gives the plain `candidates()` set, sorted as the search needs, after victims left."""
    view = ClusterView.empty(cluster(3, devices=8), COHORT)
    ids = []
    for i, (tenant, cls, gpus, start) in enumerate(running):
        w = replace(workload(pod(gpus), wid=f"r{i}", submit_s=start), tenant=tenant, priority_class=cls)
        admit = Policies(placement="first-fit", quota=COHORT)
        if cycle_on(view, [w], admit, start, random.Random(0)).admitted:
            ids.append(w.id)
    index = VictimIndex(view, 1000.0)
    preemptor = replace(workload(pod(1), wid="p", submit_s=submitted), tenant=queue, priority_class=klass)
    exclude = set(ids[:1])
    list(index.search_order(preemptor, queue, exclude, False, None, rules)[0])  # sorted before they leave
    for wid in ids[1 : 1 + gone]:
        view.forget(view.running[wid])
    found, reclaim = candidates(preemptor, queue, view, exclude, rules)
    cost = {r.workload.id: lost_device_s(r, 1000.0) for r in found}
    by_cost, queues = index.search_order(preemptor, queue, exclude, False, None, rules)
    assert [r.workload.id for r in by_cost] == [
        r.workload.id for r in sorted(found, key=lambda r: (cost[r.workload.id], r.rank, r.workload.id))
    ]
    by_rank, _ = index.search_order(preemptor, queue, exclude, True, None, rules)
    assert [r.workload.id for r in by_rank] == [
        r.workload.id for r in sorted(found, key=lambda r: (r.rank, cost[r.workload.id], r.workload.id))
    ]
    assert {r.workload.id for r in found if r.cluster_queue in queues} == reclaim
