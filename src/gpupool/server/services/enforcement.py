"""Which limits a node enforces, layer by layer, and which of a pod's limits it cannot.

A limit the node cannot enforce is never silent: `gpupool nodes ls` shows each node's layers as
enforced, advisory (set up for the pod, but a hostile pod can step past it) or unenforced, and a
workload placed on a real node where one of its limits does not hold gets an event
(`limits_unenforced`) naming the limit and the node, which `gpupool show` prints. A simulated node
enforces nothing, ever: it says so once (node ls), and `gpupool show` derives the same sentences
from its layers (cli/show.py mirrors `unenforced`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from gpupool.core.model import Node, PodRequest
from gpupool.core.units import MILLI
from gpupool.providers.base import Capability


class Level(StrEnum):
    ENFORCED = "enforced"
    ADVISORY = "advisory"
    """Set up for every pod, but only a cooperating pod keeps to it."""
    UNENFORCED = "unenforced"


@dataclass(frozen=True, slots=True)
class LayerState:
    layer: str
    enforced: bool
    detail: str
    level: Level = Level.UNENFORCED

    def __post_init__(self) -> None:
        if self.enforced and self.level is not Level.ENFORCED:
            object.__setattr__(self, "level", Level.ENFORCED)


ACCOUNTS = "accounts"
DEVICES = "devices"
DEVICE_LIMITS = "device_limits"
HOST_LIMITS = "host_limits"
PROC = "proc"
NETWORK = "network"


def node_layers(node: Node, missing: Mapping[Capability, str]) -> list[LayerState]:
    """What the node enforces for a pod: its account, its devices, its device share, its host share,
    that it cannot see other accounts' processes, and that its network reaches only its tenant's
    pods and the pool's services."""
    simulated = any(d.simulated for d in node.devices)
    if Capability.REAL_PROCESSES in missing:
        why = missing[Capability.REAL_PROCESSES]
        return [LayerState(layer, False, why)
                for layer in (ACCOUNTS, DEVICES, DEVICE_LIMITS, HOST_LIMITS, PROC, NETWORK)]
    accounts = LayerState(ACCOUNTS, Capability.USER_ISOLATION not in missing,
                          missing.get(Capability.USER_ISOLATION, "pods run as their tenant's Unix account"))
    if simulated:
        devices = LayerState(DEVICES, False, "simulated devices: there is no device to hide or share")
        device_limits = LayerState(DEVICE_LIMITS, False, "simulated devices: compute and memory shares "
                                   "are accounted, not enforced")
    else:
        # No device cgroup rules are set: the variables steer a pod's runtime, not its open() calls.
        devices = LayerState(DEVICES, False, "advisory: pods are given only their devices (visible-devices "
                             "variables), but no device cgroup rules stop a process that opens the others",
                             Level.ADVISORY)
        device_limits = LayerState(DEVICE_LIMITS, Capability.MPS not in missing,
                                   missing.get(Capability.MPS, "CUDA MPS caps compute and memory per pod"))
    host = LayerState(HOST_LIMITS, Capability.CGROUPS not in missing,
                      missing.get(Capability.CGROUPS, "cgroup v2 caps cpu and memory per pod"))
    network = LayerState(NETWORK, Capability.NETWORK_ISOLATION not in missing, missing.get(
        Capability.NETWORK_ISOLATION, "a network namespace per pod: it reaches its tenant's pods, the pool's "
        "API server and the node's declared networks"))
    return [accounts, devices, device_limits, host, _proc(missing), network]


def _proc(missing: Mapping[Capability, str]) -> LayerState:
    """hidepid=2 on /proc hides other accounts' processes, which is no help to pods that all run as
    the agent's one account."""
    if Capability.HIDDEN_PROCESSES in missing:
        return LayerState(PROC, False, missing[Capability.HIDDEN_PROCESSES])
    if Capability.USER_ISOLATION in missing:
        return LayerState(PROC, False, "/proc hides other accounts' processes (hidepid=2), but pods run "
                          "as the agent's own account, so they see each other's and the server's")
    return LayerState(PROC, True, "/proc is mounted hidepid=2: a pod sees only its own account's processes")


def limits_asked(request: PodRequest) -> tuple[bool, bool]:
    """(asks for a share of a device, asks for host cpu or memory): the limits a node must hold."""
    shares = bool(request.num_devices and (request.device_milli < MILLI or request.device_memory_mib))
    return shares, bool(request.cpu_milli or request.memory_mib)


def unenforced(node: Node, layers: list[LayerState], request: PodRequest) -> list[str]:
    """One sentence per limit of `request` that `node` does not enforce (empty when all hold). The
    accounts layer is left out: a pool whose agent cannot change users says so once, at start-up."""
    by_layer = {state.layer: state for state in layers}
    sentences = []
    shares, host = limits_asked(request)
    if shares and not by_layer[DEVICE_LIMITS].enforced:
        sentences.append(f"device compute and memory limits are not enforced on node {node.name}: "
                         f"{by_layer[DEVICE_LIMITS].detail}")
    if host and not by_layer[HOST_LIMITS].enforced:
        sentences.append(f"host cpu and memory limits are not enforced on node {node.name}: "
                         f"{by_layer[HOST_LIMITS].detail}")
    return sentences
