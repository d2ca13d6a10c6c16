"""The ray provider: pods run on the Ray nodes gpupool chose, holding exactly their slices.

gpupool is the scheduler: each pod's carrier (carrier.py) is pinned to its node and asks for exactly
the custom resources of its slices, so Ray can only place it there or not at all; Ray never picks a
device and never moves work. The default carrier is a placement group per pod whose process the
node's agent actor runs (carrier_group.py); `pod_carrier="actor"` gives each pod an actor of its own
(carrier_actor.py: one Ray Python worker process per pod, far slower to start).

Consistency: launch() asks Ray for the pod's carrier and returns; a monitor thread reads Ray's node
table, the node agents' descriptions and the pods' statuses, and nodes()/poll() return what it last
saw (eventually consistent, non-blocking). A pod Ray cannot place within `placement_timeout_s` is
failed with the reason; a node that dies takes its pods with it (lost). Carriers are detached and
named by pod id in the gpupool namespace, so a provider started again on the same cluster re-adopts
them, and launching a known pod id never starts it twice.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ray

from gpupool.agent.leftovers import agent_mark, kill_leftovers
from gpupool.agent.netns import NetworkSettings
from gpupool.agent.podstate import load_record
from gpupool.core.model import Node
from gpupool.errors import GpupoolError, InvalidInput, NotFound, ProviderError
from gpupool.pods import HealthEvent, LogChunk, PodLaunch, PodPhase, PodStatus
from gpupool.providers.base import Capability, NetworkBlocks, Provider
from gpupool.providers.nodespec import nodes_from_spec
from gpupool.providers.ray import driver
from gpupool.providers.ray.carrier import Carrier
from gpupool.providers.ray.carrier_actor import ActorCarrier
from gpupool.providers.ray.carrier_group import GroupCarrier
from gpupool.providers.ray.cluster import RayProcess, start_head
from gpupool.providers.ray.join import JoinedNode, claim_pool_id, start_node
from gpupool.providers.ray.membership import Membership
from gpupool.providers.ray.network import RayNetwork
from gpupool.providers.ray.nodeconfig import NodeConfig, node_agent_name
from gpupool.providers.ray.pods import RELEASE_AFTER_POLLS, PodCarrier, TrackedPod
from gpupool.providers.ray.settings import ADDRESS_FILE, NAMESPACE, POD_CARRIER_ENV, TOKEN_FILE, ensure_token
from gpupool.providers.registry import register_provider

log = logging.getLogger("gpupool.ray")
CALL_TIMEOUT_S = 10.0


def _cause(exc: BaseException) -> BaseException:
    """The gpupool error an actor raised, when that is what a Ray error carries."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, GpupoolError) else exc


@register_provider
class RayProvider(Provider):
    """Pods on a Ray cluster: one at `address`, or a head started here (stopped on close).

    `data_dir` holds the cluster token, the address file and simulated nodes' state: the caller (the
    server passes its own data directory) says where, so the provider never reads server settings.
    `pool_id` names the pods' accounts (`gpupool-<pool id>-<tenant>`, the server passes its own) and
    is published in the cluster at connect unless one already is, which is then used instead
    (`pool_id` after start: join.py's `claim_pool_id`)."""

    name = "ray"

    def __init__(self, address: str | None = None, *, simulate: str | None = None,
                 data_dir: Path | str, token_path: Path | str | None = None,
                 placement_timeout_s: float = 60.0, actor_lost_grace_s: float = 30.0,
                 poll_interval_s: float = 0.05, membership_interval_s: float = 0.25,
                 pod_carrier: str | None = None,
                 node_ip: str | None = None, head_env: dict[str, str] | None = None,
                 network: NetworkSettings | None = None, published: Sequence[tuple[str, int]] = (),
                 pool_id: str = "") -> None:
        self.data_dir = Path(data_dir)
        self.pool_id = pool_id
        """The cluster's pool id once connected: what its nodes' pods' accounts are named by."""
        self.token_path = ensure_token(Path(token_path) if token_path else self.data_dir / TOKEN_FILE)
        self.pod_carrier = _carrier_kind(pod_carrier or os.environ.get(POD_CARRIER_ENV) or PodCarrier.GROUP)
        """How new pods are carried (re-adopted pods keep theirs)."""
        self.placement_timeout_s = placement_timeout_s
        self.actor_lost_grace_s = actor_lost_grace_s
        """How long an actor that stopped answering waits to be reported lost: its node's death
        (Ray's health checks take a while) must be seen first, so the server requeues its work."""
        self.poll_interval_s = poll_interval_s
        self.membership_interval_s = membership_interval_s
        """How often Ray's node table is read (joins and deaths are seen this late at most; pods'
        statuses come every `poll_interval_s`, or sooner)."""
        self._head: RayProcess | None = None
        self.joined: list[JoinedNode] = []
        """The simulated nodes this provider started (their Ray worker processes), in order."""
        self._started_s = time.time()
        self.lock = threading.RLock()
        self._pods: dict[str, TrackedPod] = {}
        self._listed: dict[str, TrackedPod] = {}
        """The pods poll() lists (and the monitor watches): all but the finished ones forgotten."""
        self._forgotten_to_release: list[TrackedPod] = []
        """Pods forgotten before their carrier was released: the monitor releases them next."""
        self._agents: dict[str, tuple[str, Any]] = {}
        """node name -> (the Ray node id it was looked up for, its agent's actor handle)."""
        self._carriers: dict[PodCarrier, Carrier] = {PodCarrier.GROUP: GroupCarrier(self),
                                                     PodCarrier.ACTOR: ActorCarrier(self)}
        self._wake = threading.Event()
        self._listeners: list[Callable[[], None]] = []
        self.membership = Membership()
        self.network = RayNetwork(network, published)
        """Each machine's block of the pod network, its routes and plans (network.py)."""
        self._stop = threading.Event()
        self._closed = False
        if address is None:
            self._head = start_head(self.token_path, node_ip=node_ip, extra_env=head_env)
            address = self._head.address
        self.address = address
        try:
            driver.connect(address, self.token_path)
            self._connected = True
            self.pool_id = claim_pool_id(pool_id)  # the caller says where it differs (`gpupool up` does)
            self._write_address()
            if simulate:
                self._start_simulated(simulate, node_ip)
            self.membership.refresh(wait_s=CALL_TIMEOUT_S)
            self._first_plans()
            self._readopt()
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(target=self._monitor, name="gpupool-ray-monitor", daemon=True)
        self._thread.start()

    @property
    def head_is_owned(self) -> bool:
        """Whether this provider started the cluster's head (and stops it on close)."""
        return self._head is not None

    # ---- start-up ---------------------------------------------------------------------------
    def _write_address(self) -> None:
        path = self.data_dir / ADDRESS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.address + "\n")

    def _start_simulated(self, spec: str, node_ip: str | None) -> None:
        """One Ray worker node per simulated node, on this machine, each with its own agent."""
        configs = [NodeConfig(name=node.name, state_dir=str(self.data_dir / "ray-nodes" / node.name),
                              simulate=f"{len(node.devices)}x{node.devices[0].model}" if node.devices else "",
                              pool_id=self.pool_id)
                   for node in nodes_from_spec(spec)]
        with ThreadPoolExecutor(max_workers=min(8, len(configs))) as pool:  # each waits for Ray mostly
            futures = [pool.submit(start_node, self.address, self.token_path, config, node_ip=node_ip,
                                   simulated=True) for config in configs]
            for future in futures:
                with contextlib.suppress(Exception):
                    self.joined.append(future.result())
            for future in futures:
                future.result()  # the first failure, once every started node is known (and stopped by close)
        for joined in self.joined:
            self.membership.update(joined.config.name, joined.node_id, joined.description)

    def _first_plans(self) -> None:
        """Send the nodes known at start their pod network plans and wait for the answers, so they
        are listed at once (network.py: a node is schedulable once its agent has its block)."""
        if not self.network.on:
            return
        self._sync_network()
        for description in self.membership.descriptions():
            self.network.wait(description.node.name, CALL_TIMEOUT_S)
        self._sync_network()

    def _sync_network(self) -> None:
        slots = {d.node.name: d.network_slot for d in self.membership.descriptions()}
        for name, machine, description in self.network.sync(self.membership.table(), self.agent, slots):
            self.membership.update(name, machine, description)

    def use_network_blocks(self, blocks: NetworkBlocks) -> None:
        self.network.use_blocks(blocks)

    def _readopt(self) -> None:
        """Take over the pods a previous server left running (their carriers, by name)."""
        for carrier in self._carriers.values():
            for tracked in carrier.readopt():
                tracked = self._pods.setdefault(tracked.pod_id, tracked)
                self._listed.setdefault(tracked.pod_id, tracked)
        if self._pods:
            log.info("re-adopted %d pod(s) on the Ray cluster", len(self._pods))

    # ---- contract ---------------------------------------------------------------------------
    def missing_capabilities(self) -> dict[Capability, str]:
        descriptions = self.membership.descriptions()
        if not descriptions:
            return {Capability.GPU: "no node has joined the Ray cluster yet (gpupool node join)",
                    Capability.FAULT_INJECTION: "no simulated node has joined"}
        missing: dict[Capability, str] = {}
        for description in sorted(descriptions, key=lambda d: d.node.name):
            for capability, reason in description.missing.items():
                if capability is not Capability.MULTI_NODE:
                    missing.setdefault(capability, f"node {description.node.name}: {reason}")
        if any(d.config.simulate for d in descriptions):
            missing.pop(Capability.FAULT_INJECTION, None)
        return missing

    def nodes(self) -> list[Node]:
        return [node for node in self.membership.nodes() if self.network.ready(node.name)]

    def node_address(self, node: str) -> str:
        """The address other nodes reach `node` by (its Ray node's IP); NotFound if unknown."""
        ray_node = self.membership.ray_node(node)
        if ray_node is None:
            raise NotFound(f"No node {node!r} on the Ray cluster.")
        return ray_node.ip

    def gang_address(self, node: str, port: int) -> str:
        return self.network.gang_address(node, port) or self.node_address(node)

    def launch(self, pod: PodLaunch) -> None:
        with self.lock:
            if pod.pod_id in self._pods:
                return
        description = self.membership.description(pod.node)
        ray_node = self.membership.ray_node(pod.node)
        if description is None or ray_node is None:
            raise ProviderError(f"Unknown node {pod.node!r}; the Ray cluster has "
                                f"{', '.join(n.name for n in self.nodes()) or 'no gpupool nodes'}.")
        tracked = self._carriers[self.pod_carrier].launch(pod, description, ray_node)
        with self.lock:
            tracked = self._pods.setdefault(pod.pod_id, tracked)
            self._listed.setdefault(pod.pod_id, tracked)
        self._wake.set()

    def fence(self, epoch: int, confirm: Callable[[], None] | None = None) -> None:
        """Every node's agent learns the epoch at once (agent/fencing.py: each refuses older launches
        from now on, once those being let go are on record), waited for together up to CALL_TIMEOUT_S.
        A node holding a higher epoch is set back to `epoch` only after `confirm` (it raises unless
        `epoch` is the store's: a store made afresh) and only if it still holds what it answered. A
        node that does not answer is not fenced: the deposed leader's launches to it are stopped
        by the launch worker's own check only (docs/ha.md)."""
        asked: dict[str, Any] = {}
        for description in self.membership.descriptions():
            name = description.node.name
            with contextlib.suppress(GpupoolError):
                asked[name] = self.agent(name).fence.remote(epoch)
        held = self._answers(asked)
        higher = {name: at for name, at in held.items() if at > epoch}
        if higher and confirm is not None:
            confirm()
            held.update(self._answers({name: self.agent(name).fence.remote(epoch, at)
                                       for name, at in higher.items()}))
        for name in sorted(set(asked) - set(held)):
            log.warning("node %s did not learn leader epoch %d in time: it does not fence launches by "
                        "it yet", name, epoch)

    def _answers(self, asked: dict[str, Any]) -> dict[str, int]:
        """The answers of the calls in `asked` (node -> ref) that came within CALL_TIMEOUT_S."""
        if not asked:
            return {}
        ready, _late = ray.wait(list(asked.values()), num_returns=len(asked), timeout=CALL_TIMEOUT_S)
        answered: dict[str, int] = {}
        for name, ref in asked.items():
            if ref in ready:
                with contextlib.suppress(ray.exceptions.RayError):
                    answered[name] = int(ray.get(ref, timeout=0))
        return answered

    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        with self.lock:
            tracked = self._pods.get(pod_id)
            if tracked is None or tracked.status.phase.is_final or tracked.stop_grace_s is not None:
                return
            tracked.stop_grace_s, tracked.stop_asked_s = grace_s, time.monotonic()
            with contextlib.suppress(ray.exceptions.RayError, GpupoolError):  # a gone node: lost soon
                self._carriers[tracked.carrier].stop(tracked, grace_s)
        self._wake.set()

    def poll(self) -> list[PodStatus]:
        with self.lock:
            statuses = []
            for tracked in self._listed.values():
                if tracked.status.phase.is_final:
                    tracked.final_polls += 1
                statuses.append(tracked.status)
            return statuses

    def forget_pods(self, pod_ids: Sequence[str]) -> None:
        """The server stored these pods' final states: poll() leaves them out, the monitor releases
        their carriers now rather than after RELEASE_AFTER_POLLS polls, and the node agents that ran
        them (group carrier) are told too, without waiting for their answers."""
        by_node: dict[str, list[str]] = {}
        with self.lock:
            for pod_id in pod_ids:
                tracked = self._listed.get(pod_id)
                if tracked is not None and tracked.status.phase.is_final:
                    del self._listed[pod_id]
                    if not tracked.released:
                        self._forgotten_to_release.append(tracked)
                    if tracked.carrier is PodCarrier.GROUP:
                        by_node.setdefault(tracked.node, []).append(pod_id)
        for node, ids in by_node.items():
            with contextlib.suppress(GpupoolError, ray.exceptions.RayError):  # a gone node forgets all
                self.agent(node).forget_pods.remote(ids)

    def add_exit_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` from the monitor thread when pods have ended."""
        self._listeners.append(listener)

    def read_log(self, pod_id: str, stream: str = "stdout", offset: int = 0) -> LogChunk:
        with self.lock:
            tracked = self._pods.get(pod_id)
        if tracked is None:
            raise NotFound(f"No pod {pod_id!r} on the Ray cluster.")
        def ask() -> LogChunk:
            chunk: LogChunk = ray.get(self._carriers[tracked.carrier].log_ref(tracked, stream, offset),
                                      timeout=CALL_TIMEOUT_S)
            return chunk

        try:
            released = tracked.released
            try:
                return ask()
            except ray.exceptions.RayError as exc:
                if released or not tracked.released or isinstance(_cause(exc), GpupoolError):
                    raise
                # The monitor released the pod while it was asked (an actor carrier's actor then
                # exits before the call reaches it): its carrier now sends the call where a
                # released pod's log is read, the node agent.
                return ask()
        except ray.exceptions.RayError as exc:
            cause = _cause(exc)
            if isinstance(cause, GpupoolError):
                raise cause from None
            raise ProviderError(f"Cannot read pod {pod_id}'s log from node {tracked.node} "
                                f"({type(exc).__name__}).") from None
        except TimeoutError:
            raise ProviderError(f"Node {tracked.node} did not send pod {pod_id}'s log within "
                                f"{CALL_TIMEOUT_S:.0f} s.") from None

    def agent(self, node: str) -> Any:
        """The node agent actor of `node`; NotFound when it has none. Handles are kept per Ray node
        (a named-actor lookup is a GCS round trip, and every launch and status poll needs one); a
        node that joins again under the same name has a new Ray node id, so a new agent is looked up."""
        ray_node = self.membership.ray_node(node)
        node_id = ray_node.node_id if ray_node is not None else ""
        with self.lock:
            known = self._agents.get(node)
        if known is not None and known[0] == node_id and node_id:
            return known[1]
        try:
            handle = ray.get_actor(node_agent_name(node), namespace=NAMESPACE)
        except ValueError:
            raise NotFound(f"No node {node!r} on the Ray cluster.") from None
        if node_id:
            with self.lock:
                self._agents[node] = (node_id, handle)
        return handle

    def _agent_call(self, node: str, method: str, *args: Any) -> Any:
        if self.membership.description(node) is None:
            raise NotFound(f"No node {node!r} on the Ray cluster.")
        try:
            return ray.get(getattr(self.agent(node), method).remote(*args), timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayError as exc:
            cause = _cause(exc)
            if isinstance(cause, GpupoolError):
                raise cause from None
            raise ProviderError(f"Node {node}'s agent did not answer ({type(exc).__name__}).") from None
        except TimeoutError:
            raise ProviderError(f"Node {node}'s agent did not answer within {CALL_TIMEOUT_S:.0f} s.") \
                from None

    def inject_fault(self, node: str, device_uuid: str = "", reason: str = "injected fault") -> None:
        self._fault(node, "inject_fault", device_uuid, reason)

    def clear_fault(self, node: str, device_uuid: str = "") -> None:
        self._fault(node, "clear_fault", device_uuid)

    def _fault(self, node: str, method: str, *args: str) -> None:
        description = self._agent_call(node, method, *args)
        ray_node = self.membership.ray_node(node)
        if ray_node is not None:
            self.membership.update(node, ray_node.node_id, description)

    def health_events(self) -> list[HealthEvent]:
        """The health changes seen since this provider started (a node agent keeps older ones)."""
        events = [e for d in self.membership.descriptions() for e in d.events if e.time_s >= self._started_s]
        return sorted(events, key=lambda e: e.time_s)

    def checkpoint_s(self, workload_id: str) -> float | None:
        return self.checkpoint_marks([workload_id])[workload_id]  # every node at once, not in turn

    def checkpoint_marks(self, workload_ids: Sequence[str]) -> dict[str, float | None]:
        """Every node agent is asked at once, one call each for all of `workload_ids`, and the
        answers are awaited together for at most CALL_TIMEOUT_S (not that long per node, in turn):
        a node that does not answer in time adds no mark."""
        ids = list(dict.fromkeys(workload_ids))
        marks: dict[str, float | None] = dict.fromkeys(ids)
        if not ids:
            return marks
        asked = []
        for description in self.membership.descriptions():
            with contextlib.suppress(GpupoolError):
                asked.append(self.agent(description.node.name).checkpoint_marks.remote(ids))
        if not asked:
            return marks
        answered, _late = ray.wait(asked, num_returns=len(asked), timeout=CALL_TIMEOUT_S)
        for ref in answered:
            try:
                answer: dict[str, float | None] = ray.get(ref, timeout=0)
            except (ray.exceptions.RayError, TimeoutError):
                continue  # that agent failed: its marks are unknown, as with checkpoint_s
            for workload_id, mark in answer.items():
                known = marks.get(workload_id)
                if mark is not None and workload_id in marks and (known is None or mark > known):
                    marks[workload_id] = mark
        return marks

    def forget_workload(self, workload_id: str) -> None:
        for description in self.membership.descriptions():
            with contextlib.suppress(GpupoolError):
                self.agent(description.node.name).forget_workload.remote(workload_id)

    # ---- the monitor ------------------------------------------------------------------------
    def _monitor(self) -> None:
        refreshed = 0.0
        while not self._stop.is_set():
            self._pause()
            try:
                now = time.monotonic()
                if now - refreshed >= self.membership_interval_s:
                    self.membership.refresh()
                    refreshed = now
                    if self.network.on:
                        self._sync_network()
                ended = self._check_pods()
            except Exception:  # Ray unreachable for a moment: try again at the next tick
                log.exception("Ray monitor step failed")
                continue
            if ended:
                for listener in self._listeners:
                    listener()

    def _pause(self) -> None:
        """Wait a poll interval, or less: until a launch or stop, or an answer in flight comes back."""
        refs = [ref for carrier in self._carriers.values() for ref in carrier.in_flight()]
        if refs and not self._wake.is_set():
            ray.wait(refs, num_returns=1, timeout=self.poll_interval_s)
            time.sleep(self.poll_interval_s / 10)  # let the other answers of the round arrive too
        else:
            self._wake.wait(self.poll_interval_s)
        self._wake.clear()

    def _check_pods(self) -> bool:
        with self.lock:
            live = [p for p in self._listed.values() if not p.status.phase.is_final]
            to_release = [p for p in self._listed.values() if p.status.phase.is_final and not p.released
                          and p.final_polls >= RELEASE_AFTER_POLLS]
            to_release += [p for p in self._forgotten_to_release if not p.released]
            self._forgotten_to_release = []
        ended = self._lose_pods_of_gone_nodes(live)
        now = time.monotonic()
        for kind, carrier in self._carriers.items():
            mine = [p for p in live if p.carrier is kind and not p.status.phase.is_final]
            ended |= carrier.step(mine, now)
        for tracked in to_release:
            self._carriers[tracked.carrier].release(tracked)
        return ended

    def _lose_pods_of_gone_nodes(self, live: list[TrackedPod]) -> bool:
        lost: list[TrackedPod] = []
        for tracked in live:
            reason = self.membership.lost_reason(tracked.node)
            if reason is None:
                continue
            with self.lock:
                tracked.finish(PodPhase.LOST, reason)
            self._carriers[tracked.carrier].release(tracked)
            lost.append(tracked)
        self._end_simulated_leftovers(lost)
        return bool(lost)

    def _end_simulated_leftovers(self, lost: list[TrackedPod]) -> None:
        """A simulated node that died is a process group on this machine, and its pods (each in a
        session of its own) outlived it; a real machine's death would take them, so end them."""
        simulated = {j.config.name: j.config for j in self.joined}
        leftovers: dict[str, dict[str, tuple[int, str | None]]] = {}  # by the agent's mark
        for tracked in lost:
            config = simulated.get(tracked.node)
            if config is None:
                continue
            state_file = self._carriers[tracked.carrier].state_file(config, tracked.pod_id)
            record = load_record(state_file)
            if not isinstance(record, str):
                uid = os.geteuid() if record.uid is None else record.uid
                mark = agent_mark(state_file.parents[2])  # the state directory of the pod's agent
                leftovers.setdefault(mark, {})[tracked.pod_id] = (uid, record.cgroup)
        for mark, pods in leftovers.items():
            kill_leftovers(pods, mark)

    # ---- shutdown ---------------------------------------------------------------------------
    def close(self, *, stop_pods: bool = False) -> None:
        """Stop the monitor and disconnect. Pods keep running for the next provider to re-adopt,
        unless `stop_pods` or this provider started the cluster itself (its head stops with it);
        then their processes are stopped first. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        thread = getattr(self, "_thread", None)
        if thread is not None:
            thread.join(timeout=10)
        owned = self._head is not None or bool(self.joined)
        if getattr(self, "_connected", False):
            if stop_pods or owned:
                self._stop_all_pods()
            driver.disconnect()
        if self.joined:
            with ThreadPoolExecutor(max_workers=len(self.joined)) as pool:  # each waits for its grace
                list(pool.map(lambda joined: joined.process.stop(), self.joined))
        if self._head is not None:
            self._head.stop()

    def _stop_all_pods(self, grace_s: float = 5.0) -> None:
        with self.lock:
            live = [p for p in self._pods.values() if not p.released]
        for kind, carrier in self._carriers.items():
            mine = [p for p in live if p.carrier is kind]
            if mine:
                carrier.stop_all(mine, grace_s)


def _carrier_kind(name: str) -> PodCarrier:
    try:
        return PodCarrier(name)
    except ValueError:
        raise InvalidInput(f"Unknown Ray pod carrier {name!r}; choose one of "
                           f"{', '.join(c.value for c in PodCarrier)}.") from None
