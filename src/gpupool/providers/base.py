"""The provider contract: what nodes and devices exist, and how work starts and stops on them.

Implementations: `local` (processes on this machine, the embedded default), `fake` (the
simulator and tests) and `ray` (the nodes of a Ray cluster, in the `ray` extra); each registers by
name (providers/registry.py). One contract test suite runs against every provider.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar, Protocol

from gpupool.core.model import Node
from gpupool.errors import ProviderError
from gpupool.pods import HealthEvent, LogChunk, PodLaunch, PodStatus

MAX_CHECKPOINT_BYTES = 256 * 2**20  # agent/checkpoints.py MAX_ARCHIVE_BYTES
"""The most a checkpoint carried between pools may hold (read_checkpoint, seed_checkpoint)."""

if TYPE_CHECKING:
    from gpupool.agent.execs import ExecSession


class Capability(StrEnum):
    """Optional features; a provider lists what it lacks with a reason."""

    REAL_PROCESSES = "real_processes"
    GPU = "gpu"
    MPS = "mps"
    CGROUPS = "cgroups"
    MULTI_NODE = "multi_node"
    FAULT_INJECTION = "fault_injection"
    USER_ISOLATION = "user_isolation"
    """Pods run as unprivileged Unix accounts of their tenants, never as the agent's user."""
    HIDDEN_PROCESSES = "hidden_processes"
    """/proc hides other accounts' processes from a pod (hidepid=2)."""
    NETWORK_ISOLATION = "network_isolation"
    """Each pod has its own network namespace: it reaches its tenant's pods, the pool's API server
    and the node's declared networks, nothing else (agent/netns.py)."""
    CONTAINERS = "containers"
    """Pods may run in an image of the pool's store (`--image`), in a container (agent/container.py)."""


@dataclass(frozen=True, slots=True)
class DeviceReading:
    """What a real device measures now (NVML): how busy it is and the memory its processes use."""

    busy_pct: float | None
    memory_used_mib: float | None


class NetworkBlocks(Protocol):
    """Who hands out each machine's block of the pod network (its /19 slot, agent/netns.py): the
    server's store (server/services/netblocks.py), or `MemoryBlocks` for a provider on its own."""

    def assign(self, node: str, machine: str, capacity: int) -> int:
        """The slot of `node` (joined as `machine`, e.g. its Ray node id): the one it holds, else
        a free one below `capacity`, never one another node holds. ProviderError when none is free."""
        ...

    def release(self, node: str, machine: str) -> None:
        """`node` (as joined by `machine`) left: its slot is free again (a later join of the node
        under another `machine` keeps the one it took over). Idempotent."""
        ...


class MemoryBlocks:
    """NetworkBlocks in this process's memory: for a provider used without a server's store."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[int, str]] = {}

    def assign(self, node: str, machine: str, capacity: int) -> int:
        known = self._held.get(node)
        if known is None:
            taken = {slot for slot, _ in self._held.values()}
            slot = next((s for s in range(capacity) if s not in taken), None)
            if slot is None:
                raise ProviderError(f"The pod network holds {capacity} machine block(s), all in use; "
                                    "give GPUPOOL_POD_NETWORK a larger network.")
            known = (slot, machine)
        self._held[node] = (known[0], machine)
        return known[0]

    def release(self, node: str, machine: str) -> None:
        known = self._held.get(node)
        if known is not None and known[1] == machine:
            del self._held[node]


class Provider(ABC):
    """Where work runs. Every method is safe to call from the scheduler loop.

    The consistency model (as Ray's cloud instance provider states its own):

    1. Asynchronous: launch() and stop() record the request and return; the process starts or
       ends later. What became of it is learnt only from poll(): a pod that could not start is
       reported FAILED or LOST with a message, never raised from launch().
    2. Eventually consistent: nodes() and poll() report the provider's latest view, which may lag
       reality (a node that died is listed until the provider notices; a stopped pod keeps its
       phase until it has ended). Callers reconcile on every call instead of expecting a change
       to show at once.
    3. Known once launched: once launch() returns, poll() lists the pod (STARTING at first) until
       the caller acknowledges its final state with forget_pods() or the provider is closed, and a
       provider built again over the same state finds it again by pod id (finished pods included),
       so a restarted server re-adopts its pods instead of starting them twice.
    4. Idempotent by id: launching a known pod id, stopping an ended one, or closing twice does
       nothing more.
    5. Errors: a request that can never succeed raises the gpupool error saying why (ProviderError
       for an unknown node or an unusable provider, NotFound for an unknown pod or device,
       InvalidInput for a malformed request); a transient failure of the backend (a lost
       connection to the cluster) raises Unavailable. Any other exception is a bug in the provider.
    """

    name: ClassVar[str]

    # Optional features are declared here, each with the default a provider without it gets: the
    # server calls them on every provider, never probes for them (a misspelt override would silently
    # turn a feature off; mypy checks these signatures).
    concurrent_launch: ClassVar[bool] = False
    """Whether launch() may be called from several threads at once (for different pods): the
    scheduler then starts a batch of pods in parallel. False: one at a time."""

    def add_exit_listener(self, listener: Callable[[], None]) -> None:
        """Have `listener()` called (from any thread; it returns at once) soon after pods end, so the
        control loop polls then instead of at its next interval. The default never calls it: exits
        are seen at the next poll."""

    def missing_capabilities(self) -> dict[Capability, str]:
        """Each optional capability this provider lacks, with the reason. Non-blocking."""
        return {}

    @abstractmethod
    def nodes(self) -> list[Node]:
        """The nodes and devices that exist now, as far as the provider knows (eventually
        consistent: a node that joined or left shows on a later call). Non-blocking, idempotent,
        never raises for an unhealthy device (it is reported with healthy=False); Unavailable when
        the backend cannot be asked."""

    @abstractmethod
    def launch(self, pod: PodLaunch) -> None:
        """Start the pod asynchronously and return at once, once the pod is recorded (poll() lists
        it from then on). Idempotent by pod_id: launching a pod id that is already known does
        nothing. Raises ProviderError if the node is unknown, Unavailable when the backend cannot
        take the request now; a pod that fails to start later is reported by poll()."""

    @abstractmethod
    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        """Ask the pod to stop (SIGTERM, then SIGKILL after grace_s); returns without waiting (poll()
        reports STOPPED once it has ended). Idempotent; stopping an unknown or finished pod does
        nothing. Raises Unavailable when the backend cannot take the request now."""

    @abstractmethod
    def poll(self) -> list[PodStatus]:
        """The latest known status of every pod this provider knows, including finished ones with
        their exit codes until forget_pods() acknowledges them (eventually consistent: a change
        shows on a later call). Non-blocking, idempotent; Unavailable when the backend cannot be
        asked."""

    def fence(self, epoch: int, confirm: Callable[[], None] | None = None) -> None:
        """A new leader's first act at takeover (`gpupool up --ha`): the nodes refuse, from now on,
        launches carrying an older `PodLaunch.epoch`, and wait for those being let go right now.
        `confirm` (called under the node's lock) raises when `epoch` is no longer the store's.
        Default: nothing (a provider whose nodes do not fence; docs/ha.md)."""

    def forget_pods(self, pod_ids: Sequence[str]) -> None:
        """The acknowledgement of poll(): the caller has stored the final state of these pods, so
        poll() stops listing them and its cost follows the pods not yet acknowledged, not every pod
        ever run. An id whose pod has not ended (or is unknown) is ignored, so a pod never leaves
        poll() unfinished. A forgotten pod is still known by id otherwise: its log stays readable,
        launching or stopping it again does nothing. A provider built again over the same state may
        list them again until they are forgotten again (the local agents keep it on disk: not).
        Non-blocking, idempotent; never raises. The default forgets nothing."""

    def read_log(self, pod_id: str, stream: str = "stdout", offset: int = 0) -> LogChunk:
        """The pod's log text from byte `offset`. Non-blocking. Raises NotFound for an unknown pod,
        InvalidInput for a stream other than stdout/stderr."""
        raise ProviderError(f"The {self.name} provider keeps no logs.")

    def exec(self, node: str, pod_id: str, command: Sequence[str], *, pty: bool = False, rows: int = 0,
             cols: int = 0) -> ExecSession:
        """Start `command` inside the live pod `pod_id` on `node` (gpupool exec): its account, network
        namespace, cgroup, limits and environment; see agent/execs.py. Raises NotFound when the pod is
        not live there, ProviderError where this provider cannot."""
        raise ProviderError(f"The {self.name} provider cannot run commands inside pods yet; "
                            "gpupool exec and alloc need the local provider (gpupool up, or --simulate).")

    def inject_fault(self, node: str, device_uuid: str = "", reason: str = "injected fault") -> None:
        """Mark a device (or, with no uuid, the whole node) unhealthy, as a real fault would.
        Idempotent. Raises NotFound for an unknown node or device, ProviderError when unsupported."""
        raise ProviderError(f"The {self.name} provider cannot inject faults.")

    def clear_fault(self, node: str, device_uuid: str = "") -> None:
        """Undo inject_fault for that device (or node). Idempotent. Raises like inject_fault."""
        raise ProviderError(f"The {self.name} provider cannot inject faults.")

    def health_events(self) -> list[HealthEvent]:
        """Every health change seen so far, oldest first. Non-blocking, idempotent."""
        return []

    def checkpoint_s(self, workload_id: str) -> float | None:
        """When the workload last reported a checkpoint (epoch seconds on the provider's clock): the
        mtime of $GPUPOOL_CHECKPOINT_DIR/.checkpoint, which its pods touch after saving, latest over
        the nodes that hold its directory; None when there is none. The directory outlives the
        workload's attempts, so a mark may predate the current attempt, and the tenant sets the mtime
        (it may lie about the past or the future): clamp it to the attempt. Non-blocking; never
        raises (an unknown workload has no mark)."""
        return None

    def checkpoint_marks(self, workload_ids: Sequence[str]) -> dict[str, float | None]:
        """`checkpoint_s` of each of `workload_ids`, in one call: the scheduler asks for the marks of
        a whole cycle's stops before its transaction opens. Blocks at most as long as one
        `checkpoint_s` on each node (a provider whose nodes answer over the network asks them all at
        once); never raises (a workload no node answers for has no mark)."""
        return {workload_id: self.checkpoint_s(workload_id) for workload_id in workload_ids}

    def device_readings(self) -> dict[tuple[str, int], DeviceReading]:
        """The latest measurement of each real device by (node, device index), where the provider
        measures them (NVML); never blocks on a node and never raises. A device missing here is not
        measured: simulated devices never are (the dashboard says so)."""
        return {}

    def read_checkpoint(self, workload_id: str, max_bytes: int) -> tuple[float | None, bytes] | None:
        """The workload's checkpoint directory as a tar of its files and directories (links left
        out) and its mark (`checkpoint_s`); None when it has none. A federation hub carries it to the
        member that runs the work next. InvalidInput past `max_bytes`; ProviderError where this
        provider cannot."""
        raise ProviderError(f"The {self.name} provider cannot read checkpoints yet; the local provider can.")

    def seed_checkpoint(self, workload_id: str, tenant: str, unix_user: str, data: bytes, *,
                        on_behalf: bool = False) -> int:
        """Fill the checkpoint directory of a workload that has not started with `data` (a tar from
        `read_checkpoint`), owned by the account its pods will run as (`on_behalf`: the tenant's
        on-behalf account, as `PodLaunch.on_behalf`); returns the bytes written.
        Conflict when it already holds files, InvalidInput for a bad archive, ProviderError where this
        provider cannot."""
        raise ProviderError(f"The {self.name} provider cannot take checkpoints yet; the local provider can.")

    def forget_workload(self, workload_id: str) -> None:
        """The workload reached a final state and will not run again: remove its checkpoint
        directory wherever it is. Call it once its pods have ended. Returns without waiting for the
        files to be deleted; idempotent; never raises for an unknown workload."""

    def node_address(self, node: str) -> str:
        """The address other nodes reach `node`'s pods at: a gang's MASTER_ADDR is its rank-0 node's.
        Non-blocking (answered from what the provider already knows), idempotent; never raises (an
        unknown node gets the default). Providers whose pods all run on this machine keep the
        default, loopback."""
        return "127.0.0.1"

    def gang_address(self, node: str, port: int) -> str:
        """MASTER_ADDR of a gang whose rank-0 pod runs on `node` and serves `port`: that pod's own
        address where pods have network namespaces, else `node_address(node)`. Non-blocking,
        idempotent; never raises."""
        return self.node_address(node)

    def pod_address(self, node: str, pod_id: str) -> str:
        """Where a pod running on `node` is reached (a service replica's endpoint): its own address
        where pods have network namespaces, else `node_address(node)`. Non-blocking, idempotent;
        never raises."""
        return self.node_address(node)

    def use_network_blocks(self, blocks: NetworkBlocks) -> None:
        """Take each joining machine's block of the pod network from `blocks` (the server's store)
        from now on. Providers whose machines' blocks are fixed (this machine's) ignore it."""

    def remove_tenant(self, tenant: str) -> list[str]:
        """The tenant was deleted and nothing of it runs: remove what the provider keeps for it (the
        pool's Unix account of the tenant on each node). Returns the accounts removed. Raises
        ProviderError, saying why, when something of it still runs; idempotent."""
        return []

    def close(self) -> None:
        """Release the provider's resources (threads, daemons). Idempotent."""
