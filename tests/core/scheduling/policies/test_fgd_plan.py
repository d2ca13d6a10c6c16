"""fgd-plan: LP fill patterns for fractional pods, and the demand-aware reserve for big gangs."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import node, pod
from gpupool.core.model import PodRequest
from gpupool.core.scheduling.policies._patterns import plan_patterns
from gpupool.core.scheduling.policies.base import Choice, PlacementPolicy, make_policy
from gpupool.core.state import ClusterState


def run(policy: PlacementPolicy, state: ClusterState, sequence: list[PodRequest]) -> int:
    """Place the pods in order (failures are skipped); device milli allocated."""
    used = 0
    for p in sequence:
        choice = policy.place(p, state, random.Random(0))
        if isinstance(choice, Choice):
            state.allocate(state.make_alloc(p, choice.node, choice.devices))
            used += p.total_device_milli
    return used


def one_node(devices: int) -> ClusterState:
    return ClusterState([node("n0", devices=devices, cpu_milli=512_000, memory_mib=1 << 20)])


# ---------------------------------------------------------------- the cutting-stock LP


def test_patterns_of_sizes_that_pair_exactly() -> None:
    plan = plan_patterns({600: 2, 400: 2})
    assert plan is not None
    assert plan.devices_lp == pytest.approx(2.0)
    assert plan.sizes == (400, 600)
    assert plan.counts.tolist() == [[1, 1]] and plan.weight.tolist() == pytest.approx([2.0])


def test_lp_mixes_patterns_when_sizes_do_not_pair() -> None:
    # 0.5+0.5 and 0.3+0.3+0.3 fill devices best: 1.5 + 1 devices.
    plan = plan_patterns({300: 3, 500: 3})
    assert plan is not None and plan.devices_lp == pytest.approx(2.5)


def test_nothing_to_plan() -> None:
    assert plan_patterns({}) is None
    assert plan_patterns({1000: 4, 0: 3}) is None  # whole devices and cpu-only pods are not sliced


def first_fit_decreasing(demand: dict[int, int]) -> int:
    bins: list[int] = []
    for size in sorted((s for s, n in demand.items() for _ in range(n)), reverse=True):
        for i, load in enumerate(bins):
            if load + size <= 1000:
                bins[i] += size
                break
        else:
            bins.append(size)
    return len(bins)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.integers(1, 99).map(lambda x: 10 * x), st.integers(1, 30), min_size=1, max_size=6))
def test_lp_is_a_lower_bound_between_volume_and_first_fit_decreasing(demand: dict[int, int]) -> None:
    plan = plan_patterns(demand)
    assert plan is not None
    volume = sum(s * n for s, n in demand.items()) / 1000
    assert volume - 1e-6 <= plan.devices_lp <= first_fit_decreasing(demand) + 1e-6
    sizes = list(plan.sizes)
    assert (plan.counts @ sizes <= 1000).all()  # every pattern fits one device
    covered = plan.weight @ plan.counts
    assert all(covered[i] >= demand[s] - 1e-6 for i, s in enumerate(sizes))


# ---------------------------------------------------------------- placement along the plan


def test_fgd_plan_reaches_the_best_packing_where_fgd_strand_does_not() -> None:
    # Two devices; 0.3, 0.3, 0.5, 0.5, 0.5, 0.3 in that order. The best any placement can do is
    # 0.5+0.5 on one device and 0.3+0.3+0.3 on the other: 1.9 devices.
    sizes = [0.3, 0.3, 0.5, 0.5, 0.5, 0.3]
    sequence = [pod(s, name=f"p{i}") for i, s in enumerate(sizes)]
    planned = make_policy("fgd-plan")
    state = one_node(2)
    planned.prepare(state, sequence)
    assert run(planned, state, sequence) == 1900
    strand = make_policy("fgd-strand")
    state = one_node(2)
    strand.prepare(state, sequence)
    assert run(strand, state, sequence) < 1900


def test_fgd_plan_without_the_plan_places_like_fgd_strand_on_fractions() -> None:
    sizes = [0.3, 0.3, 0.5, 0.5, 0.5, 0.3]
    sequence = [pod(s, name=f"p{i}") for i, s in enumerate(sizes)]
    results = []
    for policy in (make_policy("fgd-plan", plan=False, reserve_expected=False), make_policy("fgd-strand")):
        state = one_node(2)
        policy.prepare(state, sequence)
        results.append(run(policy, state, sequence))
    assert results[0] == results[1]


def test_a_device_changed_behind_the_plan_is_treated_as_unplanned() -> None:
    state = one_node(2)
    workload = [pod(0.6, name="a"), pod(0.4, name="b")]
    policy = make_policy("fgd-plan")
    policy.prepare(state, workload)
    first = policy.place(workload[0], state, random.Random(0))
    assert isinstance(first, Choice)
    record = state.make_alloc(workload[0], first.node, first.devices)
    state.allocate(record)
    # Something else frees the device (the pod left): its 0.4 slot no longer matches.
    state.release(record)
    again = policy.place(pod(0.4), state, random.Random(0))
    assert isinstance(again, Choice)
    state.allocate(state.make_alloc(pod(0.4), again.node, again.devices))
    assert state.dev_milli_free.sum() == 2000 - 400


def test_demand_aware_reserve_counts_only_nodes_that_can_still_hold_the_gang() -> None:
    # The gang (8 devices, 120 cores) fits only the two 128-core nodes; one of them has lost its
    # cores to a cpu-only pod, so one node is really left for it and it is kept from a small pod.
    state = ClusterState(
        [
            node("rich-b", devices=8, cpu_milli=128_000, memory_mib=1 << 20),
            node("rich-a", devices=8, cpu_milli=128_000, memory_mib=1 << 20),
            node("poor", devices=8, cpu_milli=64_000, memory_mib=1 << 20),
        ]
    )
    hog = pod(0, cpu_milli=100_000)
    state.allocate(state.make_alloc(hog, 1, ()))
    workload = [pod(8, cpu_milli=120_000, name="gang")] + [pod(1, name=f"w{i}") for i in range(8)]
    by_demand = make_policy("fgd-strand", reserve_empty=1, stranding_weight=0.0, reserve_expected=True)
    by_demand.prepare(state, workload)
    kept = by_demand._protected_nodes(state)  # type: ignore[attr-defined]
    assert kept is not None and kept.tolist() == [True, False, False]
    # The rule that counts nodes with untouched devices sees two left, more than the one it keeps.
    untouched = make_policy("fgd-strand", reserve_empty=1, stranding_weight=0.0)
    untouched.prepare(state, workload)
    assert untouched._protected_nodes(state) is None  # type: ignore[attr-defined]
    # A pod that would take what the gang needs is priced off the kept node; one that leaves
    # room for it is not.
    small = pod(1, cpu_milli=1_000)
    choice = by_demand.place(small, state, random.Random(0))
    assert isinstance(choice, Choice) and state.nodes[choice.node].name != "rich-b"
    kept_node = ClusterState([node("rich", devices=8, cpu_milli=128_000, memory_mib=1 << 20)])
    scores = []
    for penalty in (1000.0, 0.0):
        options = {"reserve_empty": 1, "stranding_weight": 0.0, "reserve_penalty_milli": penalty}
        policy = make_policy("fgd-strand", reserve_expected=True, **options)
        policy.prepare(kept_node, workload)
        assert isinstance(policy.place(pod(0), kept_node, random.Random(0)), Choice)  # sets the reserve
        light, heavy = (
            policy.rank(pod(0, cpu_milli=cpu), kept_node, np.array([0]), np.zeros(1))  # type: ignore[attr-defined]
            for cpu in (4_000, 16_000)
        )
        scores.append((light[0], heavy[0]))
    assert scores[0][0] > scores[0][1]  # 16 cores would leave 112 of the 120 the gang needs
    assert scores[1][0] == scores[1][1]
