"""Slices as Ray custom resources: per device of a node, exact amounts, nothing for Ray to choose."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="the ray provider needs Ray (pip install 'gpupool[ray]')")

from gpupool.core.model import Slice
from gpupool.providers.nodespec import nodes_from_spec
from gpupool.providers.ray.resources import (
    POD_UNITS,
    compute_resource,
    memory_resource,
    node_resources,
    pod_bundle,
    pods_resource,
    slice_resources,
)


def test_a_node_advertises_compute_and_memory_per_device_and_no_gpus() -> None:
    node = nodes_from_spec("1x2xT4")[0]
    resources = node_resources(node)
    assert resources == {pods_resource(node.name): POD_UNITS,
                         compute_resource(node.name, 0): 1000.0, memory_resource(node.name, 0): 16384.0,
                         compute_resource(node.name, 1): 1000.0, memory_resource(node.name, 1): 16384.0}
    assert "GPU" not in resources


def test_a_pod_holds_exactly_its_slices_of_the_chosen_devices() -> None:
    held = slice_resources("n1", (Slice(1, 250, 4096), Slice(0, 1000, 0)), memory_known={0, 1})
    assert held == {compute_resource("n1", 1): 250.0, memory_resource("n1", 1): 4096.0,
                    compute_resource("n1", 0): 1000.0}


def test_names_of_two_nodes_never_meet() -> None:
    assert compute_resource("a", 0) != compute_resource("b", 0)
    assert compute_resource("odd name/x", 0) == "gpupool_odd_name_x_0_milli"


def test_a_pods_group_bundle_holds_its_slices_and_one_pod_unit_of_its_node_only() -> None:
    assert pod_bundle("n1", (Slice(0, 250, 0),), memory_known={0}) == {compute_resource("n1", 0): 250.0,
                                                                        pods_resource("n1"): 1.0}
    assert pod_bundle("n2", (), memory_known=set()) == {pods_resource("n2"): 1.0}  # pinned, even slice-less
