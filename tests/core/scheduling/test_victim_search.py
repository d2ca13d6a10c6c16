"""The optimised victim search decides exactly as its plain definition (`victims_plain.py`).

Random pools are driven cycle after cycle with preemption on, once with `select_victims` and once
with the plain search in its place; every cycle's decisions, the rng's state after it and the
placement policy's count of its calls, where a policy's decisions depend on it, must be equal.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from victims_plain import select_victims_plain

from factories import node
from gpupool.core.model import PodRequest, Workload
from gpupool.core.quota import DEVICE_MILLI, ClusterQueue, QuotaConfig, ResourceQuota
from gpupool.core.scheduling import cycle
from gpupool.core.scheduling.cycle import CycleResult, Policies, cycle_on
from gpupool.core.scheduling.preemption import lost_device_s, lost_device_s_many
from gpupool.core.scheduling.reach import (
    BorrowWithinCohort,
    PreemptionRules,
    ReclaimWithinCohort,
    Scope,
    WithinQueue,
)
from gpupool.core.scheduling.view import ClusterView, Running

QUOTA = QuotaConfig(
    cluster_queues=(
        ClusterQueue("a", {DEVICE_MILLI: ResourceQuota(12_000, borrowing_limit=12_000)}, "pool"),
        ClusterQueue("b", {DEVICE_MILLI: ResourceQuota(12_000)}, "pool"),
        ClusterQueue("c", {DEVICE_MILLI: ResourceQuota(8_000)}, "pool"),
    )
)
CLASSES = ("critical", "high", "normal", "best-effort")

# (queue, class, pods, devices per pod, milli per device, cpu per pod, checkpoint interval)
job = st.tuples(
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(CLASSES),
    st.sampled_from([1, 1, 1, 2, 3]),  # pods
    st.sampled_from([1, 1, 2, 4]),
    st.sampled_from([250, 500, 1000, 1000]),
    st.sampled_from([500, 4000, 20_000]),
    st.sampled_from([None, 10.0]),
)
steps = st.lists(st.tuples(st.integers(0, 2), st.lists(job, min_size=2, max_size=8)), min_size=3, max_size=12)
placements = st.sampled_from(
    [
        ("first-fit", {}),
        ("fgd-strand", {}),
        ("random", {}),  # draws from the rng at every placement
        ("best-fit", {}),
        ("gpu-clustering", {}),
        ("best-fit", {"first_on_ties": False}),  # draws from the rng on ties
        ("fgd-strand", {"reserve_expected": True}),  # counts every placement call, failed ones too
    ]
)


def _workload(i: int, spec: tuple[Any, ...], now: float) -> Workload:
    queue, klass, pods, devices, milli, cpu, interval = spec
    count = devices if milli == 1000 else 1
    return Workload(
        id=f"w{i:03d}",
        pods=tuple(
            PodRequest(f"p{k}", cpu_milli=cpu, memory_mib=4096, num_devices=count, device_milli=milli)
            for k in range(pods)
        ),
        tenant=queue,
        priority_class=klass,
        submit_time_s=now,
        runtime_estimate_s=100.0,
        checkpoint_interval_s=interval,
    )


def _drive(plan: list[Any], policies: Policies, nodes: int, seed: int) -> list[tuple[Any, ...]]:
    """Cycles over arrivals and completions; per cycle its result, the rng state and, where later
    decisions depend on it, the policy's count of its calls."""
    pool = [node(f"n{i}", devices=4 + 4 * (i % 2), cpu_milli=64_000) for i in range(nodes)]
    view = ClusterView.empty(pool, policies.quota, policies.priority_classes)
    rng = random.Random(seed)
    pending: dict[str, Workload] = {}
    by_id: dict[str, Workload] = {}
    out: list[tuple[Any, ...]] = []
    serial = 0
    for step, (finish, arrivals) in enumerate(plan):
        now = 10.0 * step + 3.0
        for _ in range(min(finish, len(view.running))):
            view.remove(sorted(view.running)[rng.randrange(len(view.running))])
        for spec in arrivals:
            w = _workload(serial, spec, now)
            serial += 1
            pending[w.id] = by_id[w.id] = w
        result: CycleResult = cycle_on(view, list(pending.values()), policies, now, rng)
        view.state.check_invariants()
        for stop in result.preempted:
            pending[stop.workload_id] = by_id[stop.workload_id]
        for admission in result.admitted:
            pending.pop(admission.workload_id)
        for rejection in result.rejected:
            if rejection.final:
                pending.pop(rejection.workload_id)
        policy = view.placement_policy(policies.placement, policies.placement_options)
        counted = dict(getattr(policy, "_arrived", {})) if policy.counts_failed_calls() else None
        out.append((result, rng.getstate(), counted))
    return out


def _both(plan: list[Any], policies: Policies, nodes: int, seed: int) -> None:
    fast = _drive(plan, policies, nodes, seed)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle, "select_victims", select_victims_plain)
        plain = _drive(plan, policies, nodes, seed)
    assert fast == plain


@settings(max_examples=120, deadline=None)
@given(steps, placements, st.sampled_from(["priority-fifo", "drf"]), st.booleans(), st.integers(2, 6))
def test_victim_search_decides_as_the_plain_search(
    plan: list[Any], placement: tuple[str, dict[str, Any]], ordering: str, quota: bool, nodes: int
) -> None:
    policies = Policies(
        placement=placement[0],
        placement_options=placement[1],
        ordering=ordering,
        preemption=True,
        quota=QUOTA if quota else QuotaConfig(),
    )
    _both(plan, policies, nodes, seed=nodes)


@settings(max_examples=40, deadline=None)
@given(steps, placements)
def test_victim_search_under_backfill_decides_as_the_plain_search(
    plan: list[Any], placement: tuple[str, dict[str, Any]]
) -> None:
    policies = Policies(placement=placement[0], placement_options=placement[1], ordering="drf",
                        preemption=True, backfill=True, quota=QUOTA)
    _both(plan, replace(policies, max_preemption_attempts=4), 5, seed=1)


rules = st.builds(PreemptionRules, st.sampled_from(Scope), st.sampled_from(WithinQueue),
                  st.sampled_from(ReclaimWithinCohort), st.sampled_from(BorrowWithinCohort))


@settings(max_examples=60, deadline=None)
@given(steps, placements, rules)
def test_victim_search_under_any_preemption_rules_decides_as_the_plain_search(
    plan: list[Any], placement: tuple[str, dict[str, Any]], chosen: PreemptionRules
) -> None:
    policies = Policies(placement=placement[0], placement_options=placement[1], ordering="priority-fifo",
                        preemption=True, quota=QUOTA, preemption_rules=chosen)
    _both(plan, policies, 4, seed=2)


times = st.floats(min_value=0, max_value=1e7, allow_nan=False) | st.sampled_from([0.0, 3600.0, 7200.0])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(times, times, st.sampled_from([None, 0.0, -5.0, 1.0, 600.0, 1800.0, 1e-3]),
                  st.sampled_from([0.0, 0.25, 1.0, 8.0])),
        min_size=0, max_size=150,
    ),
    times,
)
def test_lost_work_on_arrays_is_the_scalar_definition(specs: list[Any], now: float) -> None:
    """Costs computed on arrays are bit for bit those of `lost_device_s` (they order the victims)."""
    pod = PodRequest("p", num_devices=1, device_milli=1000)
    runs = [
        Running(Workload(id=f"w{i}", pods=(pod,), checkpoint_interval_s=interval), (), start, "", {},
                (0, 0), progress_s=progress, device_count=count)
        for i, (start, progress, interval, count) in enumerate(specs)
    ]
    many = lost_device_s_many(runs, now)
    assert [v.hex() for v in many] == [lost_device_s(r, now).hex() for r in runs]
