"""Ray custom resources that stand for gpupool slices: one compute and one memory resource per device.

A node advertises `gpupool_<node>_<index>_milli` = 1000 and `gpupool_<node>_<index>_mib` = the
device's memory for each device, `gpupool_<node>_pods` (one unit per pod carried) and no Ray GPUs.
A pod's carrier asks for exactly its slices' amounts of the resources of the devices gpupool chose
(and one pod unit of its node, so even a pod without a slice is pinned), so Ray cannot place it on
any other device or node.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpupool.core.model import Node, Slice
from gpupool.core.units import MILLI

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _stem(node: str, index: int) -> str:
    return f"gpupool_{_UNSAFE.sub('_', node)}_{index}"


def compute_resource(node: str, index: int) -> str:
    return _stem(node, index) + "_milli"


def memory_resource(node: str, index: int) -> str:
    return _stem(node, index) + "_mib"


POD_UNITS = 100_000.0
"""How many pods one node may carry at once, as far as Ray counts (gpupool's scheduler decides)."""


def pods_resource(node: str) -> str:
    return f"gpupool_{_UNSAFE.sub('_', node)}_pods"


def node_resources(node: Node) -> dict[str, float]:
    """What a Ray worker node advertises for `node`'s devices (its --resources)."""
    resources: dict[str, float] = {pods_resource(node.name): POD_UNITS}
    for device in node.devices:
        resources[compute_resource(node.name, device.index)] = float(MILLI)
        if device.memory_mib:
            resources[memory_resource(node.name, device.index)] = float(device.memory_mib)
    return resources


def slice_resources(node: str, slices: Sequence[Slice], memory_known: set[int]) -> dict[str, float]:
    """What a pod's actor holds for `slices` on `node` (`memory_known`: the indices of devices that
    advertise memory; a slice of a device of unknown memory holds its compute only)."""
    held: dict[str, float] = {}
    for piece in slices:
        name = compute_resource(node, piece.device_index)
        held[name] = held.get(name, 0.0) + float(piece.compute_milli)
        if piece.memory_mib and piece.device_index in memory_known:
            name = memory_resource(node, piece.device_index)
            held[name] = held.get(name, 0.0) + float(piece.memory_mib)
    return {k: v for k, v in held.items() if v > 0}


def pod_bundle(node: str, slices: Sequence[Slice], memory_known: set[int]) -> dict[str, float]:
    """A pod's placement group bundle: its slices' resources and one pod unit of its node."""
    return {**slice_resources(node, slices, memory_known), pods_resource(node): 1.0}
