"""The node agent actor: one detached actor per gpupool node, describing it and running its pods.

`gpupool node join` (or the provider, for simulated nodes) starts it pinned to its Ray node. It
probes the node's devices and IB ports with the agent's probes (NVML, sysfs), keeps injected
faults of simulated devices, runs the pods of the group carrier (the agent's LocalProvider on the
node's state dir: environment, Unix account, logs, SIGTERM/grace/SIGKILL of the process group; a
restarted agent re-adopts them from that dir), and serves what outlives a pod: finished pods' logs
and the workloads' checkpoint marks. The provider reads the node from it (`describe`), so the device
list comes from the machine itself, joined with Ray's node table by the node label. It holds the
node's pod network (network.py), and lends the actor carrier's pods their namespaces from it
(`lend_network`, actor.py).

Pods' ends are pushed, not polled: the provider keeps one `watch` call per busy node in flight, and
the agent answers it as soon as one of the pods it names changes phase (the reaper hands over an
exited pod at once), a pod is launched here, or `WATCH_MAX_S` has passed. `watch` runs in a
concurrency group of its own, so a waiting watch never holds up the node's other calls; those
(launch, stop, statuses, ...) run one at a time in the order each caller sent them, so a stop sent
after a launch always finds the pod. The actor carrier's `lend_network` has a group of its own too
(a pod actor asks while it holds the node's fence, which a takeover's `fence` call waits for).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from gpupool.agent.netns import Member, PodNet
from gpupool.agent.podstate import PodRecord, load_record
from gpupool.agent.runner import read_pod_log
from gpupool.core.model import Node
from gpupool.errors import GpupoolError, NotFound
from gpupool.pods import HealthEvent, LogChunk, PodLaunch, PodPhase, PodStatus
from gpupool.providers.base import Capability
from gpupool.providers.local import LocalProvider, record_status
from gpupool.providers.ray.nodeconfig import NodeConfig, node_agent_name
from gpupool.providers.ray.settings import NAMESPACE

if TYPE_CHECKING:
    from gpupool.providers.ray.network import NetworkPlan

log = logging.getLogger("gpupool.ray")
WATCH_MAX_S = 2.0
"""The longest a `watch` call waits before answering with no change."""
WATCHERS = 64
"""Watch calls served at once (one per provider per busy node, usually one provider)."""
NETWORK_CALLS = 4
"""Other machines' agents' `network_members` calls served at once."""
LEND_CALLS = 4
"""Actor-carried pods' `lend_network` calls served at once: apart from the node's other calls, so a
pod actor that asks for its namespace while it holds the node's fence (agent/fencing.py, admitting)
never waits behind a takeover's `fence`, which waits for it."""
PLAN_FILE = "network-plan.json"
"""The last pod network plan the agent took, in its state directory (an agent Ray restarts takes it
again before any call: its pods never start without their namespaces meanwhile)."""
ANNOUNCE_WAIT_S = 5.0
"""The longest a launch waits for the other machines to take its pod's address (network.py)."""
PULL_LATE_S = 120.0
"""The longest an agent waits, off its calls' path, for another machine's whole set (network.py)."""


@dataclass(frozen=True, slots=True)
class NodeDescription:
    """What the provider knows of a node from its agent."""

    node: Node
    config: NodeConfig
    events: tuple[HealthEvent, ...] = ()
    missing: dict[Capability, str] = field(default_factory=dict)
    hostname: str = ""
    seq: int = 0
    """Counts the agent's answers: a later one describes a later state (the agent answers in order)."""
    network_slot: int = -1
    """The block of the pod network this node's pods take their addresses from (-1: none, its pods
    share the machine's network; providers/ray/network.py)."""


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1,
            concurrency_groups={"watch": WATCHERS, "network": NETWORK_CALLS, "lend": LEND_CALLS})  # type: ignore[call-overload]  # Ray's stub lacks concurrency_groups
class NodeAgentActor:
    """Serves one node's description, faults, finished pods' logs and checkpoint marks."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.local = LocalProvider(config.agent_dir(), simulate=config.simulate or None,
                                   node_name=config.name, ib_sysfs_root=config.ib_sysfs_root,
                                   scratch_root=config.scratch(), identities=config.identities())
        self._failed: dict[str, PodStatus] = {}
        """Pods whose start failed here (never a process), with why."""
        self._seq = 0
        self._changed = threading.Condition()
        self._generation = 0
        """Counts pods launched and pods that exited here (what a watch waits for)."""
        self.local.add_exit_listener(self._bump)
        self._remote_peers: tuple[str, ...] = ()
        """The other machines' nodes (on other hosts), told of this machine's pods."""
        self._peer_handles: dict[str, Any] = {}
        self._remote_machines: dict[str, str] = {}
        """Each of them -> the join (Ray node id) it was told of under."""
        self._incarnation = os.urandom(8).hex()
        """This run of the agent (a restarted one is another): the other machines apply its words
        in the order of their numbers (`_said`) within it."""
        self._said = 0
        self._said_lock = threading.Lock()
        self._pulled = False
        """Whether this agent took the other machines' whole sets (at its first plan)."""
        self.local.agent.adopt_lent(self._carried_records())
        if ray.get_runtime_context().was_current_actor_reconstructed:
            plan = self._kept_plan()
            if plan is not None:  # Ray started this agent again on the same Ray node: no join is seen
                try:
                    self.use_network(plan)
                except (GpupoolError, OSError) as exc:  # a failing start would be restarted for ever
                    log.warning("node %s: the kept pod network plan was not taken (%s); the server's "
                                "next one is", config.name, exc)

    def _bump(self) -> None:
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def describe(self) -> NodeDescription:
        self._seq += 1  # the default concurrency group runs one call at a time: answers stay in order
        self.local.agent.end_lent()  # the actor-carried pods that ended without saying so
        network = self.local.agent.network
        return NodeDescription(node=self.local.nodes()[0], config=self.config,
                               events=tuple(self.local.health_events()),
                               missing=self.local.missing_capabilities(), hostname=socket.gethostname(),
                               seq=self._seq, network_slot=network.slot if network.active else -1)

    # ---- the pod network (providers/ray/network.py) -----------------------------------------
    def use_network(self, plan: NetworkPlan) -> NodeDescription:
        """Take this machine's block and routes (sent by the provider when machines join or leave,
        and before any launch here); answers the description that says whether pods get namespaces."""
        agent = self.local.agent
        agent.use_network(plan.settings, plan.slot, plan.published, plan.peers, announce=self._announce,
                          servers=plan.servers)
        self._keep_plan(plan)
        remote = tuple(sorted(name for name, slot, address in plan.peers
                              if slot != plan.slot and agent.network.routes([(name, slot, address)])))
        machines = dict(plan.machines)
        joined = [name for name in remote if self._remote_machines.get(name) != machines.get(name)]
        self._remote_peers, self._remote_machines = remote, {n: machines.get(n, "") for n in remote}
        for name in joined:  # a machine that joined (again: its agent is another actor)
            self._peer_handles.pop(name, None)
        if joined and agent.network.active:
            # A machine that joins (or whose agent is another actor now) is told of all the pods
            # here, as a whole (it forgets those of this block that ended meanwhile).
            seq, members = self._said_now()
            self._tell(joined, members, [], seq, block=str(agent.network.subnet))
        if remote and agent.network.active and not self._pulled:
            # This agent's first plan (a restarted one's too: the other machines see no join, and
            # tell it nothing of what started or ended there while it was away): it takes each
            # machine's whole set from its agent. Later joins tell it theirs (above, on their side).
            self._pulled = True
            self._pull(remote)
        return self.describe()

    @ray.method(concurrency_group="lend")
    def lend_network(self, pod: PodLaunch, url: str) -> tuple[PodNet | None, str, str]:
        """The namespace of an actor-carried pod (actor.py) from this node's pod network, as for the
        agent's own pods (block, rules, the other machines told before it starts): NodeAgent.lend.
        It goes when the pod's record says it ended, or when its actor gives it back."""
        return self.local.agent.lend(pod, self.config.pod_record(pod.pod_id), url)

    @ray.method(concurrency_group="lend")
    def return_network(self, pod_id: str) -> None:
        """An actor-carried pod ended (or was never started): its namespace may go."""
        self.local.agent.take_back(pod_id)

    def _carried_records(self) -> dict[str, Path]:
        """The records of the actor-carried pods that had namespaces of this node (an earlier agent's
        loans): kept by this one while their pods run."""
        found = {}
        for path in Path(self.config.state_dir).glob("pods/*/pods/*/state.json"):
            record = load_record(path)
            if isinstance(record, PodRecord) and record.net and not record.finished:
                found[record.pod_id] = path
        return found

    def _keep_plan(self, plan: NetworkPlan) -> None:
        path = self.config.agent_dir() / PLAN_FILE
        temporary = path.with_name(f".{PLAN_FILE}.{os.getpid()}")
        try:
            with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600),
                      "w") as handle:
                handle.write(plan.to_json())
            os.replace(temporary, path)
        except OSError as exc:
            log.warning("node %s: the pod network plan was not kept (%s): a restart waits for the next",
                        self.config.name, exc)

    def _kept_plan(self) -> NetworkPlan | None:
        from gpupool.providers.ray.network import NetworkPlan  # network.py imports this module

        try:
            return NetworkPlan.from_json((self.config.agent_dir() / PLAN_FILE).read_text())
        except OSError:
            return None

    @ray.method(concurrency_group="network")
    def network_members(self, origin: str, incarnation: str, seq: int, added: list[Member],
                        removed: list[str], block: str = "") -> None:
        """Pods of machine `origin` attached (before they start) or ended there, in its agent's word
        number `seq`; with `block`, `added` is the whole of its pods (netns.PodNetwork.told)."""
        self.local.agent.network.told(origin, incarnation, seq, added, removed, block=block)

    @ray.method(concurrency_group="network")
    def network_snapshot(self) -> tuple[str, str, int, list[Member], str]:
        """This machine's pods as a whole, for an agent that joins or restarts: (node, incarnation,
        the number of the last word said, the pods, this machine's block ('' without namespaces))."""
        network = self.local.agent.network
        seq, members = self._said_now()
        block = str(network.subnet) if network.active else ""
        return self.config.name, self._incarnation, seq, members, block

    def _said_now(self) -> tuple[int, list[Member]]:
        """The number of the last word said, with the pods as they are after it (read under the same
        lock that numbers a word: a word numbered later may already be in them, never one earlier
        missing, as a pod is attached or torn down before its word is numbered)."""
        with self._said_lock:
            network = self.local.agent.network
            return self._said, network.members() if network.active else []

    def _pull(self, nodes: Sequence[str]) -> None:
        """Take these machines' whole sets: those that answer within ANNOUNCE_WAIT_S before this
        call returns, the others (an agent busy or starting) by a thread when they answer (a set
        applied late drops nothing said after it: PodNetwork.told)."""
        refs = [peer.network_snapshot.remote() for peer in map(self._peer, nodes) if peer is not None]
        ready, late = ray.wait(refs, num_returns=len(refs), timeout=ANNOUNCE_WAIT_S) if refs else ([], [])
        for ref in ready:
            self._take_set(ref, 0)
        if late:
            threading.Thread(target=self._take_sets, args=(late, PULL_LATE_S), name="gpupool-network-pull",
                             daemon=True).start()

    def _take_sets(self, refs: Sequence[Any], timeout_s: float) -> None:
        for ref in refs:
            self._take_set(ref, timeout_s)

    def _take_set(self, ref: Any, timeout_s: float) -> None:
        try:
            origin, incarnation, seq, members, block = ray.get(ref, timeout=timeout_s)
        except (ray.exceptions.RayError, TimeoutError):
            log.warning("node %s: another machine's whole set of pods was not taken (its agent did not "
                        "answer): only what it says from now on is known here", self.config.name)
            return
        if block:
            try:
                self.local.agent.network.told(origin, incarnation, seq, members, [], block=block)
            except GpupoolError as exc:  # not a block of this pool's other machines: not taken
                log.warning("node %s: node %s's pods were not taken: %s", self.config.name, origin, exc)

    def _announce(self, added: Sequence[Member], removed: Sequence[str]) -> None:
        if self._remote_peers:
            with self._said_lock:
                self._said += 1
                seq = self._said
            self._tell(self._remote_peers, added, removed, seq)

    def _peer(self, name: str) -> Any:
        peer = self._peer_handles.get(name)
        if peer is None:  # looked up once (a GCS round trip), not at every launch
            try:
                peer = ray.get_actor(node_agent_name(name), namespace=NAMESPACE)
            except ValueError:
                return None  # it left meanwhile
            self._peer_handles[name] = peer
        return peer

    def _tell(self, nodes: Sequence[str], added: Sequence[Member], removed: Sequence[str], seq: int,
              block: str = "") -> None:
        refs = [peer.network_members.remote(self.config.name, self._incarnation, seq, list(added),
                                            list(removed), block)
                for peer in map(self._peer, nodes) if peer is not None]
        if added and refs:  # the pod starts once the other machines let its traffic in
            ray.wait(refs, num_returns=len(refs), timeout=ANNOUNCE_WAIT_S)

    def inject_fault(self, device_uuid: str, reason: str) -> NodeDescription:
        self.local.inject_fault(self.config.name, device_uuid, reason)
        return self.describe()

    def clear_fault(self, device_uuid: str) -> NodeDescription:
        self.local.clear_fault(self.config.name, device_uuid)
        return self.describe()

    # ---- the group carrier's pods -----------------------------------------------------------
    def launch(self, pod: PodLaunch) -> PodStatus:
        """Start the pod (its placement group holds its slice); idempotent by pod id. Never raises:
        a pod that cannot start is FAILED with why."""
        if pod.pod_id not in self._failed:
            try:
                self.local.launch(pod)
            except GpupoolError as exc:
                self._failed[pod.pod_id] = self._failure(pod.pod_id, exc.message)
            except OSError as exc:
                self._failed[pod.pod_id] = self._failure(pod.pod_id, f"cannot start the pod on "
                                                                    f"{self.config.name}: {exc}")
        self._bump()
        return self.statuses([pod.pod_id])[pod.pod_id]

    def fence(self, epoch: int, expected: int | None = None) -> int:
        """A new leader's takeover (agent/fencing.py): from now on this node refuses launches of an
        older epoch, those of the group carrier (its runner) and of the actor carrier (a pod actor
        checks this node's fence too). With `expected`: `EpochFence.reset`. Returns the epoch the
        node holds afterwards (higher than `epoch`: a store made afresh, or a newer leader)."""
        fence = self.local.agent.runner.fence
        return fence.advance(epoch) if expected is None else fence.reset(epoch, expected)

    def _failure(self, pod_id: str, message: str) -> PodStatus:
        return PodStatus(pod_id, PodPhase.FAILED, message=message, node=self.config.name)

    def statuses(self, pod_ids: list[str]) -> dict[str, PodStatus]:
        """The statuses of these pods (a re-adoption, a stop's wait); one this agent never started is
        LOST."""
        wanted = set(pod_ids)
        found = {s.pod_id: s for s in self.local.poll() if s.pod_id in wanted}
        found.update((p, self._failed[p]) for p in wanted if p in self._failed)
        for pod_id in wanted - found.keys():
            record = self.local.agent.runner.known(pod_id)  # a forgotten pod keeps its record
            found[pod_id] = record_status(self.config.name, record) if record is not None else PodStatus(
                pod_id, PodPhase.LOST, node=self.config.name,
                message=f"node {self.config.name}'s agent has no record of the pod")
        return found

    @ray.method(concurrency_group="watch")
    def watch(self, known: dict[str, PodPhase], wait_s: float = WATCH_MAX_S) -> dict[str, PodStatus]:
        """The statuses of the pods in `known` (pod id -> the phase the caller last saw), answered as
        soon as one of them is in another phase, a pod was launched or exited here, or after
        `wait_s` (at most WATCH_MAX_S). Only for pods whose launch() has answered."""
        deadline = time.monotonic() + min(max(wait_s, 0.0), WATCH_MAX_S)
        with self._changed:
            generation = self._generation
        while True:
            found = self.statuses(list(known))
            remaining = deadline - time.monotonic()
            if remaining <= 0 or any(found[p].phase is not phase for p, phase in known.items()):
                return found
            with self._changed:
                if self._generation == generation:
                    self._changed.wait(min(remaining, 0.5))  # a pod reaped by a poll is seen too
                if self._generation != generation:
                    return self.statuses(list(known))

    def stop(self, pod_id: str, grace_s: float) -> None:
        """SIGTERM the pod's process group, SIGKILL it after `grace_s`; returns at once."""
        if pod_id not in self._failed:
            self.local.stop(pod_id, grace_s)

    def read_log(self, pod_id: str, stream: str, offset: int) -> LogChunk:
        """A pod's log from its files (a pod this agent runs, or an actor-carried pod: its actor not yet
        answering, or gone)."""
        if self.local.agent.runner.known(pod_id) is not None:
            return self.local.read_log(pod_id, stream, offset)
        # An actor-carried pod's files, read only: asked while its actor still starts it, a runner
        # here would end its record (saved before its process) LOST, and end_lent take its namespace.
        try:
            return read_pod_log(self.config.pod_dir(pod_id), pod_id, stream, offset)
        except NotFound:
            raise NotFound(f"No pod {pod_id!r} on node {self.config.name}.") from None

    def process_env(self, names: list[str]) -> dict[str, str]:
        """These variables as the node's Ray worker processes have them (what a pod actor inherits)."""
        return {name: os.environ[name] for name in names if name in os.environ}

    def pid(self) -> int:
        """This agent's process (a restarted agent has another)."""
        return os.getpid()

    def checkpoint_s(self, workload_id: str) -> float | None:
        return self.local.checkpoint_s(workload_id)

    def checkpoint_marks(self, workload_ids: list[str]) -> dict[str, float | None]:
        """`checkpoint_s` of each workload: the driver asks every node for a whole batch at once."""
        return {workload_id: self.local.checkpoint_s(workload_id) for workload_id in workload_ids}

    def forget_workload(self, workload_id: str) -> None:
        self.local.forget_workload(workload_id)

    def forget_pods(self, pod_ids: list[str]) -> None:
        """The server stored these pods' final states: the node's runner stops listing them, so
        `statuses` and `watch` cost what this node's unacknowledged pods cost (logs stay)."""
        self.local.forget_pods(pod_ids)
