"""API models for nodes, their devices, and the pool summary."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from gpupool.api.common import Strict


class NodeState(StrEnum):
    READY = "ready"
    CORDONED = "cordoned"
    DRAINING = "draining"
    """cordoned, and work placed before the drain still runs there"""
    DRAINED = "drained"
    """cordoned by a drain, with nothing left running"""
    UNHEALTHY = "unhealthy"
    """the node, or one or more of its devices, is unhealthy (`unhealthy_devices` says which)"""
    LOST = "lost"
    """the store knows the node (pods or flags there) but the provider no longer lists it"""


class HeldSliceOut(Strict):
    workload: str
    name: str = Field("", description="the workload's name (may be empty)")
    tenant: str
    compute_milli: int
    memory_mib: int


class DeviceOut(Strict):
    uuid: str
    model: str
    index: int
    memory_mib: int
    kind: str
    healthy: bool
    simulated: bool
    allocated_milli: int
    allocated_memory_mib: int
    injected_fault: bool = Field(False, description="an admin injected a fault here (gpupool node fail)")
    held: list[HeldSliceOut] = Field(
        default_factory=list,
        description="the slices active pods hold here, by workload; a tenant's token sees only its own "
                    "(allocated_milli minus these is held by other tenants)")


class LayerOut(Strict):
    layer: str = Field(description="accounts, devices, device_limits, host_limits or proc")
    enforced: bool = Field(description="true only when the layer is enforced (level 'enforced')")
    level: str = Field("unenforced", description="enforced; advisory (set up for every pod, but a process "
                       "of the pod can step past it); or unenforced")
    detail: str = Field(description="how it is enforced here, or why it is not")


class NodeOut(Strict):
    name: str
    state: NodeState = Field(NodeState.READY,
                             description="ready, cordoned, draining, drained, unhealthy or lost")
    cpu_milli: int
    memory_mib: int
    healthy: bool
    unhealthy_devices: list[int] = Field(default_factory=list,
                                         description="indexes of its unhealthy devices")
    injected_fault: bool = Field(False, description="an admin injected a whole-node fault (node fail)")
    cordoned: bool
    draining: bool
    simulated: bool = Field(description="true when any of its devices is simulated")
    labels: dict[str, str]
    devices: list[DeviceOut]
    allocated_cpu_milli: int
    allocated_memory_mib: int
    enforcement: list[LayerOut] = Field(default_factory=list,
                                        description="which of a pod's limits this node enforces")
    containers: str = Field(default="", description=(
        "what runs `--image` pods here ('crun 1.8.1'), or 'none: ' and why nothing does"))


class ModelUsage(Strict):
    model: str
    devices: int
    simulated: bool
    allocated_gpus: float
    utilisation: float = Field(description="allocated device share over capacity, 0..1")


class TenantUsage(Strict):
    tenant: str
    allocated_gpus: float
    running: int
    pending: int


class PoolSummary(Strict):
    simulated: bool
    nodes: int
    devices: int
    capacity_gpus: float
    allocated_gpus: float
    utilisation: float
    by_model: list[ModelUsage]
    by_tenant: list[TenantUsage]
    workloads: dict[str, int]
    fabric: bool = Field(False, description="the pool knows its InfiniBand fabric (GET /fabric answers)")
    federation: bool = Field(default=False, description="a federation hub answers (GET /federation/members "
                             "lists its members' capacity, queues and prices)")
    federation_fence_s: float | None = Field(default=None, description=(
        "as a federation member: the hub's work is held after this long without a call from it"))
    router: str = Field(default="", description="which router serves services: haproxy, or in-process "
                        "with why (haproxy not installed, or chosen); '' without --serve-port")
