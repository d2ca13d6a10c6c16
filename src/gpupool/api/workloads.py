"""API models for workloads: the submitted spec, and what the server answers about one."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from gpupool.api.array_spec import parse_array
from gpupool.api.common import ArgText, Name, Strict, refuse_control
from gpupool.api.fabric import NetworkOut
from gpupool.api.images import ImageName
from gpupool.api.mounts import MAX_MOUNTS, MAX_SECRET_USES, MountSpec, SecretUse
from gpupool.core.units import parse_cpu_milli, parse_devices, parse_memory_mib
from gpupool.errors import InvalidInput

MAX_REPLICAS = 256
MAX_COMMAND_ARGS = 4096
MAX_TIME_LIMIT_S = 366 * 86400
MAX_RETRIES = 1000
MAX_COMMAND_BYTES = 128 * 1024
"""The command's words together (UTF-8, one byte between words): a spec is stored and listed whole,
and Linux refuses a single exec argument above 128 KiB anyway."""
MAX_ENV_BYTES = 128 * 1024
"""The environment's names and values together (UTF-8, NAME=VALUE plus one byte each)."""
MAX_ENV_VARS = 1024
MAX_ARRAY_STORED_BYTES = 64 * 2**20
"""What one array's tasks may store in all: each task stores the whole spec, so without this one
request of a large spec with 10,000 tasks would write gigabytes to the store."""


MAX_CONSTRAINTS = 16
CONSTRAINT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,252}(=[A-Za-z0-9._:/+-]{0,256})?")
CONSTRAINT_RULE = ("is not KEY or KEY=VALUE: a key starts with a letter or digit and holds letters, digits, "
                   "'.', '_', '/', '-' (gpupool.io/containers, zone=a)")
ConstraintText = Annotated[str, Field(min_length=1, max_length=512)]


def parse_constraint(text: str) -> tuple[str, str | None]:
    """A node constraint as the core reads it: (KEY, None) or (KEY, VALUE)."""
    key, sep, value = text.partition("=")
    return (key, value if sep else None)


_NEGATIVE = re.compile(r"^\w+ must not be negative, got (.*?)\.?$")
_BEYOND_TIB = re.compile(r"^\s*[0-9]*\.?[0-9]+\s*([PEZY]i?B?)\s*$", re.IGNORECASE)
"""A memory size in a unit above TiB: readable, but more than any machine holds (the units take
none of them)."""


def _check(parse: object, value: object) -> object:
    if isinstance(value, str) and parse is parse_memory_mib and _BEYOND_TIB.match(value):
        raise ValueError(f"{value.strip()[:40]!r} is more memory than any machine has; write at most a few "
                         "TiB, such as 2TiB")
    try:
        parse(value)  # type: ignore[operator]
    except InvalidInput as exc:
        negative = _NEGATIVE.match(exc.message)  # said of the field: "must not be negative (got -1)"
        text = f"must not be negative (got {negative.group(1)})" if negative else exc.message
        raise ValueError(text) from None
    except (OverflowError, ValueError):  # inf, nan or beyond a float: found by bench/fuzz_api.py
        shown = str(value)[:40]
        raise ValueError(f"{shown!r} is too large or not a number; write a realistic amount") from None
    return value


class ResourcesSpec(Strict):
    """What each replica asks for; quantities take units ('8GiB', '500m') or plain numbers."""

    gpus: float = Field(0, ge=0, le=1024, description="a fraction below 1 (0.25) or whole devices (2)")
    gpu_memory: str | int | None = Field(None, description="device memory per device, e.g. 8GiB")
    cpu: str | float = Field(0.0, description="cores (4, 0.5) or milli-cores (500m); 0 reserves none")
    memory: str | int = Field(0, description="host memory, e.g. 16GiB; 0 reserves none")
    models: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=64, description="allowed device models; empty means any"
    )

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: float) -> float:
        _check(parse_devices, value)
        return value

    @field_validator("gpu_memory")
    @classmethod
    def _gpu_memory(cls, value: str | int | None) -> str | int | None:
        return None if value is None else _check(parse_memory_mib, value)  # type: ignore[return-value]

    @field_validator("cpu")
    @classmethod
    def _cpu(cls, value: str | float) -> str | float:
        return _check(parse_cpu_milli, value)  # type: ignore[return-value]

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | int) -> str | int:
        return _check(parse_memory_mib, value)  # type: ignore[return-value]


class RendezvousSpec(Strict):
    """Where one attempt of a multi-pod gang meets (MASTER_ADDR:MASTER_PORT), set by the server."""

    attempt: int
    node: str = Field(description="the rank-0 node")
    addr: str = Field(description="its address, the gang's MASTER_ADDR")
    port: int = Field(description="the MASTER_PORT reserved there for this attempt")


class Launcher(StrEnum):
    """What starts the command in each pod: itself (`none`), or torchrun with the gang's layout."""

    NONE = "none"
    TORCHRUN = "torchrun"


class WorkloadSpec(Strict):
    """A workload as submitted: a command run by `replicas` pods placed all-or-nothing."""

    command: list[ArgText] = Field(
        min_length=1, max_length=MAX_COMMAND_ARGS, description="program and arguments"
    )
    name: str = Field("", max_length=63, pattern=r"^[A-Za-z0-9._-]*$")
    tenant: Name | None = Field(None, description="admin only: submit on behalf of this tenant")
    queue: Name = "default"
    priority: int = Field(0, ge=-1000, le=1000)
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    resources: ResourcesSpec = Field(default_factory=lambda: ResourcesSpec.model_validate({}))
    env: dict[Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")],
              ArgText] = Field(default_factory=dict)
    workdir: str = Field("", max_length=4096)
    separate_stderr: bool = Field(False, description="keep stderr in its own log (sbatch --error); by "
                                  "default a pod's stdout and stderr are one log, in the order written")
    submit_dir: str = Field("", max_length=4096, description=(
        "where `gpupool submit` ran: without a workdir, pods run there when their node has it and "
        "their account may enter it, else in their private directory"))
    runtime_estimate_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    checkpoint_interval_s: float | None = Field(
        None, ge=1, le=MAX_TIME_LIMIT_S, allow_inf_nan=False, description=(
        "it saves a checkpoint in GPUPOOL_CHECKPOINT_DIR at least this often: a preemption or a move "
        "costs it at most this much work, and with the pool's topology_moves it may be moved while "
        "it runs (a spread gang into one leaf, or single-node work to make room for one)"))
    priority_class: Name | None = Field(None, description=(
        "one of the pool's priority classes (`gpupool config show`); ranks before `priority`, which "
        "orders work within its class; default: the class named normal, else the lowest-valued "
        "non-negative one (stored resolved)"))
    time_limit_s: float | None = Field(None, ge=1, le=MAX_TIME_LIMIT_S, allow_inf_nan=False, description=(
        "its pods are stopped this long after it started (Slurm's --time); backfill plans with it"))
    max_retries: int | None = Field(None, ge=0, le=MAX_RETRIES, description=(
        "requeues after pod failures before it fails for good; default: the pool's failure.max_retries"))
    array: str | None = Field(None, max_length=4096, description=(
        "Slurm's --array: create one task per index (0-999, 1,3,5-9, 0-15:4), each with GPUPOOL_ARRAY_INDEX; "
        "'%N' at the end lets at most N tasks hold slices at once (0-999%50)"))
    array_index: int | None = Field(None, ge=0, description=(
        "set by the server on each task of an array (its GPUPOOL_ARRAY_INDEX); not submitted"))
    topology: str | None = Field(None, max_length=128, description=(
        "where a gang's pods may sit in the fabric: required=leaf|spine, preferred=leaf|spine, "
        "slice=N@leaf|spine, comm=RATIO (the gang's communication ratio, which the network-aware "
        "policy weighs placements by) (comma-joined) or none; default: the pool's "
        "(scheduling.topology_default) for multi-pod gangs; single-pod and fractional work is never "
        "constrained"))
    dependency: str | None = Field(None, max_length=1024, description=(
        "Slurm's --dependency: afterok:ID[:ID...] (they all succeeded), afterany:ID[:ID...] (they all "
        "ended), afternotok:ID[:ID...] (they all ended without succeeding), singleton (no earlier "
        "workload of this tenant and name is unfinished); comma-joined, all must hold. An ID may be an "
        "array's id (all its tasks). It is not considered for placement until they hold"))
    kill_on_invalid_dep: bool = Field(True, description=(
        "cancel it, with the reason, when its dependency can never hold (afterok on work that failed); "
        "false keeps it pending with that reason until it is cancelled"))
    # ---- distributed launch (docs/cli.md, "Distributed training")
    launcher: Launcher = Field(Launcher.NONE, description=(
        "torchrun: each pod runs `python -m torch.distributed.run --nnodes NNODES --node-rank NODE_RANK "
        "--nproc-per-node NPROC_PER_NODE --master-addr MASTER_ADDR --master-port MASTER_PORT --no-python "
        "COMMAND...` in the command's own Python (else the pod's python3), one process per whole device; "
        "none: the command as given"))

    @field_validator("launcher", mode="before")
    @classmethod
    def _launcher(cls, value: object) -> object:
        names = [member.value for member in Launcher]
        if isinstance(value, str) and value not in names:
            from gpupool.errors import did_you_mean

            raise ValueError(f"there is no launcher {value!r}; use one of {', '.join(names)}."
                             f"{did_you_mean(value, names)}")
        return value

    rendezvous: list[RendezvousSpec] | None = Field(None, description=(
        "set by the server when a multi-pod gang is placed (newest attempt last): the rank-0 node, its "
        "address and the port reserved there; not submitted"))
    # Container images (gpupool image ...): one block, so other spec additions merge beside it
    image: ImageName | None = Field(None, description=(
        "run each pod in this image of the pool's store (`gpupool image ls`), in a container as the "
        "tenant's account; default: on the node itself"))
    # node constraints (docs/admission.md): labels a node must carry to take the pods
    constraints: list[ConstraintText] = Field(default_factory=list, max_length=MAX_CONSTRAINTS, description=(
        "node labels its pods need, as KEY (present, any value) or KEY=VALUE (Slurm's --constraint, "
        "Kubernetes' nodeSelector); all must hold; `gpupool node show NAME` lists a node's labels. "
        "With `image`, the server also requires gpupool.io/containers (not stored here)"))
    # mounts and secrets (docs/security.md): only references are stored, never a secret's value
    mounts: list[MountSpec] = Field(default_factory=list, max_length=MAX_MOUNTS, description=(
        "node paths inside the tenant's allowed roots, bound into each pod's own mount namespace"))
    secrets: list[SecretUse] = Field(default_factory=list, max_length=MAX_SECRET_USES, description=(
        "the tenant's secrets given to each pod as variables or as files under /run/secrets"))
    # inference services (docs/services.md)
    serve_port: int | None = Field(None, ge=1024, le=65535, description=(
        "set by the server on a service's replica: the port its pod serves (open to the node's own "
        "processes inside the pod's network namespace); not submitted"))
    service_role: Literal["prefill", "decode"] | None = Field(None, description=(
        "set by the server on a paired service's replica: its role (GPUPOOL_SERVICE_ROLE); not submitted"))
    pair_with: Name | None = Field(None, description=(
        "set by the server on a paired service's replica: the partner service; not submitted"))
    # who wrote what runs (docs/security.md#on-behalf-work)
    on_behalf: Literal["admin", "federation"] | None = Field(None, description=(
        "set by the server when the admin or a federation hub submits for a tenant: such work runs as "
        "the tenant's on-behalf account, which cannot read the tenant's own pods; not submitted"))

    @model_validator(mode="before")
    @classmethod
    def _stored_by_a_later_release(cls, data: Any, info: ValidationInfo) -> Any:
        """A stored spec (context STORED) is read without the fields this release does not know: a
        server of a later release, on the same store during a rolling upgrade, may have stored one.
        A spec submitted now still refuses them (a typo is an error, not a no-op)."""
        if is_stored(info) and isinstance(data, dict):
            return {key: value for key, value in data.items() if key in cls.model_fields}
        return data

    @model_validator(mode="after")
    def _image_takes_no_binds(self) -> WorkloadSpec:
        if self.image and (self.mounts or any(use.path for use in self.secrets)):
            raise ValueError(
                "--mount and secrets as files (NAME:/run/secrets/F) do not reach into a container yet: "
                "with --image, give secrets as variables (NAME or NAME:ENV_VAR) and put data in --workdir")
        return self

    @field_validator("constraints")
    @classmethod
    def _constraints(cls, value: list[str]) -> list[str]:
        for text in value:
            if not CONSTRAINT_RE.fullmatch(text):
                raise ValueError(f"constraint {text[:80]!r} {CONSTRAINT_RULE}")
        return sorted(set(value))  # stored in one order: alike constraints read alike

    @field_validator("array")
    @classmethod
    def _array(cls, value: str | None) -> str | None:
        if value is not None:
            parse_array(value)
        return value

    @field_validator("dependency")
    @classmethod
    def _dependency(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from gpupool.api.dependency_spec import parse_dependency

        return ",".join(str(part) for part in parse_dependency(value))  # stored in its one written form

    @field_validator("topology")
    @classmethod
    def _topology(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from gpupool.core.topology_spec import parse_topology_spec

        try:
            return str(parse_topology_spec(value))  # stored in its one written form
        except InvalidInput as exc:
            raise ValueError(exc.message) from None

    @field_validator("submit_dir")
    @classmethod
    def _submit_dir(cls, value: str) -> str:
        refuse_control(value)
        if value and not value.startswith("/"):
            raise ValueError("submit_dir must be an absolute path such as /home/me/project")
        return value

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str, info: ValidationInfo) -> str:
        refuse_control(value)
        if value and not value.startswith("/") and not is_stored(info):  # nothing it could be relative to
            raise ValueError(f"must be an absolute path such as /home/me/project, not {value[:80]!r}")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        if not value[0].strip():
            raise ValueError("must start with the program to run; its first word is empty")
        refuse_control(value[0], where="its first word (the program) ")
        return value

    @field_validator("command")
    @classmethod
    def _command_size(cls, value: list[str]) -> list[str]:
        return check_command_size(value)

    @field_validator("env")
    @classmethod
    def _env_size(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        value = check_env_size(value)
        return value if is_stored(info) else check_pool_env(value)


STORED = {"stored": True}
"""The validation context of a spec read back from the store (`WorkloadSpec.model_validate(row.spec,
context=STORED)`): the rules given to new specs since it was stored (a relative workdir, a variable
the pool sets itself) are not applied to it, so a pool upgraded with such a spec in its store still
schedules, shows and replaces what it holds; the pool's own values win at the launch, as before."""


def is_stored(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get("stored"))


POOL_ENV = frozenset({
    "GPUPOOL_WORKLOAD_ID", "GPUPOOL_POD_ID", "GPUPOOL_TENANT", "GPUPOOL_ATTEMPT", "GPUPOOL_PREEMPT_GRACE_S",
    "GPUPOOL_NODE", "GPUPOOL_CHECKPOINT_DIR", "GPUPOOL_SUBMIT_DIR", "GPUPOOL_ARRAY_INDEX",
    "GPUPOOL_DEVICE_MILLI", "GPUPOOL_DEVICE_MEMORY_MIB", "GPUPOOL_POD_ADDRESS", "GPUPOOL_POD_MARK",
    "GPUPOOL_CALL_TOKEN", "GPUPOOL_SERVICE_ROLE", "GPUPOOL_PAIR_WITH", "GPUPOOL_PARTNER_ENDPOINTS",
})
"""The variables the pool itself sets in pods (server/loops/launching.py, agent/isolation.py,
agent/node.py, server/serving/pairs.py, server/services/calls.py): a submitted value would be
replaced without a word, or (GPUPOOL_SUBMIT_DIR) read as the submit directory. Others of the
GPUPOOL_ prefix stay the user's: GPUPOOL_URL and GPUPOOL_TOKEN let a pod call the API."""


def check_pool_env(env: dict[str, str]) -> dict[str, str]:
    """`env` unchanged, or a ValueError naming the first variable in it that the pool sets itself."""
    taken = sorted(POOL_ENV.intersection(env))
    if taken:
        raise ValueError(f"holds {taken[0]}, which the pool sets itself in the pods it runs; remove it, "
                         "or pass the value under another name")
    return env


def check_command_size(command: list[str]) -> list[str]:
    """The command within MAX_COMMAND_BYTES (a ValueError naming the size otherwise)."""
    size = sum(len(word.encode("utf-8", "surrogatepass")) + 1 for word in command)
    if size > MAX_COMMAND_BYTES:
        raise ValueError(f"the command is {size} bytes long, more than the {MAX_COMMAND_BYTES // 1024} KiB a "
                         "spec may hold; put long inputs in a file the command reads")
    return command


def check_array_size(spec_bytes: int, tasks: int) -> None:
    """An array whose tasks' specs together stay within MAX_ARRAY_STORED_BYTES (InvalidInput
    otherwise: the spec is stored once per task)."""
    if spec_bytes * tasks > MAX_ARRAY_STORED_BYTES:
        raise InvalidInput(
            f"This array stores its spec once per task: {tasks} tasks of {spec_bytes / 1024:.0f} KiB is "
            f"{spec_bytes * tasks / 2**20:.0f} MiB, more than the {MAX_ARRAY_STORED_BYTES // 2**20} MiB an "
            "array may hold; put long commands or environments in a file the tasks read, or split the "
            "array.", field="array", tasks=tasks, spec_bytes=spec_bytes)


def check_env_size(env: dict[str, str]) -> dict[str, str]:
    """The environment within MAX_ENV_VARS and MAX_ENV_BYTES (a ValueError naming the size otherwise)."""
    if len(env) > MAX_ENV_VARS:
        raise ValueError(f"the environment has {len(env)} variables, more than the {MAX_ENV_VARS} a spec "
                         "may hold; put settings in a file the command reads")
    size = sum(len(name.encode("utf-8", "surrogatepass")) + len(value.encode("utf-8", "surrogatepass")) + 2
               for name, value in env.items())
    if size > MAX_ENV_BYTES:
        raise ValueError(f"the environment is {size} bytes long, more than the {MAX_ENV_BYTES // 1024} KiB a "
                         "spec may hold; put long values in a file the command reads")
    return env


class WorkloadUpdate(Strict):
    """What `gpupool update` may change while a workload is pending (fields left out stay)."""

    priority: int | None = Field(None, ge=-1000, le=1000, description="within the tenant's max priority")
    time_limit_s: float | None = Field(None, ge=1, le=MAX_TIME_LIMIT_S, allow_inf_nan=False)
    gpus: float | None = Field(None, ge=0, le=1024, description="per replica, as at submit")
    replicas: int | None = Field(None, ge=1, le=MAX_REPLICAS)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: float | None) -> float | None:
        return None if value is None else _check(parse_devices, value)  # type: ignore[return-value]

    def fields(self) -> list[tuple[str, object]]:
        """The (field, value) pairs this update sets, in a fixed order."""
        return [(name, value) for name, value in (
            ("priority", self.priority), ("time_limit_s", self.time_limit_s),
            ("gpus", self.gpus), ("replicas", self.replicas)) if value is not None]


def spec_field(stored: Mapping[str, Any], field: str) -> object:
    """A stored spec's value of a field `WorkloadUpdate` sets (its default where the spec has none)."""
    if field == "gpus":
        return stored.get("resources", {}).get("gpus", 0)
    return stored.get(field, {"priority": 0, "replicas": 1}.get(field))


def set_spec_field(stored: dict[str, Any], field: str, value: object) -> None:
    """Set a field `WorkloadUpdate` sets on a stored spec's dict (resources copied, not changed)."""
    if field == "gpus":
        stored["resources"] = {**stored.get("resources", {}), "gpus": value}
    else:
        stored[field] = value


class SliceOut(Strict):
    device_index: int
    compute_milli: int
    memory_mib: int


class PodOut(Strict):
    id: str
    name: str
    rank: int
    status: str
    node: str
    slices: list[SliceOut] = Field(description="the device slices it holds: device index, compute "
                                   "(milli) and device memory (MiB), defaults applied")
    cpu_milli: int = Field(0, description="host cpu it holds (milli-cores), defaults applied")
    memory_mib: int = Field(0, description="host memory it holds (MiB), defaults applied")
    simulated: bool
    exit_code: int | None
    message: str


class SpecSummary(Strict):
    """What a list page tells of a workload's spec: what it asks for, not what it runs. The command,
    environment and directories (up to ~1 MiB a workload) are left out of list pages unless asked
    (`GET /workloads?full=true`); `GET /workloads/{id}` always has the whole spec."""

    replicas: int = 1
    resources: ResourcesSpec
    priority_class: str | None = None
    time_limit_s: float | None = None
    topology: str | None = None


class WorkloadSummary(Strict):
    """A workload in a list page: everything but its full spec (`request` says what it asks for)."""

    id: str
    name: str
    tenant: str
    queue: str
    status: str = Field(description="pending, admitted, running, succeeded, failed or cancelled")
    priority: int
    attempt: int = Field(description="how many times it was placed (requeues place it again)")
    reason: str = Field(description="the code of the last reason recorded (gpupool.api.reasons.CATALOGUE)")
    reason_text: str = Field("", description="what the reason means, in a sentence")
    reason_hint: str = Field("", description="what the user can do about it")
    reason_final: bool = Field(False, description="true when, after this reason, it will not run (again)")
    message: str
    exit_code: int | None
    retries: int = Field(0, description="requeues after pod failures so far")
    max_retries: int = Field(0, description="requeues after pod failures allowed (its own, else the pool's)")
    time_limit_s: float | None = Field(None, description="its pods are stopped this long after it started")
    reserved_start_s: float | None = Field(None, description=(
        "under backfill, when the head of its queue is expected to start (its reservation)"))
    not_before_s: float | None = Field(None, description="after a failure, not placed again before this time")
    progress_s: float = Field(0.0, description="seconds of work kept from earlier runs (its last checkpoint)")
    lost_device_s: float = Field(0.0, description="device-seconds of work lost to preemptions and evictions")
    run_s: float = Field(0.0, description="seconds it ran in earlier attempts")
    submit_s: float
    admitted_s: float | None
    started_s: float | None
    finished_s: float | None
    simulated: bool = Field(description="true when its pods hold simulated devices")
    array_id: str | None = Field(None, description="the array it is one task of (submit --array)")
    array_index: int | None = None
    array_limit: int | None = Field(None, description="how many tasks of its array may hold slices at once")
    request: SpecSummary = Field(description="what it asks for (replicas, resources, class, time limit)")
    held: str = Field("", description=(
        "while pending: 'user' or 'admin' when held (gpupool hold), not placed until released"))
    waiting_on: str = Field("", description=(
        "while pending: the part of its dependency that does not hold yet (empty: none)"))
    pods: list[PodOut]
    network: NetworkOut | None = Field(default=None, description=(
        "where its pods sit in the fabric while it holds them on several nodes (pools started with "
        "--fabric): domain, hops, bottleneck cable and its bandwidth"))


class WorkloadOut(WorkloadSummary):
    """A workload with its whole spec (`GET /workloads/{id}`, and list pages with full=true)."""

    spec: WorkloadSpec


class WorkloadCreated(Strict):
    id: str = Field(description="the workload's id, or the array's id (its tasks are ID_INDEX)")
    status: str
    tasks: int | None = Field(None, description="for an array: how many tasks were created")


class ArrayCancelled(Strict):
    id: str = Field(description="the array's id")
    cancelled: int = Field(description="tasks cancelled now")
    finished: int = Field(description="tasks that had already finished (left as they were)")


class WorkloadPage(Strict):
    items: list[WorkloadOut | WorkloadSummary] = Field(description=(
        "summaries (no command, environment or directories) unless full=true asked for whole workloads"))
    ids: list[str] | None = Field(None, description="with fields=id: the page's ids (items is empty)")
    total: int
    limit: int
    offset: int


class EventOut(Strict):
    id: int
    workload_id: str
    pod_id: str
    from_status: str
    to_status: str
    reason: str
    reason_text: str = Field("", description="what the reason means, in a sentence")
    message: str
    at_s: float


class LogsOut(Strict):
    workload_id: str
    pod_id: str
    offset: int = Field(description="byte offset to ask for next")
    text: str
    complete: bool = Field(description="true when the workload is finished and every byte was sent")
    combined: bool = Field(True, description="stdout holds stderr too, in the order written (the "
                           "default); false when the workload was submitted with separate_stderr")
    # ---- attempts (`logs --attempt N`, `--all-attempts`)
    attempt: int = Field(0, description="the attempt this text is from (0: no pod of it started yet)")
    attempts: list[int] = Field(default_factory=list, description=(
        "every attempt that has a pod of this rank, oldest first; each keeps its own log"))
    parts: list[LogsOut] = Field(default_factory=list, description=(
        "with all_attempts: each attempt's log from its start, oldest first (the newest 16; read "
        "the others, or more of one, with attempt=N and its offset)"))
