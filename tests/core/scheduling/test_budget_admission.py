"""Budgets in admission: an exhausted tenant's pending work waits with `budget_exhausted` before
placement, the others' is decided as without it, and running work is never touched."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import test_admission_properties as props
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import cluster, pod, workload
from gpupool.core.model import Allocation, ClusterSnapshot, Reason, Workload
from gpupool.core.scheduling import cycle
from gpupool.core.scheduling.cycle import CycleResult, Policies, cycle_on, run_cycle
from gpupool.core.scheduling.view import ClusterView

FF = Policies(placement="first-fit")


def _reasons(result: CycleResult) -> dict[str, tuple[Reason, bool]]:
    return {r.workload_id: (r.reason, r.final) for r in result.rejected}


def test_an_exhausted_tenants_work_waits_and_the_others_proceed() -> None:
    snap = ClusterSnapshot(tuple(cluster(1, devices=4)))
    ws = [workload(pod(1), wid=f"{t}{i}", tenant=t, submit_s=i) for i, t in enumerate(["a", "b", "a", "b"])]
    result = run_cycle(snap, ws, replace(FF, exhausted_tenants=frozenset({"a"})), 0.0, random.Random(0))
    assert [a.workload_id for a in result.admitted] == ["b1", "b3"]
    assert _reasons(result) == dict.fromkeys(["a0", "a2"], (Reason.BUDGET_EXHAUSTED, False))
    assert "'a'" in result.rejected[0].message


def test_the_budget_is_checked_before_placement_and_blocks_no_one_else() -> None:
    """Under strict FIFO the exhausted head does not hold up the queue behind it (as a placement
    failure would)."""
    snap = ClusterSnapshot(tuple(cluster(1, devices=2)))
    ws = [workload(pod(2), wid="head", tenant="a", submit_s=0),
          workload(pod(2), wid="next", tenant="b", submit_s=1)]
    strict = replace(FF, ordering="fifo", exhausted_tenants=frozenset({"a"}))
    result = run_cycle(snap, ws, strict, 0.0, random.Random(0))
    assert [a.workload_id for a in result.admitted] == ["next"]
    assert _reasons(result) == {"head": (Reason.BUDGET_EXHAUSTED, False)}


def test_running_work_of_an_exhausted_tenant_continues() -> None:
    nodes = tuple(cluster(1, devices=2))
    running = workload(pod(1), wid="r", tenant="a")
    placed = run_cycle(ClusterSnapshot(nodes), [running], FF, 0.0, random.Random(0)).admitted[0]
    snap = ClusterSnapshot(nodes, (Allocation(running, placed.placements, 0.0),))
    waiting = workload(pod(1), wid="w", tenant="a")
    result = run_cycle(snap, [waiting], replace(FF, preemption=True, exhausted_tenants=frozenset({"a"})),
                       10.0, random.Random(0))
    assert result.preempted == () and result.requeued == () and result.admitted == ()
    assert _reasons(result) == {"w": (Reason.BUDGET_EXHAUSTED, False)}


def test_no_budget_set_is_the_cycle_of_before() -> None:
    snap = ClusterSnapshot(tuple(cluster(1, devices=2)))
    ws = [workload(pod(1), wid=f"w{i}", tenant="ab"[i % 2], submit_s=i) for i in range(5)]
    plain = run_cycle(snap, ws, FF, 0.0, random.Random(0))
    assert run_cycle(snap, ws, replace(FF, exhausted_tenants=frozenset()), 0.0, random.Random(0)) == plain
    idle = replace(FF, exhausted_tenants=frozenset({"zz"}))  # a tenant with nothing pending changes nothing
    assert run_cycle(snap, ws, idle, 0.0, random.Random(0)) == plain


# ---------------------------------------------------------------- the fast paths keep their promise

SHARED = replace(props.QUOTA, default_cluster_queue="c")
"""Tenant "x" has no ClusterQueue of its own: its work shares "c"'s (queue, shape, rank) keys."""

mixed_job = st.tuples(
    st.sampled_from(["a", "b", "c", "x"]),
    st.sampled_from(["high", "normal", "best-effort"]),
    st.sampled_from([(1, 300), (1, 1000), (2, 1000)]),
    st.integers(min_value=1, max_value=2),
    st.floats(min_value=1, max_value=50),
)
budgets = st.lists(st.frozensets(st.sampled_from(["a", "c", "x"])), min_size=1, max_size=4)


def _drive(sequence: list, exhausted: list[frozenset[str]], policies: Policies,
           seed: int) -> list[CycleResult]:
    """Arrivals and completions, one cycle per step, the exhausted set changing from step to step."""
    view = ClusterView.empty(cluster(2, devices=4), policies.quota, policies.priority_classes)
    rng = random.Random(seed)
    pending: dict[str, Workload] = {}
    submitted: dict[str, Workload] = {}
    results = []
    for step, (finish_one, spec) in enumerate(sequence):
        now = float(step * 5)
        if finish_one and view.running:
            view.remove(sorted(view.running)[rng.randrange(len(view.running))])
        w = props._workload(step, spec, now)
        pending[w.id] = submitted[w.id] = w
        out = exhausted[step % len(exhausted)]
        before = set(view.running)
        result = cycle_on(view, list(pending.values()), replace(policies, exhausted_tenants=out), now, rng)
        view.state.check_invariants()
        view.quota.check_invariants()
        assert before - set(view.running) == {p.workload_id for p in result.preempted}
        for admission in result.admitted:
            assert pending[admission.workload_id].tenant not in out
        for rejection in result.rejected:
            budget = rejection.reason == Reason.BUDGET_EXHAUSTED
            assert budget == (pending[rejection.workload_id].tenant in out)
        for stop in result.preempted:
            pending[stop.workload_id] = submitted[stop.workload_id]  # requeued whole
        for admission in result.admitted:
            pending.pop(admission.workload_id)
        for rejection in result.rejected:
            if rejection.final:
                pending.pop(rejection.workload_id)
        results.append(result)
    return results


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), mixed_job), min_size=1, max_size=30),
    budgets,
    st.sampled_from(["fifo", "priority-fifo", "drf", "las"]),
    st.booleans(),
    st.booleans(),
)
def test_budget_verdicts_with_the_fast_paths_are_those_of_walking_every_workload(
    sequence: list, exhausted: list[frozenset[str]], ordering: str, preemption: bool, backfill: bool
) -> None:
    """Passing over known verdicts and keeping the pending book decide as the plain walk does, rejections
    in order included, with exhausted tenants that share keys with tenants that are not."""
    policies = replace(props.BASE, quota=SHARED, ordering=ordering, preemption=preemption, backfill=backfill)
    fast = _drive(sequence, exhausted, policies, seed=5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle._Cycle, "keep_pending", False)
        plain_book = _drive(sequence, exhausted, policies, seed=5)
        mp.setattr(cycle._Cycle, "pass_over", False)
        plain = _drive(sequence, exhausted, policies, seed=5)
    assert fast == plain_book
    assert props._sorted_rejections(fast) == props._sorted_rejections(plain)
