"""How far priority reaches: within a queue, within a cohort, across the pool (PreemptionRules)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import cluster, pod, workload
from gpupool.core.model import Reason, Workload
from gpupool.core.priority import PriorityClass, PriorityClasses
from gpupool.core.quota import DEVICE_MILLI, ClusterQueue, QuotaConfig, ResourceQuota
from gpupool.core.scheduling import cycle
from gpupool.core.scheduling.cycle import CycleResult, Policies, cycle_on
from gpupool.core.scheduling.reach import (
    BorrowWithinCohort,
    PreemptionRules,
    ReclaimWithinCohort,
    Scope,
    WithinQueue,
)
from gpupool.core.scheduling.view import ClusterView

TWO_TENANTS = QuotaConfig(cluster_queues=(ClusterQueue("team-a", {}), ClusterQueue("team-b", {})))
"""Each tenant's work in a ClusterQueue of its own, without a quota (as the server's default queues)."""


def _policies(quota: QuotaConfig = TWO_TENANTS, **rules: object) -> Policies:
    return Policies(placement="first-fit", ordering="priority-fifo", preemption=True, quota=quota,
                    preemption_rules=PreemptionRules(**rules))  # type: ignore[arg-type]


def _job(wid: str, tenant: str, klass: str, gpus: int = 1, pods: int = 1, **extra: object) -> Workload:
    w = replace(workload(*(pod(gpus) for _ in range(pods)), wid=wid, tenant=tenant), priority_class=klass)
    return replace(w, **extra)  # type: ignore[arg-type]


def _view(policies: Policies, nodes: int = 1, devices: int = 4) -> ClusterView:
    return ClusterView.empty(cluster(nodes, devices=devices), policies.quota, policies.priority_classes)


def _run(view: ClusterView, ws: list[Workload], policies: Policies, now: float) -> CycleResult:
    return cycle_on(view, ws, policies, now, random.Random(0))


def _full_of_best_effort(policies: Policies, tenant: str = "team-a") -> ClusterView:
    view = _view(policies)
    filler = [_job(f"be{i}", tenant, "best-effort") for i in range(4)]
    assert len(_run(view, filler, policies, 0.0).admitted) == 4
    return view


def test_under_queue_scope_critical_work_waits_and_says_why() -> None:
    policies = _policies(scope=Scope.QUEUE)
    view = _full_of_best_effort(policies)
    result = _run(view, [_job("crit", "team-b", "critical", gpus=2)], policies, 10.0)
    assert not result.admitted and not result.preempted
    (waiting,) = result.rejected
    assert waiting.reason == Reason.INSUFFICIENT_DEVICES
    assert ("preemption not possible: the lower-priority work is in queue team-a and preemption.scope "
            "is queue.") in waiting.message


def test_under_pool_scope_a_critical_gang_preempts_another_queues_best_effort_work() -> None:
    policies = _policies(scope=Scope.POOL)
    view = _full_of_best_effort(policies)
    result = _run(view, [_job("crit", "team-b", "critical", pods=2)], policies, 10.0)
    assert [a.workload_id for a in result.admitted] == ["crit"]
    assert len(result.preempted) == 2
    assert {p.reason for p in result.preempted} == {Reason.PREEMPTED}
    assert {p.preemptor_id for p in result.preempted} == {"crit"}


def test_across_queues_only_the_class_counts_not_a_tenants_own_priority() -> None:
    policies = _policies(scope=Scope.POOL)
    view = _view(policies)
    assert len(_run(view, [_job(f"n{i}", "team-a", "normal") for i in range(4)], policies, 0.0).admitted) == 4
    own_priority = _job("mine", "team-b", "normal", priority=50)
    assert not _run(view, [own_priority], policies, 10.0).preempted
    higher_class = _job("high", "team-b", "high")
    assert len(_run(view, [higher_class], policies, 10.0).preempted) == 1


def test_a_class_that_is_not_preemptible_wins_over_pool_scope() -> None:
    classes = PriorityClasses((PriorityClass("guarded", -100, preemptible=False), PriorityClass("high", 100)))
    policies = replace(_policies(scope=Scope.POOL), priority_classes=classes)
    view = _view(policies)
    guarded = [_job(f"g{i}", "team-a", "guarded") for i in range(4)]
    assert len(_run(view, guarded, policies, 0.0).admitted) == 4
    result = _run(view, [_job("h", "team-b", "high")], policies, 10.0)
    assert not result.preempted and not result.admitted
    assert "preemption not possible" not in result.rejected[0].message


def test_pool_scope_leaves_the_own_queue_to_within_queue() -> None:
    policies = _policies(scope=Scope.POOL, within_queue=WithinQueue.NEVER)
    view = _full_of_best_effort(policies, tenant="team-b")
    result = _run(view, [_job("crit", "team-b", "critical")], policies, 10.0)
    assert not result.preempted
    assert ("preemption not possible: the lower-priority work is in its own queue team-b and "
            "preemption.within_queue is never.") in result.rejected[0].message


def test_within_queue_never_and_lower_priority() -> None:
    never = _policies(within_queue=WithinQueue.NEVER)
    view = _full_of_best_effort(never)
    waited = _run(view, [_job("crit", "team-a", "critical")], never, 10.0)
    assert not waited.preempted
    assert ("preemption not possible: the lower-priority work is in its own queue team-a and "
            "preemption.within_queue is never.") in waited.rejected[0].message
    lower = _policies(within_queue=WithinQueue.LOWER_PRIORITY)
    assert len(_run(view, [_job("crit", "team-a", "critical")], lower, 10.0).preempted) == 1


def test_lower_or_newer_equal_priority_takes_only_newer_work_of_the_same_rank() -> None:
    for within, expected in ((WithinQueue.LOWER_PRIORITY, []), (WithinQueue.LOWER_OR_NEWER_EQUAL_PRIORITY,
                                                                  ["newer"])):
        policies = _policies(within_queue=within)
        view = _view(policies, devices=2)
        running = [_job("older", "team-a", "normal", submit_time_s=0.0),
                   _job("newer", "team-a", "normal", submit_time_s=20.0)]
        assert len(_run(view, running, policies, 30.0).admitted) == 2
        waiting = _job("waiting", "team-a", "normal", submit_time_s=10.0)
        result = _run(view, [waiting], policies, 40.0)
        assert [p.workload_id for p in result.preempted] == expected, within


COHORT = QuotaConfig(cluster_queues=(
    ClusterQueue("team-a", {DEVICE_MILLI: ResourceQuota(2000)}, "pool"),
    ClusterQueue("team-b", {DEVICE_MILLI: ResourceQuota(2000)}, "pool"),
))


def _b_borrows(policies: Policies, klass: str) -> ClusterView:
    view = _view(policies)
    borrowers = [_job(f"b{i}", "team-b", klass) for i in range(4)]
    assert len(_run(view, borrowers, policies, 0.0).admitted) == 4
    assert view.quota.is_borrowing("team-b")
    return view


def test_reclaim_within_cohort_any_lower_priority_never() -> None:
    for rule, klass, reclaims in ((ReclaimWithinCohort.ANY, "high", True),
                                  (ReclaimWithinCohort.LOWER_PRIORITY, "high", False),
                                  (ReclaimWithinCohort.LOWER_PRIORITY, "best-effort", True),
                                  (ReclaimWithinCohort.NEVER, "best-effort", False)):
        policies = _policies(COHORT, reclaim_within_cohort=rule)
        view = _b_borrows(policies, klass)
        result = _run(view, [_job("a-job", "team-a", "normal")], policies, 10.0)
        assert bool(result.preempted) == reclaims, (rule, klass)
        assert all(p.reason == Reason.RECLAIMED for p in result.preempted)


def test_borrow_within_cohort_lets_a_borrowing_queue_take_lower_priority_work() -> None:
    for rule, takes in ((BorrowWithinCohort.NEVER, False), (BorrowWithinCohort.LOWER_PRIORITY, True)):
        policies = _policies(COHORT, borrow_within_cohort=rule)
        view = _b_borrows(policies, "best-effort")
        # three devices: beyond team-a's nominal two, so it would borrow
        result = _run(view, [_job("a-big", "team-a", "normal", gpus=3)], policies, 10.0)
        assert bool(result.admitted) == takes, rule
        assert all(p.reason == Reason.PREEMPTED for p in result.preempted)


def test_a_gang_reclaiming_from_four_jobs_on_two_nodes_lands_on_one_node() -> None:
    """The two cheapest victims sit one on each node; the gang takes both jobs of one node instead."""
    policies = _policies(scope=Scope.POOL)
    view = _view(policies, nodes=2, devices=8)
    first = [_job(f"old{i}", "team-a", "best-effort", gpus=4) for i in range(4)]
    assert len(_run(view, first, policies, 0.0).admitted) == 4  # first-fit: two on each node
    view.remove("old1")
    view.remove("old3")
    young = [_job(f"new{i}", "team-a", "best-effort", gpus=4) for i in range(2)]
    assert len(_run(view, young, policies, 50.0).admitted) == 2  # one beside each old job: the cheapest
    view.materialize()
    node_of = {wid: {a.node for _, a in run.allocs} for wid, run in view.running.items()}
    assert node_of["new0"] != node_of["new1"]
    result = _run(view, [_job("gang", "team-b", "critical", gpus=4, pods=2)], policies, 100.0)
    assert [a.workload_id for a in result.admitted] == ["gang"]
    assert len({p.node for p in result.admitted[0].placements}) == 1
    victims = [p.workload_id for p in result.preempted]
    assert len(victims) == 2 and len(set().union(*(node_of[v] for v in victims))) == 1
    view.state.check_invariants()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.floats(0, 90)), min_size=4, max_size=24),
       st.sampled_from([2, 3]), st.sampled_from([2, 4]))
def test_a_preempting_gang_never_lands_on_more_nodes_than_the_search_chose(
    running: list[tuple[int, float]], pods: int, gpus: int
) -> None:
    """On random pools: with `fewer_nodes` the gang spans at most the nodes the search's own choice
    would give it, and the pool is never over-allocated."""
    policies = _policies(scope=Scope.POOL)

    def gang_nodes() -> int | None:
        view = _view(policies, nodes=4, devices=8)
        for i, (size, start) in enumerate(sorted(running, key=lambda r: r[1])):
            _run(view, [_job(f"r{i}", "team-a", "best-effort", gpus=size)], policies, start)
        result = _run(view, [_job("gang", "team-b", "critical", gpus=gpus, pods=pods)], policies, 100.0)
        view.state.check_invariants()
        if not result.admitted:
            return None
        return len({p.node for p in result.admitted[0].placements})

    compact = gang_nodes()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle, "fewer_nodes", lambda chosen, *args: chosen)
        plain = gang_nodes()
    assert (compact is None) == (plain is None)
    if compact is not None and plain is not None:
        assert compact <= plain
