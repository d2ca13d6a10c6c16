"""The actor carrier: one detached, named actor per pod (`RayProvider(pod_carrier="actor")`).

The actor is pinned to the node (NodeAffinitySchedulingStrategy, soft=False), holds its slices'
custom resources and runs the pod with the agent's code (actor.py), in a network namespace its
node's agent lends it, as the group carrier's pods get theirs. Each actor is a Ray Python
worker process of its own, started for it and never reused: about a second of CPU per pod, which is
why the group carrier is the default.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.ray.actor import PodActor
from gpupool.providers.ray.carrier import Carrier
from gpupool.providers.ray.membership import RayNode
from gpupool.providers.ray.node_agent import NodeDescription
from gpupool.providers.ray.nodeconfig import POD_ACTOR_PREFIX, NodeConfig, pod_actor_name
from gpupool.providers.ray.pods import PodCarrier, TrackedPod
from gpupool.providers.ray.resources import slice_resources
from gpupool.providers.ray.settings import NAMESPACE

CALL_TIMEOUT_S = 10.0


class ActorCarrier(Carrier):
    kind = PodCarrier.ACTOR

    def launch(self, pod: PodLaunch, description: NodeDescription, ray_node: RayNode) -> TrackedPod:
        memory_known = {d.index for d in description.node.devices if d.memory_mib}
        actor = PodActor.options(  # type: ignore[attr-defined]
            name=pod_actor_name(pod.pod_id), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
            resources=slice_resources(pod.node, pod.slices, memory_known),
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node.node_id, soft=False),
        ).remote(pod, description.config)
        starting = PodStatus(pod.pod_id, PodPhase.STARTING, node=pod.node)
        return TrackedPod(pod.pod_id, pod.node, self.kind, starting, actor=actor)

    def readopt(self) -> list[TrackedPod]:
        adopted: list[TrackedPod] = []
        for name in ray.util.list_named_actors():
            if not name.startswith(POD_ACTOR_PREFIX):
                continue
            with contextlib.suppress(ValueError):
                actor = ray.get_actor(name, namespace=NAMESPACE)
                try:
                    status: Any = ray.get(actor.status.remote(), timeout=CALL_TIMEOUT_S)
                except (ray.exceptions.RayError, TimeoutError):
                    continue
                adopted.append(TrackedPod(name[len(POD_ACTOR_PREFIX):], status.node, self.kind, status,
                                          actor=actor, placed=True))
        return adopted

    def stop(self, tracked: TrackedPod, grace_s: float) -> None:
        tracked.actor.stop.remote(grace_s)  # runs once the actor is up (calls queue behind creation)

    def step(self, live: list[TrackedPod], now_s: float) -> bool:
        ended = False
        for tracked in live:
            if tracked.died_at_s is not None:
                ended |= self.lost_after_grace(tracked, now_s)
            elif tracked.pending is None:
                tracked.pending = tracked.actor.status.remote()
        pending = [p for p in live if p.pending is not None and p.died_at_s is None]
        ready = set(ray.wait([p.pending for p in pending], num_returns=len(pending), timeout=0)[0]) \
            if pending else set()
        for tracked in pending:
            if tracked.pending in ready:
                ended |= self._take_status(tracked, now_s)
            elif not tracked.placed and now_s - tracked.created_s > self.host.placement_timeout_s:
                ended |= self._unplaceable(tracked)
        return ended

    def in_flight(self) -> list[Any]:
        return []

    def _take_status(self, tracked: TrackedPod, now_s: float) -> bool:
        ref, tracked.pending = tracked.pending, None
        try:
            status: PodStatus = ray.get(ref)
        except ray.exceptions.ActorUnschedulableError as exc:
            with self.host.lock:
                tracked.finish(PodPhase.FAILED, f"Ray could not place the pod on node {tracked.node}: "
                                                f"{str(exc).strip().splitlines()[0][:200]}")
                tracked.released = True
            return True
        except ray.exceptions.RayError as exc:
            self.failed_call(tracked, now_s, f"the pod's Ray actor on node {tracked.node} died "
                                             f"({type(exc).__name__}); whether the pod ran to the end "
                                             "is unknown")
            return False
        with self.host.lock:
            tracked.placed = True
            if not tracked.status.phase.is_final:
                tracked.status = status
            return status.phase.is_final

    def _unplaceable(self, tracked: TrackedPod) -> bool:
        with contextlib.suppress(ray.exceptions.RayError):
            ray.kill(tracked.actor, no_restart=True)
        self.finish_unplaced(tracked, "actor")
        with self.host.lock:
            tracked.released = True
        return True

    def release(self, tracked: TrackedPod) -> None:
        tracked.released = True
        with contextlib.suppress(ray.exceptions.RayError):
            tracked.actor.shutdown.remote()

    def log_ref(self, tracked: TrackedPod, stream: str, offset: int) -> Any:
        if not tracked.released and tracked.placed:
            return tracked.actor.read_log.remote(stream, offset)
        return self.host.agent(tracked.node).read_log.remote(tracked.pod_id, stream, offset)

    def stop_all(self, pods: list[TrackedPod], grace_s: float) -> None:
        refs = []
        for tracked in pods:
            with contextlib.suppress(ray.exceptions.RayError):
                tracked.actor.stop.remote(grace_s)
                refs.append(tracked.actor.status.remote())
        deadline = time.monotonic() + grace_s + 5.0
        for tracked, ref in zip(pods, refs, strict=False):
            with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
                while time.monotonic() < deadline:
                    if ray.get(ref, timeout=max(0.1, deadline - time.monotonic())).phase.is_final:
                        break
                    ref = tracked.actor.status.remote()
                    time.sleep(0.1)
            with contextlib.suppress(ray.exceptions.RayError):
                ray.kill(tracked.actor, no_restart=True)

    def state_file(self, config: NodeConfig, pod_id: str) -> Path:
        return config.pod_record(pod_id)
