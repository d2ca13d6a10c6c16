"""The cycle keeps its placement policy on the view and tells it the workload's pods."""

from __future__ import annotations

import random

from factories import cluster, pod, workload
from gpupool.core.scheduling.cycle import Policies, cycle_on
from gpupool.core.scheduling.policies.fgd_strand import FgdStrand
from gpupool.core.scheduling.view import MAX_PREPARE_PODS, ClusterView


def test_policy_is_kept_and_prepared_with_running_and_pending_pods() -> None:
    view = ClusterView.empty(cluster(2, devices=8))
    policies = Policies(placement="fgd-strand")
    first = [workload(pod(2), wid="a"), workload(pod(8), wid="big", submit_s=1.0)]
    result = cycle_on(view, first, policies, 0.0, random.Random(0))
    assert {a.workload_id for a in result.admitted} == {"a", "big"}
    policy = view.policy
    assert isinstance(policy, FgdStrand)
    assert policy._largest_gang == 8  # learnt from the pods, not only from the one being placed
    assert len(view.policies.pods) == 2
    later = [workload(pod(1), wid=f"w{i}", submit_s=2.0 + i) for i in range(3)]
    cycle_on(view, later, policies, 5.0, random.Random(0))
    assert view.policy is policy  # the same instance across cycles on one view
    assert len(view.policies.pods) == 5
    assert view.policies.prepared == 5  # grew by more than a quarter: prepared again


def test_prepare_gets_a_bounded_sample() -> None:
    view = ClusterView.empty(cluster(1, devices=8))
    seen: list[int] = []
    policies = Policies(placement="first-fit")
    policy = view.placement_policy(policies.placement, policies.placement_options)
    policy.prepare = lambda state, pods: seen.append(len(pods))  # type: ignore[method-assign]
    many = [workload(pod(1), wid=f"w{i}", submit_s=float(i)) for i in range(3 * MAX_PREPARE_PODS)]
    cycle_on(view, many, policies, 0.0, random.Random(0))
    assert seen == [MAX_PREPARE_PODS]
