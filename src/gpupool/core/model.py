"""The pure domain model: nodes, devices, slices, pods, workloads and cluster snapshots."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpupool.core.topology_spec import TopologySpec
from gpupool.core.units import MILLI
from gpupool.errors import InvalidInput

UNKNOWN_MEMORY_MIB = 0
"""A device whose memory size is not known (OpenB's anonymised models): memory is not constrained."""


class DeviceKind(StrEnum):
    GPU = "gpu"
    NPU = "npu"
    DCU = "dcu"


class WorkloadStatus(StrEnum):
    PENDING = "pending"
    ADMITTED = "admitted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in (WorkloadStatus.SUCCEEDED, WorkloadStatus.FAILED, WorkloadStatus.CANCELLED)


class Reason(StrEnum):
    """Machine-readable reasons carried by the cycle's decisions (rejections, preemptions, evictions).

    What each means, and what a user can do about it, is in `gpupool.api.reasons.CATALOGUE`."""

    NO_NODE_FITS = "no_node_fits"
    INSUFFICIENT_CPU = "insufficient_cpu"
    INSUFFICIENT_MEMORY = "insufficient_memory"
    INSUFFICIENT_DEVICES = "insufficient_devices"
    NO_ALLOWED_MODEL = "no_allowed_model"
    GANG_INCOMPLETE = "gang_incomplete"
    QUOTA_EXCEEDED = "quota_exceeded"
    NEVER_FITS = "never_fits"
    PREEMPTED = "preempted"
    EVICTED_UNHEALTHY = "evicted_unhealthy"
    BACKFILL_BLOCKED = "backfill_blocked"
    WAITING_FOR_HEAD = "waiting_for_head"
    RECLAIMED = "reclaimed"
    UNKNOWN_PRIORITY_CLASS = "unknown_priority_class"
    UNKNOWN_QUEUE = "unknown_queue"
    BUDGET_EXHAUSTED = "budget_exhausted"
    WAITING_FOR_LOCALITY = "waiting_for_locality"
    NO_DOMAIN_FITS = "no_domain_fits"
    MOVED_FOR_LOCALITY = "moved_for_locality"
    CONGESTION_MOVED = "congestion_moved"
    """Its bottleneck link stayed congested (`Policies.migrate`): stopped and requeued (kind migrate)."""
    SERVING_HEADROOM = "serving_headroom"
    """Starting it would take the room the pool keeps free for its services (`Policies.headroom`)."""


@dataclass(frozen=True, slots=True)
class IbPort:
    """One InfiniBand port of a node's HCA."""

    hca: str
    port: int
    lid: int = 0
    guid: str = ""
    rate_gbps: float = 0.0
    state: str = ""


MAX_SIMULATED_NODE_DEVICES = 64
"""The most devices one simulated node is given (a node spec's DEVICES, a node file's gpu column):
well above any real server's, and what stops a typo from building devices until memory runs out."""


@dataclass(frozen=True, slots=True)
class Device:
    """One physical accelerator on a node."""

    uuid: str
    model: str
    index: int
    memory_mib: int = UNKNOWN_MEMORY_MIB
    kind: DeviceKind = DeviceKind.GPU
    healthy: bool = True
    simulated: bool = False


@dataclass(frozen=True, slots=True)
class Node:
    """A server: its host resources, its devices and its IB ports."""

    name: str
    cpu_milli: int
    memory_mib: int
    devices: tuple[Device, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    ib_ports: tuple[IbPort, ...] = ()
    healthy: bool = True
    cordoned: bool = False

    @property
    def schedulable(self) -> bool:
        return self.healthy and not self.cordoned

    @property
    def device_models(self) -> frozenset[str]:
        return frozenset(d.model for d in self.devices)


@dataclass(frozen=True, slots=True)
class Slice:
    """A share of one device: compute_milli (1000 = the whole device) and memory_mib."""

    device_index: int
    compute_milli: int
    memory_mib: int = 0


Labels = frozenset[tuple[str, str | None]]
"""Node labels a pod requires: (key, None) for the key with any value, (key, value) for that value."""


@dataclass(frozen=True, slots=True)
class PodRequest:
    """One process group's request.

    Either `num_devices` whole devices (device_milli == 1000) or one fractional slice
    (num_devices == 1, device_milli < 1000). `device_memory_mib` is per device; 0 means the pod
    names no memory (a whole device still takes all of its memory).
    """

    name: str
    cpu_milli: int = 0
    memory_mib: int = 0
    num_devices: int = 0
    device_milli: int = 0
    device_memory_mib: int = 0
    allowed_models: frozenset[str] = frozenset()
    memory_share_milli: int = 0
    """A fractional pod without `device_memory_mib`, under proportional defaults, holds this share
    of its device's memory (milli); 0 means its compute share, `device_milli`. Only oversubscription
    sets it (a guaranteed part whose compute and memory ratios differ)."""
    node_labels: Labels = frozenset()
    """Labels a node must carry to take the pod: (key, None) asks for the key with any value,
    (key, value) for that value (Slurm's --constraint, Kubernetes' nodeSelector); empty: any node."""

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.device_memory_mib < 0:
            raise InvalidInput(f"Pod {self.name!r}: cpu, memory and device memory must be >= 0.")
        if self.num_devices < 0:
            raise InvalidInput(f"Pod {self.name!r}: num_devices must be >= 0.")
        if self.num_devices == 0 and self.device_milli != 0:
            raise InvalidInput(f"Pod {self.name!r}: device_milli needs num_devices >= 1.")
        if self.num_devices >= 1 and not 1 <= self.device_milli <= MILLI:
            raise InvalidInput(
                f"Pod {self.name!r}: device_milli must be 1..1000 per device, got {self.device_milli}."
            )
        if not 0 <= self.memory_share_milli <= MILLI:
            raise InvalidInput(f"Pod {self.name!r}: memory_share_milli must be 0..1000.")
        if self.num_devices > 1 and self.device_milli != MILLI:
            raise InvalidInput(
                f"Pod {self.name!r}: a pod with {self.num_devices} devices must take whole devices "
                "(device_milli 1000); only a single-device pod may ask for a fraction."
            )

    @property
    def is_fractional(self) -> bool:
        return self.num_devices == 1 and self.device_milli < MILLI

    @property
    def total_device_milli(self) -> int:
        return self.num_devices * self.device_milli

    def allows(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models


def shared_labels(pods: Iterable[PodRequest]) -> Labels:
    """The node labels every one of `pods` requires (a workload's pods share them as submitted)."""
    sets = [p.node_labels for p in pods]
    return frozenset.intersection(*sets) if sets else frozenset()


def label_text(labels: Iterable[tuple[str, str | None]]) -> str:
    """Labels as a user writes them: `KEY` or `KEY=VALUE`, comma-separated, sorted."""
    return ", ".join(sorted(k if v is None else f"{k}={v}" for k, v in labels))


def labels_match(wanted: Iterable[tuple[str, str | None]], labels: Mapping[str, str]) -> bool:
    """Whether `labels` carry every wanted key (and its value, where one is named)."""
    return all(k in labels and (v is None or labels[k] == v) for k, v in wanted)


@dataclass(frozen=True, slots=True)
class SliceDefaults:
    """What a pod holds of the amounts its request leaves at 0 (Slurm's DefCpuPerGPU, DefMemPerGPU).

    - device memory: a fractional pod without `device_memory_mib` holds, when
      `proportional_device_memory`, floor(device memory * its share / 1000) of the device it lands
      on (0.25 of an 80 GiB device: 20 GiB). Floor, not ceil, so that shares whose compute fits a
      device always fit its memory too (four 0.25 slices of an 81,559 MiB device). A device of
      unknown memory (UNKNOWN_MEMORY_MIB) gives 0, as does `proportional_device_memory=False`.
    - cpu and host memory of a pod with devices: `cpu_milli_per_device` / `memory_mib_per_device`
      times the devices it takes (a fraction counts as its share), or, when None, the node's
      per-device share: floor(node total * devices taken / devices of the node). A pod without
      devices keeps 0.

    The scalar methods here are the reference; `ClusterState` computes the same amounts vectorised.
    """

    proportional_device_memory: bool = True
    cpu_milli_per_device: int | None = None
    memory_mib_per_device: int | None = None

    def __post_init__(self) -> None:
        for value in (self.cpu_milli_per_device, self.memory_mib_per_device):
            if value is not None and value < 0:
                raise InvalidInput("Default cpu and memory per device must be >= 0.")

    def device_memory_mib(self, pod: PodRequest, device: Device) -> int:
        """Device memory one of the pod's shares holds on `device` (whole devices: all of it)."""
        if not pod.is_fractional:
            return pod.device_memory_mib or device.memory_mib if pod.num_devices else 0
        if pod.device_memory_mib or not self.proportional_device_memory:
            return pod.device_memory_mib
        return device.memory_mib * (pod.memory_share_milli or pod.device_milli) // MILLI

    def cpu_milli(self, pod: PodRequest, node: Node) -> int:
        """Host cpu the pod holds on `node`."""
        return _host_default(pod, pod.cpu_milli, self.cpu_milli_per_device, node.cpu_milli, node)

    def memory_mib(self, pod: PodRequest, node: Node) -> int:
        """Host memory the pod holds on `node`."""
        return _host_default(pod, pod.memory_mib, self.memory_mib_per_device, node.memory_mib, node)


NO_DEFAULTS = SliceDefaults(proportional_device_memory=False, cpu_milli_per_device=0, memory_mib_per_device=0)
"""A pod holds exactly what it names (0 where it names nothing): the behaviour before defaults."""


def _host_default(pod: PodRequest, asked: int, per_device: int | None, node_total: int, node: Node) -> int:
    if asked or not pod.num_devices:
        return asked
    if per_device is not None:
        return per_device * pod.total_device_milli // MILLI
    if not node.devices:
        return 0
    return node_total * pod.total_device_milli // (len(node.devices) * MILLI)


@dataclass(frozen=True, slots=True)
class Workload:
    """What a user submits: one or more pods placed all-or-nothing (a gang)."""

    id: str
    pods: tuple[PodRequest, ...]
    tenant: str = "default"
    queue: str = "default"
    priority: int = 0
    priority_class: str = "normal"
    submit_time_s: float = 0.0
    name: str = ""
    runtime_estimate_s: float | None = None
    checkpoint_interval_s: float | None = None
    topology: TopologySpec | None = None
    """Where its pods may go in the fabric (`core.topology_spec`); None: the pool's default for
    multi-pod gangs (single-pod and fractional work is never constrained)."""
    spread_key: str = ""
    """Workloads of one key (a service's replicas) prefer nodes none of the others holds: placed
    there when it fits, anywhere otherwise (`scheduling.spread`); '' for none."""
    pair_key: str = ""
    """The spread key of a paired service (a prefill service's decode partner, or the reverse): its
    replicas prefer the leaf, then the spine, of the partner's replicas (`scheduling.pairing`)."""

    def __post_init__(self) -> None:
        if not self.pods:
            raise InvalidInput(f"Workload {self.id!r} has no pods; give it at least one.")
        names = [p.name for p in self.pods]
        if len(set(names)) != len(names):
            raise InvalidInput(f"Workload {self.id!r} has duplicate pod names: {names}.")

    @property
    def total_device_milli(self) -> int:
        return sum(p.total_device_milli for p in self.pods)


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """Where one pod goes: a node, the device slices it takes there and the host share it holds.

    `slices` carry the device memory actually held (a default slice's proportional share
    included); `cpu_milli` and `memory_mib` are the host resources actually held (the request's, or
    the `SliceDefaults` share when it named none). 0 there means "not recorded": whoever rebuilds
    the allocation takes the pod's own request (placements stored before the effective amounts were).
    """

    pod: str
    node: str
    slices: tuple[Slice, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0

    def held_host(self, pod: PodRequest) -> tuple[int, int]:
        """(cpu_milli, memory_mib) the placed pod holds: the recorded amounts, else its request."""
        return self.cpu_milli or pod.cpu_milli, self.memory_mib or pod.memory_mib


@dataclass(frozen=True, slots=True)
class Allocation:
    """A placed (running or admitted) workload as seen by a snapshot."""

    workload: Workload
    placements: tuple[PodPlacement, ...]
    start_time_s: float = 0.0


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    """What the caller remembers about a workload across cycles (history kept outside the core).

    `attained_service_s` is device-seconds received so far (least-attained-service ordering);
    `progress_s` is work kept from earlier runs (checkpoints) so the current run needs less;
    `runtime_estimate_s` is a history-based estimate used when the user gave none;
    `moves` is how many times it was moved for another gang's locality or its own
    (`moves.plan_moves`), the last at `moved_s`; `congestion_moves` how many times it was moved off
    a congested link (`MigrateRule.max_moves_each` bounds it).
    """

    attained_service_s: float = 0.0
    progress_s: float = 0.0
    runtime_estimate_s: float | None = None
    moves: int = 0
    moved_s: float | None = None
    congestion_moves: int = 0


@dataclass(frozen=True, slots=True)
class AllocationChanges:
    """How a snapshot's allocations differ from those of the snapshot numbered `serial - 1` (handed
    to the same `ViewKeeper`): the objects that left (`ended`) and joined (`started`, in the order
    the snapshot lists them); every other object is listed in both. A workload's new allocation
    ends its old one (both lists hold it)."""

    serial: int
    started: tuple[Allocation, ...] = ()
    ended: tuple[Allocation, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """Everything the scheduler may look at: the nodes and what is already placed on them."""

    nodes: tuple[Node, ...]
    allocations: tuple[Allocation, ...] = ()
    workload_info: Mapping[str, WorkloadInfo] = field(default_factory=dict)
    changes: AllocationChanges | None = field(default=None, compare=False)
    """What changed since the snapshot before, when the caller knows it (optional: a `ViewKeeper`
    reads it instead of comparing every allocation; without it, or when it does not follow the
    snapshot the keeper synced last, the keeper compares)."""

    def node_by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}
