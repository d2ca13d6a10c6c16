"""One configuration for the server and the simulator: a YAML file, validated, that builds `Policies`.

`gpupool config show [--config FILE]` prints the effective configuration; docs/configuration.md
documents every key. A bad file is refused with one sentence per problem, naming the field and
its line. Every default is the project's best measured choice, with the figure that chose it in
docs/configuration.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpupool.api.common import NAME_PATTERN, NAME_RULE
from gpupool.api.mounts import clean_path
from gpupool.core.fabric.qos import QosPlan, plan_qos
from gpupool.core.model import SliceDefaults
from gpupool.core.overcommit import ModelRatio, OvercommitConfig
from gpupool.core.priority import DEFAULT_PRIORITY_CLASSES, PriorityClass, PriorityClasses
from gpupool.core.quota import (
    DEVICE_MILLI,
    ClusterQueue,
    LocalQueue,
    QuotaConfig,
    ResourceQuota,
    devices_milli,
)
from gpupool.core.scheduling.congestion import MigrateRule
from gpupool.core.scheduling.cycle import Policies
from gpupool.core.scheduling.locality import WaitCap
from gpupool.core.scheduling.moves import MoveRule
from gpupool.core.scheduling.reach import (
    BorrowWithinCohort,
    PreemptionRules,
    ReclaimWithinCohort,
    Scope,
    WithinQueue,
)
from gpupool.core.topology_spec import parse_topology_spec
from gpupool.core.units import MILLI, parse_memory_mib
from gpupool.errors import InvalidInput, did_you_mean
from gpupool.prices import PricesConfig
from gpupool.yamlfiles import read_text, safe_load

CONFIG_ENV = "GPUPOOL_CONFIG"
_UNITS_S = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def _seconds(value: object) -> object:
    """A duration as a number of seconds: 30, 30s, 500ms, 5m, 2h, 1d."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or text such as 30s, 5m or 2h")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            return float(match.group(1)) * _UNITS_S[match.group(2) or ""]
    raise ValueError(f"a duration is a number of seconds or text such as 30s, 5m or 2h, not {value!r}")


Seconds = Annotated[float, BeforeValidator(_seconds), Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SchedulingConfig(_Strict):
    """How a cycle decides: placement, ordering, preemption, backfill."""

    placement: str = "fgd-strand"
    placement_options: dict[str, Any] = Field(default_factory=dict)
    ordering: str = "drf"
    ordering_options: dict[str, Any] = Field(default_factory=dict)
    preemption: bool = True
    preemption_grace: Seconds = 30.0
    """SIGTERM to SIGKILL for a preempted pod whose class names no grace of its own."""
    backfill: bool = True
    max_preemption_attempts: int = Field(16, ge=0, le=10_000)
    topology_default: str = "preferred=leaf"
    """The topology constraint of multi-pod gangs that name none (`gpupool submit --topology`):
    required=leaf|spine, preferred=leaf|spine, slice=N@leaf, or none; used where a fabric is known."""
    topology_max_wait: Seconds = 300.0
    """The longest a gang that could start spread over the spine waits for a leaf of its own
    (Slurm's max_switch_wait); it waits only while spreading is expected to cost more."""
    topology_wait_cap: Literal["fixed", "loss", "queue"] = "fixed"
    """fixed: every gang waits at most topology_max_wait in all; loss: a gang whose spread would
    cost it more (its estimated run time x the extra slowdown) may wait up to that cost in all;
    queue: that cost counted for the work queued behind it too (docs/network-aware.md)."""
    topology_wait_ceiling: Seconds | None = None
    """Under loss and queue, the longest any gang waits for its leaf in all, whatever its estimates
    say (a tenant that overstates its run time or communication ratio waits, and holds nodes, no
    longer than this); none: no ceiling. At least topology_max_wait."""
    topology_moves: bool = False
    """Move a running gang spread over several leaves into one when single-node work can make room
    by moving too, and the gang's expected gain exceeds what the moves cost (docs/network-aware.md,
    "Moving running work"); only preemptible work that checkpoints moves. Off by default."""
    topology_move_restart: Seconds = 300.0
    """What one move is expected to cost a workload besides the work since its last checkpoint:
    stopping, loading the checkpoint and warming up again."""
    topology_moves_per_workload: int = Field(2, ge=1, le=1000)
    """A workload is moved at most this many times in all (for its own locality or to make room
    for a gang), and at most once per its checkpoint interval."""

    @field_validator("topology_wait_ceiling")
    @classmethod
    def _ceiling(cls, value: float | None, info: ValidationInfo) -> float | None:
        floor = info.data.get("topology_max_wait")
        if value is not None and floor is not None and value < floor:
            raise ValueError(f"the ceiling ({value:g} s) cannot be below topology_max_wait ({floor:g} s); "
                             "raise it or lower topology_max_wait")
        return value

    @field_validator("topology_default")
    @classmethod
    def _topology_default(cls, value: str) -> str:
        try:
            return str(parse_topology_spec(value))
        except InvalidInput as exc:
            raise ValueError(exc.message) from None

    @field_validator("placement")
    @classmethod
    def _placement(cls, value: str) -> str:
        from gpupool.core.scheduling.policies.base import policy_names

        return _known(value, policy_names(), "placement policy")

    @field_validator("ordering")
    @classmethod
    def _ordering(cls, value: str) -> str:
        from gpupool.core.scheduling.ordering.base import ordering_names

        return _known(value, ordering_names(), "ordering")


def _known(value: str, names: Sequence[str], what: str) -> str:
    if value not in names:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(names)}."
                         + did_you_mean(value, list(names)))  # ends with '.' or '?'; _sentence keeps it
    return value


def _choice(enum: type[StrEnum], what: str) -> Any:
    """A before-validator: one of the enum's values, else a sentence with them and a did-you-mean."""

    def check(value: object) -> object:
        names = [e.value for e in enum]
        if not isinstance(value, str):
            raise ValueError(f"{what} is one of {', '.join(names)}, not {value!r}.")
        # Kueue spells them LowerPriority; lower_priority and lower-priority are read the same
        wanted = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", value.strip()).lower().replace("-", "_")
        return _known(wanted if wanted in names else value, names, what)

    return BeforeValidator(check)


class PreemptionConfig(_Strict):
    """How far priority reaches when `scheduling.preemption` is on (core/scheduling/reach.py)."""

    scope: Annotated[Scope, _choice(Scope, "preemption scope")] = Scope.QUEUE
    """queue: a workload preempts in its own queue and, by the cohort rules, in its cohort (Kueue);
    pool: also work of a lower priority class in any other queue (Slurm QOS, Kubernetes PriorityClass)."""
    within_queue: Annotated[WithinQueue, _choice(WithinQueue, "within_queue value")] = (
        WithinQueue.LOWER_PRIORITY)
    reclaim_within_cohort: Annotated[ReclaimWithinCohort, _choice(ReclaimWithinCohort,
                                                                  "reclaim_within_cohort value")] = (
        ReclaimWithinCohort.ANY)
    borrow_within_cohort: Annotated[BorrowWithinCohort, _choice(BorrowWithinCohort,
                                                                "borrow_within_cohort value")] = (
        BorrowWithinCohort.NEVER)

    def rules(self) -> PreemptionRules:
        return PreemptionRules(self.scope, self.within_queue, self.reclaim_within_cohort,
                               self.borrow_within_cohort)


class PriorityClassConfig(_Strict):
    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
    value: int = Field(ge=-1_000_000, le=1_000_000)
    preemptible: bool = True
    grace: Seconds | None = None
    """SIGTERM to SIGKILL when a pod of this class is preempted (default: scheduling.preemption_grace)."""



# ---- inference services (docs/services.md): one block, so other sections merge beside it
SERVING_CLASS = PriorityClassConfig(name="serving", value=500, preemptible=True)
"""Services' default class: above batch (normal, high), so a replica that cannot fit preempts
preemptible batch and lower classes never preempt it; below critical."""


class ServingConfig(_Strict):
    """`serving:` how the pool runs inference services (`gpupool service`)."""

    priority_class: str = Field("serving", min_length=1, max_length=63)
    """The class of a service that names none; one of `classes` or of `priority_classes`."""
    classes: list[PriorityClassConfig] = Field(default_factory=lambda: [SERVING_CLASS.model_copy()])
    """Priority classes only services may use (batch submissions cannot name them)."""
    headroom_replicas: int = Field(0, ge=0, le=1000)
    """Keep room for this many more replicas of the largest service free from new batch admission
    (0: none; batch then fills everything and replicas preempt it when they need room)."""
    pack_replicas: bool = True
    """Place replicas on nodes already in use (services' nodes first) before a free one, and remove
    the replica on the emptiest node at scale-down, so whole nodes stay free for wide batch gangs
    (a service's replicas still spread over nodes first)."""
    probe_concurrency: int = Field(16, ge=1, le=256)
    """Probes in flight at once, across all services."""
    port_base: int = Field(22_000, ge=1024, le=65_000)
    port_count: int = Field(6_000, ge=16, le=30_000)
    """Replicas' ports ($PORT) come from [port_base, port_base + port_count), each unique in the pool;
    the default lies below Linux's ephemeral ports (32768-) and the gangs' ports (gangs.port_base)."""

    def packed_classes(self) -> frozenset[str]:
        """The classes the core packs (`Policies.pack_classes`): the services' own, or none."""
        if not self.pack_replicas:
            return frozenset()
        return frozenset({self.priority_class, *(c.name for c in self.classes)})

    @model_validator(mode="after")
    def _ports_fit(self) -> ServingConfig:
        if self.port_base + self.port_count > 65_536:
            raise ValueError(f"serving.port_base + port_count ({self.port_base + self.port_count}) exceeds "
                             "65536; lower one of them")
        return self


EPHEMERAL_PORTS = 32_768
"""Where Linux's ephemeral ports start by default (net.ipv4.ip_local_port_range): every outbound
connection's source port may be any of them, so a port a server must bind lies below."""
GANG_ADDRESSES = 2_000
"""How many rendezvous ports a node's pod network maps to addresses of their own (agent/netns.py:
the rank-0 pod of a gang gets the address its MASTER_PORT names), so a range of at most this many."""


class GangsConfig(_Strict):
    """`gangs:` where the pods of a multi-pod workload meet (server/services/rendezvous.py)."""

    port_base: int = 29_500
    port_count: int = GANG_ADDRESSES
    """A gang's MASTER_PORT comes from [port_base, port_base + port_count) on its rank-0 node, each
    unique on that node (torch.distributed's customary 29500 upwards by default). Two pools on one
    machine whose gangs run in the host's network (no pod namespaces) give each its own range."""

    @model_validator(mode="after")
    def _ports_fit(self) -> GangsConfig:
        base, count = self.port_base, self.port_count
        last = base + count - 1
        if count < 1:
            raise ValueError(f"gangs.port_count is {count}; a gang needs 1 port at least, so give 1 or more")
        if count > GANG_ADDRESSES:
            raise ValueError(f"gangs.port_count is {count}, more than the {GANG_ADDRESSES} rendezvous ports "
                             f"a node's pod network gives addresses of their own; give {GANG_ADDRESSES} or "
                             "fewer")
        if base < 1024:
            raise ValueError(f"gangs.port_base is {base}; ports below 1024 are bound by root alone, and "
                             "a gang's rank 0 runs as its tenant: give 1024 or more")
        if last > 65_535:
            raise ValueError(f"gangs.port_base + port_count reaches port {last}, beyond 65535, the last "
                             "port there is; lower one of them")
        if last >= EPHEMERAL_PORTS:
            raise ValueError(f"the gangs' ports {base}-{last} reach into Linux's ephemeral ports "
                             f"({EPHEMERAL_PORTS} and up), which any outbound connection may hold; keep "
                             f"port_base + port_count at {EPHEMERAL_PORTS} or below")
        return self

    def ports(self) -> range:
        """[port_base, port_base + port_count)."""
        return range(self.port_base, self.port_base + self.port_count)


class QueueConfig(_Strict):
    """A tenant's queue with its quota (Kueue's ClusterQueue, one per queue), in an optional cohort."""

    tenant: str = Field(min_length=1, max_length=63)
    name: str = Field("default", min_length=1, max_length=63)
    quota: float | None = Field(None, ge=0, le=1_000_000, description="nominal devices; null = no cap")
    cohort: str = ""
    borrowing_limit: float | None = Field(None, ge=0, le=1_000_000)
    lending_limit: float | None = Field(None, ge=0, le=1_000_000)
    weight: float = Field(1.0, gt=0, le=1_000_000)

    @field_validator("tenant", "name", "cohort")
    @classmethod
    def _storable_name(cls, value: str) -> str:
        # the server stores tenants, queues and cohorts under the API's name rule: `config check`
        # refuses here what `gpupool up` could not store
        if value and not re.fullmatch(NAME_PATTERN, value):
            raise ValueError(f"{value!r} cannot be stored: {NAME_RULE}")
        return value

    @model_validator(mode="after")
    def _limits_need_a_quota(self) -> QueueConfig:
        if self.quota is None and (self.borrowing_limit is not None or self.lending_limit is not None):
            raise ValueError(f"queue {self.tenant}/{self.name} has no quota, so a borrowing or lending "
                             "limit means nothing; give it a quota or remove the limits")
        return self


class MountRootConfig(_Strict):
    """A directory of the nodes a tenant's pods may mount (`submit --mount`), read-only or not."""

    path: str = Field(max_length=4096)
    mode: Literal["ro", "rw"] = "ro"

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        clean_path(value, "a mount root")
        if value == "/":
            raise ValueError("a mount root of / would let the tenant mount every file of the node (its "
                             "keys, the pool's data directory); name the directories it needs")
        return value


class TenantConfig(_Strict):
    """What the configuration grants one tenant beyond its queues (`tenants.<name>`)."""

    mounts: list[MountRootConfig] = Field(default_factory=list, max_length=64)
    """The roots its pods may mount from; nothing outside them (the default: no mounts)."""


class ModelRatioConfig(_Strict):
    compute: float = Field(1.0, ge=1.0, le=100.0)
    memory: float = Field(1.0, ge=1.0, le=100.0)


class OvercommitSection(_Strict):
    """Oversubscription per device model ('*' for the rest); none by default."""

    ratios: dict[str, ModelRatioConfig] = Field(default_factory=dict)
    spill_penalty: float = Field(4.0, ge=1.0, le=1000.0)


class FailureConfig(_Strict):
    max_retries: int = Field(0, ge=0, le=1000)
    """Requeues after pod failures (exit code != 0) before the workload fails for good; a workload
    may ask for its own (`submit --max-retries N`). 0, as Slurm: a program that failed usually
    fails again. Preemption, eviction and lost nodes requeue without counting against it."""
    requeue_backoff: Seconds = 10.0
    """Wait before a workload requeued after a failure may be placed again (doubled per retry)."""


class FederationMemberConfig(_Strict):
    fence: Seconds | None = None
    """For a pool that a federation hub uses: after this long without any call from a federation
    token, the hub's pending copies are held and its running ones stopped and held, since the hub
    may place them elsewhere (its requeue_grace_s must be longer). None: no fence."""


class DefaultsConfig(_Strict):
    """What a request that names no amount gets."""

    gpu_memory: Literal["proportional", "none"] = "proportional"
    """proportional: a fractional slice without --gpu-memory holds its compute share of the device's
    memory (0.25 of 80 GiB: 20 GiB)."""
    cpu_per_gpu: float | Literal["node-share"] = "node-share"
    """Cores per device when a request names none; node-share: the node's cores / its devices."""
    memory_per_gpu: str | Literal["node-share"] = "node-share"
    """Host memory per device (e.g. 32GiB) when a request names none; node-share likewise."""

    @field_validator("cpu_per_gpu")
    @classmethod
    def _cpu(cls, value: float | str) -> float | str:
        if isinstance(value, float | int) and (value < 0 or not math.isfinite(value)):
            raise ValueError("cpu_per_gpu must be a number of cores >= 0 or 'node-share'")
        return value

    @field_validator("memory_per_gpu")
    @classmethod
    def _memory(cls, value: str) -> str:
        if value != "node-share":
            try:
                parse_memory_mib(value)
            except InvalidInput as exc:
                raise ValueError(exc.message) from None
        return value

    def slice_defaults(self) -> SliceDefaults:
        """The core's SliceDefaults (None per device: the node's share)."""
        cpu = self.cpu_per_gpu
        memory = self.memory_per_gpu
        return SliceDefaults(
            proportional_device_memory=self.gpu_memory == "proportional",
            cpu_milli_per_device=None if isinstance(cpu, str) else round(cpu * MILLI),
            memory_mib_per_device=None if memory == "node-share" else parse_memory_mib(memory),
        )


MAX_PKEY_INDEX = 127
"""A port's P_Key table holds at most 128 entries."""


class FabricConfig(_Strict):
    """What the live pool does with its fabric beyond placement (`fabric:`): NCCL_IB_SL per priority
    class, NCCL_IB_PKEY per tenant, and moving gangs off congested links."""

    qos: dict[str, float] = Field(default_factory=dict)
    """Priority class -> its guaranteed share of a busy link, as `gpupool fabric export opensm-qos
    --class`; a gang's pods get NCCL_IB_SL of their class (none for a class not named)."""
    partitions: dict[str, Annotated[int, Field(ge=0, le=MAX_PKEY_INDEX)]] = Field(default_factory=dict)
    """Tenant -> the P_Key table index of its partition (`fabric export opensm-partitions` puts a
    tenant's at 1); its gangs' pods get NCCL_IB_PKEY (none for a tenant not named)."""
    migrate_on_congestion: bool = False
    """Checkpoint-requeue a gang whose bottleneck link stays congested, so it is placed again away
    from it (costs the work since its last checkpoint; off by default)."""
    congestion_threshold: float = Field(0.9, gt=0, le=1)
    """A link whose load (fraction of its data rate) exceeds this is congested."""
    congestion_for: Seconds = 300.0
    """How long a gang's bottleneck link stays congested before the gang is moved."""
    congestion_max_moves: int = Field(2, ge=1, le=100)
    """How many times one gang may be moved off congestion (then it stays where it runs)."""

    @field_validator("qos")
    @classmethod
    def _qos(cls, value: dict[str, float]) -> dict[str, float]:
        if value:
            try:
                plan_qos(value)
            except InvalidInput as exc:
                raise ValueError(exc.message) from None
        return value

    def migrate_rule(self) -> MigrateRule | None:
        """The cycle's congestion rule (`Policies.migrate`), the same for `gpupool up` and
        `gpupool sim replay --config`; None when migrate_on_congestion is off."""
        if not self.migrate_on_congestion:
            return None
        return MigrateRule(threshold=self.congestion_threshold, hold_s=self.congestion_for,
                           max_moves_each=self.congestion_max_moves)

    def qos_plan(self) -> QosPlan | None:
        """The SL of each class (None when no QoS is configured)."""
        return plan_qos(self.qos) if self.qos else None

    def service_level(self, priority_class: str) -> int | None:
        """NCCL_IB_SL for work of `priority_class`, where QoS names it."""
        plan = self.qos_plan()
        if plan is None:
            return None
        found = next((c for c in plan.classes if c.name == priority_class), None)
        return None if found is None else found.sl

    def pkey_index(self, tenant: str) -> int | None:
        """NCCL_IB_PKEY for `tenant`'s work, where it has a partition."""
        return self.partitions.get(tenant)


class PoolConfig(_Strict):
    """The whole file. Every section is optional."""

    scheduling: SchedulingConfig = Field(default_factory=lambda: SchedulingConfig.model_validate({}))
    preemption: PreemptionConfig = Field(default_factory=lambda: PreemptionConfig.model_validate({}))
    """How far priority reaches (used while scheduling.preemption is on)."""
    priority_classes: list[PriorityClassConfig] = Field(
        default_factory=lambda: [PriorityClassConfig(name=c.name, value=c.value, preemptible=c.preemptible)
                                 for c in DEFAULT_PRIORITY_CLASSES])
    queues: list[QueueConfig] = Field(default_factory=list)
    overcommit: OvercommitSection = Field(default_factory=lambda: OvercommitSection.model_validate({}))
    failure: FailureConfig = Field(default_factory=lambda: FailureConfig.model_validate({}))
    defaults: DefaultsConfig = Field(default_factory=lambda: DefaultsConfig.model_validate({}))
    prices: PricesConfig = Field(default_factory=lambda: PricesConfig.model_validate({}))
    """The price book `gpupool usage` and `invoice` bill with (gpupool/prices.py)."""
    fabric: FabricConfig = Field(default_factory=lambda: FabricConfig.model_validate({}))
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)
    """Per tenant: the node directories its pods may mount (`tenants.<name>.mounts`)."""
    serving: ServingConfig = Field(default_factory=lambda: ServingConfig.model_validate({}))
    """Inference services: their priority classes, headroom and probes (docs/services.md)."""
    gangs: GangsConfig = Field(default_factory=lambda: GangsConfig.model_validate({}), validate_default=True)
    """Multi-pod workloads: the range their MASTER_PORT comes from."""
    federation: FederationMemberConfig = Field(
        default_factory=lambda: FederationMemberConfig.model_validate({}))
    """As a member of a federation (docs/federation.md): the fence against a silent hub."""

    def all_priority_classes(self) -> list[PriorityClassConfig]:
        """The batch classes, then the services' classes the batch list does not define."""
        names = {c.name for c in self.priority_classes}
        return [*self.priority_classes, *(c for c in self.serving.classes if c.name not in names)]

    @model_validator(mode="after")
    def _serving_class_defined(self) -> PoolConfig:
        names = [c.name for c in self.all_priority_classes()]
        if self.serving.priority_class not in names:
            raise ValueError(f"serving.priority_class {self.serving.priority_class!r} is not a priority "
                             f"class; name one of {', '.join(names)} or add it to serving.classes")
        return self

    @field_validator("gangs")
    @classmethod
    def _gangs_beside_serving(cls, value: GangsConfig, info: ValidationInfo) -> GangsConfig:
        serving = info.data.get("serving")  # validated before (declared first); absent when it failed
        if serving is None:
            return value
        replicas = range(serving.port_base, serving.port_base + serving.port_count)
        gangs = value.ports()
        if gangs.start < replicas.stop and replicas.start < gangs.stop:
            raise ValueError(f"the gangs' ports {gangs.start}-{gangs.stop - 1} (gangs.port_base, port_count) "
                             f"overlap the replicas' ports {replicas.start}-{replicas.stop - 1} "
                             "(serving.port_base, port_count): a gang and a replica on one node could be "
                             "given the same port; move one range")
        return value

    @field_validator("tenants")
    @classmethod
    def _tenant_names(cls, value: dict[str, TenantConfig]) -> dict[str, TenantConfig]:
        for name in value:
            if not re.fullmatch(NAME_PATTERN, name):
                raise ValueError(f"tenant {name!r} cannot be stored: {NAME_RULE}")
        return value

    def mount_roots(self, tenant: str) -> list[MountRootConfig]:
        """The roots `tenant`'s pods may mount from (none unless the configuration lists some)."""
        entry = self.tenants.get(tenant)
        return list(entry.mounts) if entry is not None else []

    @field_validator("priority_classes")
    @classmethod
    def _unique_classes(cls, value: list[PriorityClassConfig]) -> list[PriorityClassConfig]:
        names = [c.name for c in value]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"priority class names must be unique; {', '.join(duplicated)} appear twice")
        return value

    @field_validator("queues")
    @classmethod
    def _unique_queues(cls, value: list[QueueConfig]) -> list[QueueConfig]:
        keys = [(q.tenant, q.name) for q in value]
        duplicated = sorted({f"{t}/{n}" for t, n in keys if keys.count((t, n)) > 1})
        if duplicated:
            raise ValueError(f"a queue may appear once; {', '.join(duplicated)} appear twice")
        for q in value:
            if q.lending_limit is not None and q.quota is not None and q.lending_limit > q.quota:
                raise ValueError(f"queue {q.tenant}/{q.name}: lending_limit ({q.lending_limit:g}) cannot "
                                 f"exceed its quota ({q.quota:g})")
        return value

    def notes(self) -> list[str]:
        """Sentences on settings that meet and which of them wins (printed by `config check` and `up`)."""
        out: list[str] = []
        if self.preemption.scope is Scope.POOL and self.scheduling.preemption:
            top = max((c.value for c in self.priority_classes), default=0)
            for c in self.priority_classes:
                if not c.preemptible and c.value < top:
                    out.append(f"preemption.scope is pool, but priority class {c.name!r} is not preemptible: "
                               f"the class wins, and its work is never preempted in any queue (set "
                               f"preemptible: true on it to let higher classes take it).")
        if not self.scheduling.preemption and self.preemption != PreemptionConfig.model_validate({}):
            out.append("scheduling.preemption is false: nothing is preempted, and the preemption section "
                       "has no effect until it is true.")
        return out

    def grace_s(self, class_name: str) -> float:
        """SIGTERM to SIGKILL for a preempted pod of this class."""
        for cls in self.all_priority_classes():
            if cls.name == class_name and cls.grace is not None:
                return cls.grace
        return self.scheduling.preemption_grace

    def quota_config(self) -> QuotaConfig:
        """Every queue listed becomes a ClusterQueue (`tenant/queue`, without a cap when its quota
        is null), fed by that LocalQueue: the server does the same with every queue it stores."""
        capped = list(self.queues)
        cluster = tuple(
            ClusterQueue(name=f"{q.tenant}/{q.name}", cohort=q.cohort, quotas={DEVICE_MILLI: ResourceQuota(
                devices_milli(q.quota), _milli(q.borrowing_limit), _milli(q.lending_limit))}
                if q.quota is not None else {})
            for q in capped)
        local = tuple(LocalQueue(q.tenant, q.name, f"{q.tenant}/{q.name}") for q in capped)
        weights: dict[str, float] = {}  # as the server: the largest weight other than the default 1
        for q in self.queues:
            if q.weight != 1.0:
                weights[q.tenant] = max(weights.get(q.tenant, 0.0), q.weight)
        return QuotaConfig(cluster_queues=cluster, local_queues=local, tenant_weights=weights)

    def policies(self, *, placement: str | None = None, ordering: str | None = None,
                 preemption: bool | None = None, backfill: bool | None = None) -> Policies:
        """The core's Policies for this configuration: what `gpupool up` runs (with its --policy as
        `placement`) and what `gpupool sim replay` and `sim fill` run (with their flags). A setting
        given here (not None) replaces the configuration's; a placement or ordering other than the
        configuration's drops the options the configuration gave its own."""
        s = self.scheduling
        named = {"placement": placement, "ordering": ordering, "preemption": preemption, "backfill": backfill}
        given: dict[str, Any] = {name: value for name, value in named.items() if value is not None}
        if given.get("placement", s.placement) != s.placement:
            given["placement_options"] = {}
        if given.get("ordering", s.ordering) != s.ordering:
            given["ordering_options"] = {}
        s = s.model_copy(update=given)
        classes = PriorityClasses(tuple(PriorityClass(c.name, c.value, c.preemptible)
                                        for c in self.all_priority_classes()))
        overcommit = None
        if self.overcommit.ratios:
            overcommit = OvercommitConfig(
                ratios={m: ModelRatio(r.compute, r.memory) for m, r in self.overcommit.ratios.items()},
                spill_penalty=self.overcommit.spill_penalty)
        return Policies(placement=s.placement, placement_options=dict(s.placement_options),
                        ordering=s.ordering, ordering_options=dict(s.ordering_options),
                        preemption=s.preemption, backfill=s.backfill, quota=self.quota_config(),
                        priority_classes=classes, overcommit=overcommit,
                        max_preemption_attempts=s.max_preemption_attempts,
                        preemption_rules=self.preemption.rules(),
                        defaults=self.defaults.slice_defaults(),
                        topology_default=parse_topology_spec(s.topology_default),
                        max_locality_wait_s=s.topology_max_wait,
                        locality_wait_cap=WaitCap(s.topology_wait_cap),
                        max_locality_wait_ceiling_s=(math.inf if s.topology_wait_ceiling is None
                                                     else s.topology_wait_ceiling),
                        moves=(MoveRule(restart_s=s.topology_move_restart,
                                        max_moves_each=s.topology_moves_per_workload)
                               if s.topology_moves else None),
                        migrate=self.fabric.migrate_rule(),
                        pack_classes=self.serving.packed_classes())

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, default_flow_style=False)


def _milli(devices: float | None) -> int | None:
    return None if devices is None else devices_milli(devices)


def parse_config(text: str, source: str = "the configuration") -> PoolConfig:
    """Validate YAML text; InvalidInput with one sentence per problem, each naming field and line."""
    try:
        tree = yaml.compose(text, Loader=yaml.SafeLoader)
        data = safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InvalidInput(f"{source}{where}: this is not valid YAML ({problem}).") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise InvalidInput(f"{source}: the file must be a mapping of sections, such as scheduling and "
                           "queues.")
    try:
        config = PoolConfig.model_validate(data)
    except ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda error: _line_number(tree, tuple(error["loc"])))
        problems = [_sentence(source, tree, error) for error in errors]  # in the file's line order
        raise InvalidInput(" ".join(problems), problems=problems) from None
    _check_options(config, source, tree)
    return config


def _check_options(config: PoolConfig, source: str, tree: yaml.Node | None) -> None:
    """The placement and ordering options must be ones their policy takes."""
    from gpupool.core.scheduling.ordering.base import make_ordering
    from gpupool.core.scheduling.policies.base import make_policy

    s = config.scheduling
    for key, make, name, options in (("placement_options", make_policy, s.placement, s.placement_options),
                                     ("ordering_options", make_ordering, s.ordering, s.ordering_options)):
        if not options:
            continue
        try:
            make(name, **options)
        except (TypeError, ValueError, InvalidInput) as exc:
            line = _line(tree, ("scheduling", key))
            raise InvalidInput(f"{source}{line}: scheduling.{key}: {name} does not take these options "
                               f"({exc}).") from None


def _sentence(source: str, tree: yaml.Node | None, error: Mapping[str, Any]) -> str:
    loc = tuple(error["loc"])
    field = ".".join(f"[{part}]" if isinstance(part, int) else str(part) for part in loc)
    field = field.replace(".[", "[")
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        names = _allowed(loc[:-1])
        message = f"unknown field {loc[-1]!r}" + (f"; known fields: {', '.join(names)}" if names else "")
        message += "." + did_you_mean(str(loc[-1]), names)
    message = message.strip()
    if not message.endswith((".", "?")):
        message += "."
    return f"{source}{_line(tree, loc)}: {field or 'the file'}: {message}"


def _allowed(loc: Sequence[Any]) -> list[str]:
    model: type[BaseModel] = PoolConfig
    for part in loc:
        if isinstance(part, int):
            continue
        annotation = model.model_fields[str(part)].annotation if str(part) in model.model_fields else None
        inner = getattr(annotation, "__args__", (annotation,))
        found = next((a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if found is None:
            return []
        model = found
    return list(model.model_fields)


def _line_number(tree: yaml.Node | None, loc: Sequence[Any]) -> int:
    """The line `_line` names (0 when it names none: a problem of the whole file comes first)."""
    text = _line(tree, loc)
    return int(text.removeprefix(" line ")) if text else 0


def _line(tree: yaml.Node | None, loc: Sequence[Any]) -> str:
    """' line N' of the deepest node of `loc` found in the composed YAML (or '' when none)."""
    node, line = tree, None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if getattr(k, "value", None) == str(part)), None)
            if match is None:
                break
            line = match[0].start_mark.line
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line
        else:
            break
    return "" if line is None else f" line {line + 1}"


MAX_CONFIG_FILE_BYTES = 16 << 20
"""A configuration file holds at most this much (a device such as /dev/zero has no end)."""


def load_config(path: Path | str | None) -> PoolConfig:
    """The configuration in `path` (defaults when None); InvalidInput for a missing or bad file."""
    if path is None:
        return PoolConfig()
    path = Path(path)
    try:
        text = read_text(path, "the configuration file", bound=(
            MAX_CONFIG_FILE_BYTES, f"The configuration file {str(path)!r} holds more than "
            f"{MAX_CONFIG_FILE_BYTES >> 20} MiB, far more than a configuration needs: is it the right file?"))
    except FileNotFoundError:
        raise InvalidInput(f"No configuration file {str(path)!r}; check the path (--config or "
                           f"{CONFIG_ENV}).") from None
    except OSError as exc:
        raise InvalidInput(f"Cannot read the configuration file {str(path)!r} ({exc.strerror}).") from None
    return parse_config(text, str(path))
