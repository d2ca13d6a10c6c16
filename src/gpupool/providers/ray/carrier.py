"""What a pod carrier does for the provider: start, watch, stop and release pods on Ray nodes.

Two carriers keep the same promises (see pods.PodCarrier): the pod is pinned to the node gpupool
chose and holds exactly its slices' custom resources while it runs; it is named `pod-<id>` in the
gpupool namespace and detached, so a provider started again re-adopts it and never starts it twice.
Every method returns promptly except stop_all (the provider's close).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Protocol

from gpupool.pods import PodLaunch, PodPhase
from gpupool.providers.ray.membership import Membership, RayNode
from gpupool.providers.ray.node_agent import NodeDescription
from gpupool.providers.ray.nodeconfig import NodeConfig
from gpupool.providers.ray.pods import PodCarrier, TrackedPod


class CarrierHost(Protocol):
    """What a carrier reads from its provider."""

    membership: Membership
    placement_timeout_s: float
    actor_lost_grace_s: float
    poll_interval_s: float
    lock: threading.RLock

    def agent(self, node: str) -> Any:
        """The node agent actor of `node` (NotFound when there is none)."""


class Carrier(ABC):
    kind: ClassVar[PodCarrier]

    def __init__(self, host: CarrierHost) -> None:
        self.host = host

    @abstractmethod
    def launch(self, pod: PodLaunch, description: NodeDescription, ray_node: RayNode) -> TrackedPod:
        """Ask Ray for the pod's carrier on its node and return its record (STARTING); non-blocking."""

    @abstractmethod
    def readopt(self) -> list[TrackedPod]:
        """The pods of this kind a previous provider left on the cluster (by their names)."""

    @abstractmethod
    def stop(self, tracked: TrackedPod, grace_s: float) -> None:
        """Ask the pod to stop (SIGTERM, `grace_s`, SIGKILL); called once, under the host's lock."""

    @abstractmethod
    def step(self, live: list[TrackedPod], now_s: float) -> bool:
        """One monitor step over the live pods of this kind: send and collect status calls; True
        when a pod ended."""

    @abstractmethod
    def release(self, tracked: TrackedPod) -> None:
        """Give the ended pod's resources back to Ray for good."""

    @abstractmethod
    def log_ref(self, tracked: TrackedPod, stream: str, offset: int) -> Any:
        """A Ray call reading the pod's log."""

    @abstractmethod
    def stop_all(self, pods: list[TrackedPod], grace_s: float) -> None:
        """Stop these pods and wait (up to the grace and a little) for them to end; blocks."""

    @abstractmethod
    def state_file(self, config: NodeConfig, pod_id: str) -> Path:
        """Where the pod's agent record lives on its node."""

    def in_flight(self) -> list[Any]:
        """Refs the monitor may wait on instead of sleeping (an answer wakes it early)."""
        return []

    def failed_call(self, tracked: TrackedPod, now_s: float, reason: str) -> None:
        """A call about the pod failed: it is lost after the host's grace, unless its node is seen
        gone first (then the membership reports it, so the server requeues its work)."""
        if tracked.died_at_s is None:
            tracked.died_at_s, tracked.died_reason = now_s, reason

    def finish_unplaced(self, tracked: TrackedPod, carrier_word: str) -> None:
        """Ray found no place for the pod's carrier within the host's timeout: STOPPED when a stop
        came first, else FAILED saying why."""
        with self.host.lock:
            if tracked.stop_grace_s is not None:
                tracked.finish(PodPhase.STOPPED, "stopped before Ray could place it")
            else:
                tracked.finish(PodPhase.FAILED,
                               f"Ray could not place the pod's {carrier_word} on node {tracked.node} within "
                               f"{self.host.placement_timeout_s:.0f} s (the node lacks the slice's free "
                               "resources or does not answer)")

    def lost_after_grace(self, tracked: TrackedPod, now_s: float) -> bool:
        """Report the pod lost once its calls have failed for the grace; True when it did."""
        if tracked.died_at_s is None or now_s - tracked.died_at_s < self.host.actor_lost_grace_s:
            return False
        with self.host.lock:
            tracked.finish(PodPhase.LOST, tracked.died_reason)
        self.release(tracked)
        return True
