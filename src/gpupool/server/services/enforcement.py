"""Which limits a node enforces, layer by layer, and which of a pod's limits it cannot.

A limit the node cannot enforce is never silent: `gpupool node ls` shows each node's layers as
enforced, advisory (set up for the pod, but a hostile pod can step past it) or unenforced, once for
the node rather than as an event on every workload placed there; `gpupool show` derives from its
nodes' layers which of a workload's own limits do not hold (`not enforced: ...`, cli/show.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from gpupool.core.model import Node
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
