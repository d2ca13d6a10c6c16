"""Ray custom resources that stand for gpupool slices: one compute and one memory resource per device.

A node advertises `gpupool_<node>_<index>_milli` = 1000 and `gpupool_<node>_<index>_mib` = the
device's memory for each device, and no Ray GPUs. A pod's actor asks for exactly its slices' amounts
of the resources of the devices gpupool chose, so Ray cannot place it on any other device or node.
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


def node_resources(node: Node) -> dict[str, float]:
    """What a Ray worker node advertises for `node`'s devices (its --resources)."""
    resources: dict[str, float] = {}
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
