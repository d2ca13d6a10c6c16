"""The submit-time capacity check (services/specs.py) and the listing filters (services/listing.py)."""

from __future__ import annotations

import pytest

from factories import node
from gpupool.api.workloads import WorkloadSpec
from gpupool.core.model import Device, Node
from gpupool.errors import InvalidInput, UnknownName
from gpupool.server.services.listing import words
from gpupool.server.services.specs import MAX_SHAPES, CapacityCache, PoolCapacity, check_fits

H100 = "H100-SXM-80GB"


def spec(**resources: object) -> WorkloadSpec:
    return WorkloadSpec.model_validate({"command": ["true"], "resources": resources})


def test_dominated_shapes_are_dropped_and_the_combination_is_checked() -> None:
    pool = PoolCapacity.of([
        node("a", devices=8, model=H100, cpu_milli=2000, memory_mib=16384, device_memory_mib=81920),
        node("b", devices=8, model=H100, cpu_milli=1000, memory_mib=8192, device_memory_mib=81920),
        node("c", devices=1, model=H100, cpu_milli=64000, memory_mib=524288, device_memory_mib=81920),
    ])
    shapes = [(s.cpu_milli, s.describe()) for s in pool.shapes]
    assert shapes == [(2000, f"8 x {H100}"), (64000, f"1 x {H100}")]  # b is dominated by a
    check_fits(spec(gpus=8, cpu=2), pool)
    check_fits(spec(gpus=1, cpu=64), pool)
    with pytest.raises(InvalidInput, match=r"^No single node has all one replica asks for \(8 devices, 3 "):
        check_fits(spec(gpus=8, cpu=3), pool)


def test_mixed_models_on_one_node_and_memory_per_model() -> None:
    h100s = node("m", devices=4, model=H100, device_memory_mib=81920).devices
    t4s = tuple(Device(uuid=f"t{i}", model="T4", index=4 + i, memory_mib=16384) for i in range(4))
    mixed = Node(name="m", cpu_milli=64000, memory_mib=262144, devices=h100s + t4s)
    pool = PoolCapacity.of([mixed])
    check_fits(spec(gpus=8), pool)  # any model: 4 + 4 on one node
    check_fits(spec(gpus=4, gpu_memory="20GiB"), pool)  # only the H100s have 20 GiB
    with pytest.raises(InvalidInput, match=r"^No node has 5 devices with 20GiB: the largest has 4; "):
        check_fits(spec(gpus=5, gpu_memory="20GiB"), pool)
    named = check_fits(spec(gpus=1, models=["t4", "NVIDIA H100 80GB HBM3"]), pool)
    assert named.resources.models == [H100, "T4"]


def test_models_resolve_against_profiles_when_the_pool_is_empty() -> None:
    empty = PoolCapacity.of([])
    assert check_fits(spec(gpus=64, models=["h100"]), empty).resources.models == [H100]  # nothing to check
    with pytest.raises(UnknownName, match="Unknown device model 'H1OO'"):
        check_fits(spec(models=["H1OO"]), empty)


def test_many_shapes_fall_back_to_the_maxima() -> None:
    nodes = [node(f"n{i}", devices=1 + i % 8, cpu_milli=1000 * (100 - i), memory_mib=1024 * (1 + i))
             for i in range(MAX_SHAPES + 8)]
    pool = PoolCapacity.of(nodes)
    assert len(pool.shapes) == 1
    check_fits(spec(gpus=8, cpu=100), pool)  # not held by any one node, but within every maximum


def test_the_summary_is_cached_per_node_list() -> None:
    cache = CapacityCache()
    nodes = (node("a", devices=2), node("b", devices=4))
    first = cache.get(nodes)
    assert cache.get(nodes) is first and cache.get(tuple(list(nodes))) is first  # equal: kept
    assert cache.get((node("a", devices=2),)) is not first


def test_filter_words() -> None:
    assert words(["succeeded,FAILED", " failed ", "", "Team-A"]) == ["succeeded", "failed", "team-a"]
    with pytest.raises(InvalidInput):
        words(["x" * 65])
