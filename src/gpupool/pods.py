"""The pod types every side of a launch shares: what to start (`PodLaunch`), how it is going
(`PodPhase`, `PodStatus`), its log text (`LogChunk`) and device health changes (`HealthEvent`).

A neutral module: the provider contract (providers/base.py), the providers and the node agent all
import these, and none of them has to import another's package for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpupool.core.model import Slice


class PodPhase(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"
    STOPPED = "stopped"
    """Ended because stop() asked it to (cancel, preemption, eviction); exit_code says how it died."""

    @property
    def is_final(self) -> bool:
        return self not in (PodPhase.STARTING, PodPhase.RUNNING)


@dataclass(frozen=True, slots=True)
class PodMount:
    """A directory or file of the node bound into the pod's own mount namespace (`submit --mount`).
    `root` is the tenant's allowed root the server checked `source` against; the node checks it
    again, symlinks resolved, at the launch."""

    source: str
    target: str
    read_only: bool
    root: str


@dataclass(frozen=True, slots=True)
class PodSecret:
    """One `submit --secret NAME[:ENV_VAR | :/run/secrets/PATH]`: its keys as variables (`env`
    empty: each key its own variable), as one variable (`env`), or as files under `path`. `data`
    (key -> value) is filled by the server just before the launch and never printed; None: the
    secret no longer exists."""

    name: str
    env: str = ""
    path: str = ""
    data: Mapping[str, bytes] | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class PodLaunch:
    """Everything a provider needs to start one pod: where, what, and inside which limits."""

    pod_id: str
    workload_id: str
    node: str
    command: tuple[str, ...]
    slices: tuple[Slice, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = ""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    """How many pods of the gang run on this pod's node (each pod is its own torch node, so the
    pod's LOCAL_WORLD_SIZE is its own process count, not this; see agent/isolation.gang_env)."""
    master_addr: str = "127.0.0.1"
    """Where the gang meets (`Provider.gang_address`): the rank-0 pod's own address where pods have
    network namespaces, else its node's."""
    master_port: int = 0
    """The port the server reserved for the gang on the rank-0 node; 0: none (a single pod)."""
    ib_hcas: tuple[str, ...] = ()
    """NCCL_IB_HCA: the node's IB ports for the gang ("mlx5_0:1"), those on its fabric path when known."""
    ib_sl: int | None = None
    """NCCL_IB_SL: the service level of the pod's priority class, where the pool's fabric QoS sets one."""
    ib_pkey_index: int | None = None
    """NCCL_IB_PKEY: the P_Key table index of the tenant's partition, where the pool gives it one."""
    tenant: str = "default"
    """Whose pod it is: where the agent runs as root, it picks the Unix account from it."""
    unix_user: str = ""
    """The account the admin mapped to the tenant ('' = the pool's own account for the tenant)."""
    on_behalf: bool = False
    """Started by the admin or a federation hub for the tenant (its spec's `on_behalf`): the pod runs
    as the tenant's on-behalf account, which reads none of the tenant's own pods (agent/identity.py)."""
    separate_stderr: bool = False
    """Keep stderr in its own log; by default stdout and stderr share one, in the order written."""
    # Container images (agent/container.py)
    image: str = ""
    """The image the pod runs in, by name ('' = on the node itself, as before)."""
    image_rootfs: str = ""
    """That image's root filesystem on the node, as the pool's image store resolved it at launch."""
    # mounts and secrets (`submit --mount`, `--secret`): the node gives such a pod its own mount namespace
    mounts: tuple[PodMount, ...] = ()
    secrets: tuple[PodSecret, ...] = ()
    # inference services (docs/services.md)
    serve_port: int = 0
    """A service replica's port: the node's own processes (the pool's probes, its router) may open
    connections to it in the pod's network namespace; 0: none (only answers reach the pod)."""
    # several servers (docs/ha.md): the node refuses a launch of a leader deposed since
    epoch: int | None = None
    """The leader lease's epoch the launch was decided under; None: a single server (no fencing)."""


@dataclass(frozen=True, slots=True)
class PodStatus:
    pod_id: str
    phase: PodPhase
    exit_code: int | None = None
    message: str = ""
    node: str = ""
    started_at_s: float | None = None
    finished_at_s: float | None = None
    never_started: bool = False
    """LOST before its command ran (the node says so for certain): it may be placed again."""


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Log text from byte `offset` to `next_offset`; `finished` once the pod ended and all is read."""

    text: str
    next_offset: int
    finished: bool


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """A device or node changed health: `device_uuid` empty means the whole node."""

    time_s: float
    node: str
    device_uuid: str
    healthy: bool
    reason: str


SECRETS_DIR = "/run/secrets"
"""Where a pod's secret files appear (api/mounts.py refuses other paths): its own tmpfs."""


def secret_injection(secret: PodSecret) -> tuple[dict[str, str], dict[str, bytes]]:
    """What `secret` becomes in its pod: variables (name -> text) and files (path under SECRETS_DIR,
    relative -> bytes). Raises ValueError with the sentence when it cannot be given as asked (it no
    longer exists, a variable of several keys, a key that cannot name a variable, a value that is
    not text for a variable)."""
    data = secret.data
    if data is None:
        raise ValueError(f"secret {secret.name!r} no longer exists; create it again (gpupool secret "
                         "create) or submit without it")
    if secret.path:
        relative = secret.path[len(SECRETS_DIR) + 1:]
        if len(data) == 1:
            return {}, {relative: next(iter(data.values()))}
        return {}, {f"{relative}/{key}": value for key, value in sorted(data.items())}
    if secret.env and len(data) != 1:
        raise ValueError(f"secret {secret.name!r} holds {len(data)} keys, so it cannot be one variable "
                         f"{secret.env}; give it as --secret {secret.name} (a variable per key) or as files")
    env: dict[str, str] = {}
    for key, value in sorted(data.items()):
        name = secret.env or key
        if not name.isidentifier() or not name.isascii():
            raise ValueError(f"key {key!r} of secret {secret.name!r} cannot name a variable; give it as "
                             f"--secret {secret.name}:VAR or as files under {SECRETS_DIR}")
        try:
            text = value.decode()
        except UnicodeDecodeError:
            text = "\x00"
        if "\x00" in text:
            raise ValueError(f"key {key!r} of secret {secret.name!r} is not text without NUL bytes, so it "
                             f"cannot be a variable; give it as a file under {SECRETS_DIR}")
        env[name] = text
    return env, {}


# ---- `submit --launcher torchrun` ------------------------------------------------

def nproc_per_node(slices: tuple[Slice, ...]) -> int:
    """NPROC_PER_NODE: one process per whole device the pod holds; a pod with a fraction of one
    device, or none, runs one."""
    return max(1, sum(1 for piece in slices if piece.compute_milli >= 1000))


def torchrun_command(command: tuple[str, ...], *, nnodes: int, node_rank: int, nproc: int,
                     master_addr: str, master_port: int) -> tuple[str, ...]:
    """`command` under torchrun (`python -m torch.distributed.run`), each pod one of its nodes.

    torchrun runs in the command's own interpreter when the command starts with a Python (so the
    torch it imports is the one the command would), else in the pod's `python3`; `--no-python`
    makes it start the command exactly as given (`python -c ...` included) in each of its `nproc`
    processes. A single pod (or a gang without a reserved port) meets on its own (`--standalone`)."""
    python = command[0] if _is_python(command[0]) else "python3"
    if nnodes > 1 and master_port:
        meet = ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--master-addr", master_addr,
                "--master-port", str(master_port)]
    else:
        meet = ["--standalone", "--nnodes", "1"]
    return (python, "-m", "torch.distributed.run", *meet, "--nproc-per-node", str(nproc), "--no-python",
            *command)


def _is_python(program: str) -> bool:
    name = program.rsplit("/", 1)[-1]
    version = name.removeprefix("python")
    return name.startswith("python") and all(part.isdigit() for part in version.split(".") if part)
