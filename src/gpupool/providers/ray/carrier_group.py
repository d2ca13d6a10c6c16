"""The group carrier (the default): a named, detached placement group per pod, run by the node agent.

launch() creates the pod's group: one bundle holding exactly its slices' custom resources and one
unit of its node's pod resource, which only that node advertises, so Ray can place the group there
or nowhere. Once Ray reports it placed, the node's agent actor (already running on the node) starts
the pod's process with the agent's code; until then nothing runs. Statuses come from the node
agents: the launch call's answer, then `watch` calls in flight on each busy node covering all its
pods (usually one), which the agent answers as soon as one of them changes (node_agent.py). The
group is removed once the pod has ended and its final status was polled: Ray's accounting holds the
slice exactly that long. A pod asked to stop before its group is placed still starts (and gets its
SIGTERM) if the group is placed within the stop's grace; otherwise it ends STOPPED without having
run. Groups are named `pod-<id>` in the gpupool namespace, so a provider started again re-adopts
them. No Python process is started per pod.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.ray.carrier import Carrier, CarrierHost
from gpupool.providers.ray.membership import RayNode, ray_node_table
from gpupool.providers.ray.node_agent import NodeDescription
from gpupool.providers.ray.nodeconfig import POD_ACTOR_PREFIX, NodeConfig, pod_actor_name
from gpupool.providers.ray.pods import PodCarrier, TrackedPod
from gpupool.providers.ray.resources import pod_bundle

CALL_TIMEOUT_S = 10.0


class GroupCarrier(Carrier):
    kind = PodCarrier.GROUP

    def __init__(self, host: CarrierHost) -> None:
        super().__init__(host)
        self._asking: dict[Any, list[TrackedPod]] = {}
        """A node agent's watch() call in flight -> the pods it watches. Every watchable pod is in one:
        a pod whose launch answers while its node's watch is out gets a watch of its own (an exit
        before that watch began would not wake the other)."""
        self._awaited: list[Any] = []
        """What the last step left to answer besides the watches: the readiness refs of the groups
        not placed yet and the launch calls in flight (the monitor wakes on any of them)."""

    def launch(self, pod: PodLaunch, description: NodeDescription, ray_node: RayNode) -> TrackedPod:
        memory_known = {d.index for d in description.node.devices if d.memory_mib}
        bundle = pod_bundle(pod.node, pod.slices, memory_known)
        try:
            group = placement_group([bundle], strategy="STRICT_PACK", name=pod_actor_name(pod.pod_id),
                                    lifetime="detached")
        except ValueError:  # a group of that name exists: a launch raced a re-adoption
            group = ray.util.get_placement_group(pod_actor_name(pod.pod_id))
        starting = PodStatus(pod.pod_id, PodPhase.STARTING, node=pod.node)
        return TrackedPod(pod.pod_id, pod.node, self.kind, starting, group=group, ready=group.ready(),
                          launch=pod)

    def readopt(self) -> list[TrackedPod]:
        by_ray_id = {node.node_id: name for name, node in ray_node_table().items()}
        adopted: list[TrackedPod] = []
        for entry in placement_group_table().values():
            name = str(entry.get("name") or "")
            if not name.startswith(POD_ACTOR_PREFIX) or entry.get("state") == "REMOVED":
                continue
            group = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(entry["placement_group_id"])))
            pod_id = name[len(POD_ACTOR_PREFIX):]
            node = by_ray_id.get(next(iter((entry.get("bundles_to_node_id") or {}).values()), ""), "")
            if entry.get("state") != "CREATED" or not node:
                with contextlib.suppress(Exception):  # never started (the launch died with its server)
                    remove_placement_group(group)
                continue
            try:
                status: PodStatus = ray.get(self.host.agent(node).statuses.remote([pod_id]),
                                            timeout=CALL_TIMEOUT_S)[pod_id]
            except (ray.exceptions.RayError, TimeoutError):
                continue
            adopted.append(TrackedPod(pod_id, node, self.kind, status, group=group, placed=True))
        return adopted

    def stop(self, tracked: TrackedPod, grace_s: float) -> None:
        if tracked.placed:
            self.host.agent(tracked.node).stop.remote(tracked.pod_id, grace_s)
        # else: the step that finds the group placed stops the pod instead of starting it

    def in_flight(self) -> list[Any]:
        return list(self._asking) + self._awaited

    def step(self, live: list[TrackedPod], now_s: float) -> bool:
        ended = self._place(live, now_s)
        ended |= self._launched(live, now_s)
        ended |= self._collect(now_s)
        by_node: dict[str, list[TrackedPod]] = defaultdict(list)
        for tracked in live:
            if tracked.died_at_s is not None:
                ended |= self.lost_after_grace(tracked, now_s)
            elif tracked.placed and tracked.pending is None and not tracked.status.phase.is_final:
                by_node[tracked.node].append(tracked)
        watched = {p.pod_id for pods in self._asking.values() for p in pods}
        for node, pods in by_node.items():
            fresh = [p for p in pods if p.pod_id not in watched]
            if fresh:
                with contextlib.suppress(Exception):
                    asked = self.host.agent(node).watch.remote({p.pod_id: p.status.phase for p in fresh})
                    self._asking[asked] = fresh
        self._awaited = [p.ready for p in live if not p.placed and p.ready is not None]
        self._awaited += [p.pending for p in live if p.pending is not None]
        return ended

    def _launched(self, live: list[TrackedPod], now_s: float) -> bool:
        """Take the answers of the launch calls that have come back (each the pod's first status)."""
        launching = [p for p in live if p.pending is not None]
        if not launching:
            return False
        ready = _answered([p.pending for p in launching])
        ended = False
        for tracked in launching:
            if tracked.pending not in ready:
                continue
            ref, tracked.pending = tracked.pending, None
            try:
                status: PodStatus = ray.get(ref)
            except ray.exceptions.RayError as exc:
                why = f"node {tracked.node}'s agent did not answer the launch ({type(exc).__name__})"
                self.failed_call(tracked, now_s, f"{why}; whether the pod started is unknown")
                continue
            with self.host.lock:
                if not tracked.status.phase.is_final:
                    tracked.status = status
                    ended |= status.phase.is_final
        return ended

    def _place(self, live: list[TrackedPod], now_s: float) -> bool:
        """Start the pods whose groups Ray has placed; fail those it could not place in time."""
        waiting = [p for p in live if not p.placed and p.ready is not None]
        if not waiting:
            return False
        ready = _answered([p.ready for p in waiting])
        ended = False
        for tracked in waiting:
            if tracked.ready in ready:
                tracked.ready, tracked.placed = None, True
                ended |= self._start(tracked, now_s)
            elif now_s - tracked.created_s > self.host.placement_timeout_s or _stop_overdue(tracked, now_s):
                ended |= self._unplaceable(tracked)
        return ended

    def _start(self, tracked: TrackedPod, now_s: float) -> bool:
        pod, tracked.launch = tracked.launch, None
        if pod is None:
            return False
        try:
            agent = self.host.agent(pod.node)
            tracked.pending = agent.launch.remote(pod)  # its answer is the pod's first status
            if tracked.stop_grace_s is not None:  # asked to stop within its grace: it gets its SIGTERM
                agent.stop.remote(pod.pod_id, tracked.stop_grace_s)
        except Exception as exc:  # the agent is gone: so is (soon) its node
            self.failed_call(tracked, now_s, f"node {pod.node}'s agent is gone ({type(exc).__name__})")
        return False

    def _unplaceable(self, tracked: TrackedPod) -> bool:
        self.finish_unplaced(tracked, "placement group")
        self.release(tracked)
        return True

    def _collect(self, now_s: float) -> bool:
        """Take the node agents' answers that have come back."""
        if not self._asking:
            return False
        ended = False
        for ref in _answered(list(self._asking)):
            pods = self._asking.pop(ref)
            try:
                statuses: dict[str, PodStatus] = ray.get(ref)
            except ray.exceptions.RayError as exc:
                for tracked in pods:
                    self.failed_call(tracked, now_s, f"node {tracked.node}'s agent did not answer "
                                                     f"({type(exc).__name__}); whether the pod ran to "
                                                     "the end is unknown")
                continue
            with self.host.lock:
                for tracked in pods:
                    status = statuses.get(tracked.pod_id)
                    if status is not None and not tracked.status.phase.is_final:
                        tracked.status = status
                        ended |= status.phase.is_final
        return ended

    def release(self, tracked: TrackedPod) -> None:
        tracked.released = True
        if tracked.group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(tracked.group)

    def log_ref(self, tracked: TrackedPod, stream: str, offset: int) -> Any:
        return self.host.agent(tracked.node).read_log.remote(tracked.pod_id, stream, offset)

    def stop_all(self, pods: list[TrackedPod], grace_s: float) -> None:
        by_node: dict[str, list[str]] = defaultdict(list)
        for tracked in pods:
            if tracked.placed:
                by_node[tracked.node].append(tracked.pod_id)
                with contextlib.suppress(Exception):
                    self.host.agent(tracked.node).stop.remote(tracked.pod_id, grace_s)
        deadline = time.monotonic() + grace_s + 5.0
        for node, pod_ids in by_node.items():
            with contextlib.suppress(Exception):
                while time.monotonic() < deadline:
                    statuses = ray.get(self.host.agent(node).statuses.remote(pod_ids),
                                       timeout=max(0.1, deadline - time.monotonic()))
                    if all(s.phase.is_final for s in statuses.values()):
                        break
                    time.sleep(0.1)
        for tracked in pods:
            self.release(tracked)

    def state_file(self, config: NodeConfig, pod_id: str) -> Path:
        return config.agent_dir() / "pods" / pod_id / "state.json"


def _answered(refs: list[Any]) -> set[Any]:
    """Those of `refs` whose answer is in (without waiting)."""
    return set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])


def _stop_overdue(tracked: TrackedPod, now_s: float) -> bool:
    """Asked to stop before its group was placed, and the stop's grace has passed."""
    return tracked.stop_grace_s is not None and now_s - tracked.stop_asked_s >= tracked.stop_grace_s
