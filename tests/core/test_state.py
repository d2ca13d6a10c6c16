"""ClusterState: checked allocations, statements and feasibility masks."""

from __future__ import annotations

import random

import pytest

from factories import cluster, node, pod, workload
from gpupool.core.model import Reason
from gpupool.core.scheduling.gang import place_gang
from gpupool.core.scheduling.policies.base import NoFit, make_policy
from gpupool.core.state import ClusterState
from gpupool.errors import OverAllocation


def test_fractional_allocation_updates_free_capacity() -> None:
    state = ClusterState([node("a", devices=2)])
    p = pod(0.25, device_memory_mib=4096)
    record = state.make_alloc(p, 0, [1])
    state.allocate(record)
    assert state.dev_milli_free[0].tolist() == [1000, 750]
    assert state.dev_mem_free[0, 1] == 32768 - 4096
    assert state.allocated_device_milli == 250
    state.release(record)
    assert state.allocated_device_milli == 0


def test_whole_device_needs_an_untouched_device() -> None:
    state = ClusterState([node("a", devices=2)])
    state.allocate(state.make_alloc(pod(0.1), 0, [0]))
    assert state.device_fits(pod(1)).tolist() == [[False, True]]
    assert state.node_fits(pod(2)).tolist() == [False]


def test_over_allocation_raises_and_changes_nothing() -> None:
    state = ClusterState([node("a", devices=1, cpu_milli=2000)])
    state.allocate(state.make_alloc(pod(0.6, cpu_milli=1000), 0, [0]))
    before = state.dev_milli_free.copy()
    with pytest.raises(OverAllocation):
        state.allocate(state.make_alloc(pod(0.6, cpu_milli=500), 0, [0]))
    with pytest.raises(OverAllocation):
        state.allocate(state.make_alloc(pod(0.1, cpu_milli=1500), 0, [0]))
    assert (state.dev_milli_free == before).all()
    state.check_invariants()


def test_release_of_unheld_resources_raises() -> None:
    state = ClusterState([node("a", devices=1)])
    record = state.make_alloc(pod(0.5), 0, [0])
    with pytest.raises(OverAllocation):
        state.release(record)


def test_gang_is_all_or_nothing() -> None:
    state = ClusterState(cluster(2, devices=2))
    policy = make_policy("first-fit")
    too_big = workload(pod(2), pod(2), pod(1))
    result = place_gang(too_big, state, policy, random.Random(0))
    assert isinstance(result, NoFit)
    assert result.reason == Reason.GANG_INCOMPLETE
    assert state.allocated_device_milli == 0
    fits = workload(pod(2), pod(2))
    placed = place_gang(fits, state, policy, random.Random(0))
    assert not isinstance(placed, NoFit)
    assert {p.node for p in placed.placements(state)} == {"n000", "n001"}


def test_allowed_models_restrict_devices() -> None:
    state = ClusterState([node("a", model="T4"), node("b", model="V100M32")])
    assert state.node_fits(pod(1, models=frozenset({"V100M32"}))).tolist() == [False, True]
    assert not state.node_fits(pod(1, models=frozenset({"A100"}))).any()
