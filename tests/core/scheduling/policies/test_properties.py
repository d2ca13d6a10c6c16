"""Invariants every placement policy keeps, on random clusters and pod streams (hypothesis)."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import POLICY_NAMES, node, pod, workload
from gpupool.core.scheduling.gang import place_gang
from gpupool.core.scheduling.policies.base import Choice, NoFit, make_policy
from gpupool.core.state import ClusterState

POLICIES = list(POLICY_NAMES)

clusters = st.lists(
    st.tuples(st.integers(0, 8), st.integers(1, 16), st.sampled_from(["A", "B"])), min_size=1, max_size=5
).map(
    lambda specs: [node(f"n{i}", devices=d, cpu_milli=c * 4000, model=m) for i, (d, c, m) in enumerate(specs)]
)
pods = st.lists(
    st.tuples(
        st.sampled_from([0, 0.1, 0.25, 0.5, 0.75, 1, 2, 4]),
        st.integers(0, 12),
        st.sampled_from([frozenset(), frozenset({"A"}), frozenset({"B"})]),
    ),
    min_size=1,
    max_size=25,
).map(
    lambda specs: [
        pod(g, cpu_milli=c * 1000, memory_mib=512, models=m, name=f"p{i}")
        for i, (g, c, m) in enumerate(specs)
    ]
)


def run(name: str, nodes: list, stream: list, seed: int) -> tuple[list, ClusterState]:
    state = ClusterState(nodes)
    policy = make_policy(name)
    policy.prepare(state, stream)
    rng = random.Random(seed)
    decisions = []
    for p in stream:
        choice = policy.place(p, state, rng)
        if isinstance(choice, Choice):
            assert state.node_fits(p)[choice.node]
            state.allocate(state.make_alloc(p, choice.node, choice.devices))  # raises on over-allocation
            decisions.append((choice.node, choice.devices))
        else:
            assert not state.node_fits(p).any()
            decisions.append(None)
        state.check_invariants()
    return decisions, state


@settings(max_examples=15, deadline=None)
@given(clusters, pods, st.integers(0, 1000))
def test_no_over_allocation_and_same_seed_same_result(nodes: list, stream: list, seed: int) -> None:
    for name in POLICIES:
        first, state = run(name, nodes, stream, seed)
        assert (state.dev_milli_free >= 0).all() and (state.cpu_free >= 0).all()
        assert (state.mem_free >= 0).all() and (state.dev_mem_free >= 0).all()
        again, _ = run(name, nodes, stream, seed)
        assert first == again


@settings(max_examples=15, deadline=None)
@given(clusters, st.lists(st.sampled_from([0.5, 1, 2, 4]), min_size=2, max_size=6), st.integers(0, 100))
def test_gangs_are_all_or_nothing(nodes: list, sizes: list, seed: int) -> None:
    for name in POLICIES:
        state = ClusterState(nodes)
        gang = workload(*(pod(g, name=f"g{i}") for i, g in enumerate(sizes)))
        before = (state.dev_milli_free.copy(), state.cpu_free.copy(), state.mem_free.copy())
        result = place_gang(gang, state, make_policy(name), random.Random(seed))
        if isinstance(result, NoFit):
            assert np.array_equal(before[0], state.dev_milli_free)
            assert np.array_equal(before[1], state.cpu_free)
            assert np.array_equal(before[2], state.mem_free)
        else:
            assert len(result.allocs) == len(sizes)
            placed = sum(sum(a.device_milli) for _, a in result.allocs)
            assert placed == sum(p.total_device_milli for p in gang.pods)
        state.check_invariants()
