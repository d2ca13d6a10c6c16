"""The ray provider: pods run as actors on the Ray nodes gpupool chose, holding exactly their slices.

gpupool is the scheduler: each pod's actor is pinned to its node (NodeAffinitySchedulingStrategy,
soft=False) and asks for exactly the custom resources of its slices, so Ray can only start it there
or not at all; Ray never picks a device and never moves work (max_restarts=0).

Consistency: launch() creates the actor and returns; a monitor thread asks Ray for the node table,
the node agents for their descriptions and the pod actors for their statuses, and nodes()/poll()
return what it last saw (eventually consistent, non-blocking). A pod whose actor Ray cannot place
within `placement_timeout_s` is failed with the reason; a node that dies takes its pods with it
(lost). Actors are detached and named by pod id in the gpupool namespace, so a provider started
again on the same cluster re-adopts them, and launching a known pod id never starts it twice.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from gpupool.agent.leftovers import kill_leftovers
from gpupool.agent.podstate import load_record
from gpupool.core.model import Node
from gpupool.errors import GpupoolError, NotFound, ProviderError
from gpupool.providers.base import Capability, HealthEvent, LogChunk, PodLaunch, PodPhase, PodStatus, Provider
from gpupool.providers.nodespec import nodes_from_spec
from gpupool.providers.ray import driver
from gpupool.providers.ray.actor import PodActor
from gpupool.providers.ray.cluster import RayProcess, start_head
from gpupool.providers.ray.join import JoinedNode, start_node
from gpupool.providers.ray.membership import Membership
from gpupool.providers.ray.nodeconfig import POD_ACTOR_PREFIX, NodeConfig, node_agent_name, pod_actor_name
from gpupool.providers.ray.pods import RELEASE_AFTER_POLLS, TrackedPod
from gpupool.providers.ray.resources import slice_resources
from gpupool.providers.ray.settings import ADDRESS_FILE, NAMESPACE, TOKEN_FILE, ensure_token
from gpupool.providers.registry import register_provider

log = logging.getLogger("gpupool.ray")
CALL_TIMEOUT_S = 10.0


def _cause(exc: BaseException) -> BaseException:
    """The gpupool error an actor raised, when that is what a Ray error carries."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, GpupoolError) else exc


@register_provider
class RayProvider(Provider):
    """Pods on a Ray cluster: one at `address`, or a head started here (stopped on close)."""

    name = "ray"

    def __init__(self, address: str | None = None, *, simulate: str | None = None,
                 data_dir: Path | str | None = None, token_path: Path | str | None = None,
                 placement_timeout_s: float = 60.0, actor_lost_grace_s: float = 30.0,
                 poll_interval_s: float = 0.1,
                 node_ip: str | None = None, head_env: dict[str, str] | None = None) -> None:
        if data_dir is None:
            from gpupool.server.settings import default_data_dir

            data_dir = default_data_dir()
        self.data_dir = Path(data_dir)
        self.token_path = ensure_token(Path(token_path) if token_path else self.data_dir / TOKEN_FILE)
        self.placement_timeout_s = placement_timeout_s
        self.actor_lost_grace_s = actor_lost_grace_s
        """How long an actor that stopped answering waits to be reported lost: its node's death
        (Ray's health checks take a while) must be seen first, so the server requeues its work."""
        self._poll_interval_s = poll_interval_s
        self._head: RayProcess | None = None
        self.joined: list[JoinedNode] = []
        """The simulated nodes this provider started (their Ray worker processes), in order."""
        self._started_s = time.time()
        self._lock = threading.RLock()
        self._pods: dict[str, TrackedPod] = {}
        self._listeners: list[Callable[[], None]] = []
        self.membership = Membership()
        self._stop = threading.Event()
        self._closed = False
        if address is None:
            self._head = start_head(self.token_path, node_ip=node_ip, extra_env=head_env)
            address = self._head.address
        self.address = address
        try:
            driver.connect(address, self.token_path)
            self._connected = True
            self._write_address()
            if simulate:
                self._start_simulated(simulate, node_ip)
            self.membership.refresh(wait_s=CALL_TIMEOUT_S)
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
                              simulate=f"{len(node.devices)}x{node.devices[0].model}" if node.devices else "")
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

    def _readopt(self) -> None:
        """Take over the pod actors a previous server left running (by their names)."""
        names = [n for n in ray.util.list_named_actors() if n.startswith(POD_ACTOR_PREFIX)]
        for name in names:
            with contextlib.suppress(ValueError):
                actor = ray.get_actor(name, namespace=NAMESPACE)
                pod_id = name[len(POD_ACTOR_PREFIX):]
                try:
                    answer: Any = ray.get(actor.status.remote(), timeout=CALL_TIMEOUT_S)
                except (ray.exceptions.RayError, TimeoutError):
                    continue
                status: PodStatus = answer
                self._pods[pod_id] = TrackedPod(pod_id, status.node, actor, status, placed=True)
        if self._pods:
            log.info("re-adopted %d pod actor(s) on the Ray cluster", len(self._pods))

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
        return self.membership.nodes()

    def node_address(self, node: str) -> str:
        """The address other nodes reach `node` by (its Ray node's IP); NotFound if unknown."""
        ray_node = self.membership.ray_node(node)
        if ray_node is None:
            raise NotFound(f"No node {node!r} on the Ray cluster.")
        return ray_node.ip

    def launch(self, pod: PodLaunch) -> None:
        with self._lock:
            if pod.pod_id in self._pods:
                return
        description = self.membership.description(pod.node)
        ray_node = self.membership.ray_node(pod.node)
        if description is None or ray_node is None:
            raise ProviderError(f"Unknown node {pod.node!r}; the Ray cluster has "
                                f"{', '.join(n.name for n in self.nodes()) or 'no gpupool nodes'}.")
        memory_known = {d.index for d in description.node.devices if d.memory_mib}
        actor = PodActor.options(  # type: ignore[attr-defined]
            name=pod_actor_name(pod.pod_id), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
            resources=slice_resources(pod.node, pod.slices, memory_known),
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node.node_id, soft=False),
        ).remote(pod, description.config)
        with self._lock:
            if pod.pod_id not in self._pods:
                self._pods[pod.pod_id] = TrackedPod(pod.pod_id, pod.node, actor,
                                                    PodStatus(pod.pod_id, PodPhase.STARTING, node=pod.node))

    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        with self._lock:
            tracked = self._pods.get(pod_id)
            if tracked is None or tracked.status.phase.is_final or tracked.stop_grace_s is not None:
                return
            tracked.stop_grace_s = grace_s
            tracked.actor.stop.remote(grace_s)  # runs once the actor is up (calls queue behind creation)

    def poll(self) -> list[PodStatus]:
        with self._lock:
            statuses = []
            for tracked in self._pods.values():
                if tracked.status.phase.is_final:
                    tracked.final_polls += 1
                statuses.append(tracked.status)
            return statuses

    def add_exit_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` from the monitor thread when pods have ended."""
        self._listeners.append(listener)

    def read_log(self, pod_id: str, stream: str = "stdout", offset: int = 0) -> LogChunk:
        with self._lock:
            tracked = self._pods.get(pod_id)
        if tracked is None:
            raise NotFound(f"No pod {pod_id!r} on the Ray cluster.")
        try:
            if not tracked.released and tracked.placed:
                ref = tracked.actor.read_log.remote(stream, offset)
            else:
                ref = self._agent(tracked.node).read_log.remote(pod_id, stream, offset)
            chunk: LogChunk = ray.get(ref, timeout=CALL_TIMEOUT_S)
            return chunk
        except ray.exceptions.RayError as exc:
            cause = _cause(exc)
            if isinstance(cause, GpupoolError):
                raise cause from None
            raise ProviderError(f"Cannot read pod {pod_id}'s log from node {tracked.node} "
                                f"({type(exc).__name__}).") from None
        except TimeoutError:
            raise ProviderError(f"Node {tracked.node} did not send pod {pod_id}'s log within "
                                f"{CALL_TIMEOUT_S:.0f} s.") from None

    def _agent(self, node: str) -> Any:
        try:
            return ray.get_actor(node_agent_name(node), namespace=NAMESPACE)
        except ValueError:
            raise NotFound(f"No node {node!r} on the Ray cluster.") from None

    def _agent_call(self, node: str, method: str, *args: Any) -> Any:
        if self.membership.description(node) is None:
            raise NotFound(f"No node {node!r} on the Ray cluster.")
        try:
            return ray.get(getattr(self._agent(node), method).remote(*args), timeout=CALL_TIMEOUT_S)
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
        marks = []
        for description in self.membership.descriptions():
            with contextlib.suppress(GpupoolError):
                marks.append(self._agent_call(description.node.name, "checkpoint_s", workload_id))
        return max((m for m in marks if m is not None), default=None)

    def forget_workload(self, workload_id: str) -> None:
        for description in self.membership.descriptions():
            with contextlib.suppress(GpupoolError):
                self._agent(description.node.name).forget_workload.remote(workload_id)

    # ---- the monitor ------------------------------------------------------------------------
    def _monitor(self) -> None:
        while not self._stop.wait(self._poll_interval_s):
            try:
                self.membership.refresh()
                ended = self._check_pods()
            except Exception:  # Ray unreachable for a moment: try again at the next tick
                log.exception("Ray monitor step failed")
                continue
            if ended:
                for listener in self._listeners:
                    listener()

    def _check_pods(self) -> bool:
        with self._lock:
            live = [p for p in self._pods.values() if not p.status.phase.is_final]
            to_release = [p for p in self._pods.values() if p.status.phase.is_final and not p.released
                          and p.final_polls >= RELEASE_AFTER_POLLS]
        ended = self._lose_pods_of_gone_nodes(live)
        now = time.monotonic()
        for tracked in live:
            if tracked.died_at_s is not None:
                if now - tracked.died_at_s >= self.actor_lost_grace_s:
                    with self._lock:
                        tracked.finish(PodPhase.LOST, tracked.died_reason)
                        tracked.released = True
                    ended = True
                continue
            if tracked.pending is None and not tracked.status.phase.is_final:
                tracked.pending = tracked.actor.status.remote()
        pending = [p for p in live if p.pending is not None]
        ready = set(ray.wait([p.pending for p in pending], num_returns=len(pending), timeout=0)[0]) \
            if pending else set()
        for tracked in pending:
            if tracked.pending in ready:
                ended |= self._take_status(tracked)
            elif not tracked.placed and now - tracked.created_s > self.placement_timeout_s:
                ended |= self._unplaceable(tracked)
        for tracked in to_release:
            tracked.released = True
            with contextlib.suppress(ray.exceptions.RayError):
                tracked.actor.shutdown.remote()
        return ended

    def _take_status(self, tracked: TrackedPod) -> bool:
        ref, tracked.pending = tracked.pending, None
        try:
            status: PodStatus = ray.get(ref)
        except ray.exceptions.ActorUnschedulableError as exc:
            with self._lock:
                tracked.finish(PodPhase.FAILED, f"Ray could not place the pod on node {tracked.node}: "
                                                f"{str(exc).strip().splitlines()[0][:200]}")
                tracked.released = True
            return True
        except ray.exceptions.RayError as exc:
            tracked.died_at_s = time.monotonic()
            tracked.died_reason = (f"the pod's Ray actor on node {tracked.node} died ({type(exc).__name__}); "
                                   "whether the pod ran to the end is unknown")
            return False
        with self._lock:
            tracked.placed = True
            if not tracked.status.phase.is_final:
                tracked.status = status
            return status.phase.is_final

    def _unplaceable(self, tracked: TrackedPod) -> bool:
        with contextlib.suppress(ray.exceptions.RayError):
            ray.kill(tracked.actor, no_restart=True)
        with self._lock:
            if tracked.stop_grace_s is not None:
                tracked.finish(PodPhase.STOPPED, "stopped before Ray could place it")
            else:
                tracked.finish(PodPhase.FAILED,
                               f"Ray could not place the pod's actor on node {tracked.node} within "
                               f"{self.placement_timeout_s:.0f} s (the node lacks the slice's free resources "
                               "or does not answer)")
            tracked.released = True
        return True

    def _lose_pods_of_gone_nodes(self, live: list[TrackedPod]) -> bool:
        lost: list[TrackedPod] = []
        for tracked in live:
            reason = self.membership.lost_reason(tracked.node)
            if reason is None:
                continue
            with self._lock:
                tracked.finish(PodPhase.LOST, reason)
                tracked.released = True
            lost.append(tracked)
        self._end_simulated_leftovers(lost)
        return bool(lost)

    def _end_simulated_leftovers(self, lost: list[TrackedPod]) -> None:
        """A simulated node that died is a process group on this machine, and its pods (each in a
        session of its own) outlived it; a real machine's death would take them, so end them."""
        simulated = {j.config.name: j.config for j in self.joined}
        leftovers: dict[str, tuple[int, str | None]] = {}
        for tracked in lost:
            config = simulated.get(tracked.node)
            if config is None:
                continue
            record = load_record(config.pod_dir(tracked.pod_id) / "pods" / tracked.pod_id / "state.json")
            if not isinstance(record, str):
                uid = os.geteuid() if record.uid is None else record.uid
                leftovers[tracked.pod_id] = (uid, record.cgroup)
        if leftovers:
            kill_leftovers(leftovers)

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
        with self._lock:
            live = [p for p in self._pods.values() if not p.released]
        refs = []
        for tracked in live:
            with contextlib.suppress(ray.exceptions.RayError):
                tracked.actor.stop.remote(grace_s)
                refs.append(tracked.actor.status.remote())
        deadline = time.monotonic() + grace_s + 5.0
        for tracked, ref in zip(live, refs, strict=False):
            with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
                while time.monotonic() < deadline:
                    if ray.get(ref, timeout=max(0.1, deadline - time.monotonic())).phase.is_final:
                        break
                    ref = tracked.actor.status.remote()
                    time.sleep(0.1)
            with contextlib.suppress(ray.exceptions.RayError):
                ray.kill(tracked.actor, no_restart=True)
