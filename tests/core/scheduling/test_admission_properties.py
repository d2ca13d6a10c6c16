"""Invariants of admission over random arrival sequences (hypothesis)."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import cluster
from gpupool.core.model import PodRequest, Reason, Workload
from gpupool.core.quota import DEVICE_MILLI, ClusterQueue, QuotaConfig, ResourceQuota
from gpupool.core.scheduling import cycle
from gpupool.core.scheduling.backfill import reserve
from gpupool.core.scheduling.cycle import CycleResult, Policies, Refuse, Wait, cycle_on
from gpupool.core.scheduling.policies.base import make_policy
from gpupool.core.scheduling.view import ClusterView

QUOTA = QuotaConfig(
    cluster_queues=(
        ClusterQueue("a", {DEVICE_MILLI: ResourceQuota(4000, borrowing_limit=2000)}, "pool"),
        ClusterQueue("b", {DEVICE_MILLI: ResourceQuota(3000, lending_limit=1000)}, "pool"),
        ClusterQueue("c", {DEVICE_MILLI: ResourceQuota(2000)}),
    )
)
CLASSES = ("critical", "high", "normal", "best-effort")

job = st.tuples(
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(CLASSES),
    st.sampled_from([(1, 300), (1, 1000), (2, 1000), (3, 1000)]),  # (pods, milli per pod)
    st.integers(min_value=1, max_value=3),  # devices per pod when whole
    st.floats(min_value=1, max_value=50),  # runtime estimate
)
ops = st.lists(st.tuples(st.booleans(), job), min_size=1, max_size=25)


def _workload(i: int, spec: tuple, now: float) -> Workload:
    tenant, cls, (pods, milli), per_pod, runtime = spec
    count = per_pod if milli == 1000 else 1
    return Workload(
        id=f"w{i}",
        pods=tuple(
            PodRequest(name=f"p{k}", cpu_milli=100, num_devices=count, device_milli=milli)
            for k in range(pods)
        ),
        tenant=tenant,
        priority_class=cls,
        submit_time_s=now,
        runtime_estimate_s=runtime,
        checkpoint_interval_s=10.0,
    )


def _drive(sequence: list, policies: Policies, seed: int) -> list[CycleResult]:
    """A tiny simulation: arrivals and completions, one cycle per step, invariants checked each time."""
    view = ClusterView.empty(cluster(2, devices=4), policies.quota, policies.priority_classes)
    rng = random.Random(seed)
    pending: dict[str, Workload] = {}
    results = []
    for step, (finish_one, spec) in enumerate(sequence):
        now = float(step * 5)
        if finish_one and view.running:
            view.remove(sorted(view.running)[rng.randrange(len(view.running))])
        w = _workload(step, spec, now)
        pending[w.id] = w
        running = {wid: r.workload for wid, r in view.running.items()}
        ranks = {wid: view.classes.rank(r.workload) for wid, r in view.running.items()}
        queues = {wid: r.cluster_queue for wid, r in view.running.items()}
        result = cycle_on(view, list(pending.values()), policies, now, rng)
        _check(view, result, pending, ranks, queues, policies, now)
        for stop in result.preempted:
            pending[stop.workload_id] = running[stop.workload_id]  # requeued whole
        for admission in result.admitted:
            pending.pop(admission.workload_id)
        for rejection in result.rejected:
            if rejection.final:
                pending.pop(rejection.workload_id)
        results.append(result)
    return results


def _check(view, result, pending, ranks, queues, policies, now) -> None:  # type: ignore[no-untyped-def]
    view.state.check_invariants()
    view.quota.check_invariants()  # a quota is never exceeded
    by_id = dict(pending)
    for admission in result.admitted:
        assert len(admission.placements) == len(by_id[admission.workload_id].pods)  # never partly
    for stop in result.preempted:
        preemptor = by_id[stop.preemptor_id]
        if stop.reason == Reason.PREEMPTED:  # only lower priorities, within the queue
            assert ranks[stop.workload_id] < view.classes.rank(preemptor)
            assert queues[stop.workload_id] == view.cluster_queue(preemptor)
        else:
            assert stop.reason == Reason.RECLAIMED
            assert queues[stop.workload_id] != view.cluster_queue(preemptor)
    if result.reservation is not None and policies.backfill:  # backfill never delays the head
        head = by_id[result.reservation.workload_id]
        again = reserve(head, view, now, make_policy(policies.placement), random.Random(0))
        assert again is not None and again.start_s <= result.reservation.start_s


BASE = Policies(placement="first-fit", quota=QUOTA)


@settings(max_examples=25, deadline=None)
@given(ops, st.sampled_from(["fifo", "priority-fifo", "drf", "las"]))
def test_invariants_with_preemption(sequence: list, ordering: str) -> None:
    _drive(sequence, replace(BASE, ordering=ordering, preemption=True), seed=1)


@settings(max_examples=25, deadline=None)
@given(ops, st.sampled_from(["fifo", "priority-fifo"]))
def test_invariants_with_backfill(sequence: list, ordering: str) -> None:
    _drive(sequence, replace(BASE, ordering=ordering, backfill=True), seed=2)


@settings(max_examples=10, deadline=None)
@given(ops)
def test_same_seed_same_run(sequence: list) -> None:
    policies = replace(BASE, preemption=True, backfill=True, ordering="drf")
    assert _drive(sequence, policies, seed=7) == _drive(sequence, policies, seed=7)


def _sorted_rejections(results: list[CycleResult]) -> list[tuple[tuple[object, ...], list[Any]]]:
    """Each cycle's decisions with its waits and refusals sorted (the order of the walk's verdicts
    differs between the fast paths and walking every workload; each kind is kept apart, as a wait
    and a refusal with the same fields compare equal as tuples)."""
    return [(tuple(d for d in r.decisions if not isinstance(d, Wait | Refuse)),
             sorted((type(d).__name__, *d) for d in r.rejected)) for r in results]


narrow_job = st.tuples(  # few (queue, shape, rank) keys, so many workloads share a verdict
    st.sampled_from(["a", "b"]),
    st.sampled_from(["high", "normal", "best-effort"]),
    st.sampled_from([(1, 1000), (2, 1000)]),
    st.integers(min_value=1, max_value=2),
    st.floats(min_value=1, max_value=50),
)
narrow_ops = st.lists(st.tuples(st.booleans(), narrow_job), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(ops, narrow_ops),
    st.sampled_from(["fifo", "priority-fifo", "drf", "las"]),
    st.booleans(),
    st.booleans(),
)
def test_passing_over_known_verdicts_changes_no_decision(
    sequence: list, ordering: str, preemption: bool, backfill: bool
) -> None:
    """A cycle passes over workloads whose (queue, shape, rank) already failed: the same decisions
    (admissions, preemptions, reservation, every rejection with its reason) as walking every one."""
    policies = replace(BASE, ordering=ordering, preemption=preemption, backfill=backfill)
    fast = _drive(sequence, policies, seed=3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle._Cycle, "pass_over", False)
        full = _drive(sequence, policies, seed=3)
    assert _sorted_rejections(fast) == _sorted_rejections(full)
