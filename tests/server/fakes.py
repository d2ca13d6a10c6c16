"""A hand-driven provider for the server tests: pods run until the test ends them."""

from __future__ import annotations

import threading
import time

from gpupool.core.model import Node
from gpupool.errors import ProviderError
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.base import Provider


class ManualProvider(Provider):
    """Launch records the pod as running; `finish()` ends it; `exit_code` set ends pods at once."""

    name = "manual"

    def __init__(self, nodes: list[Node], *, exit_code: int | None = None) -> None:
        self._nodes = nodes
        self.exit_code = exit_code
        self.launched: dict[str, PodLaunch] = {}
        self.launch_count: dict[str, int] = {}
        self.status: dict[str, PodStatus] = {}
        self.stopped: list[str] = []
        self._lock = threading.Lock()

    def nodes(self) -> list[Node]:
        return list(self._nodes)

    def launch(self, pod: PodLaunch) -> None:
        if pod.node not in {n.name for n in self._nodes}:
            raise ProviderError(f"Unknown node {pod.node!r}.")
        with self._lock:
            self.launch_count[pod.pod_id] = self.launch_count.get(pod.pod_id, 0) + 1
            if pod.pod_id in self.launched:
                return
            self.launched[pod.pod_id] = pod
            if self.exit_code is None:
                self.status[pod.pod_id] = PodStatus(pod.pod_id, PodPhase.RUNNING)
            else:
                phase = PodPhase.SUCCEEDED if self.exit_code == 0 else PodPhase.FAILED
                self.status[pod.pod_id] = PodStatus(pod.pod_id, phase, self.exit_code)

    def finish(self, pod_id: str, exit_code: int = 0) -> None:
        phase = PodPhase.SUCCEEDED if exit_code == 0 else PodPhase.FAILED
        with self._lock:
            self.status[pod_id] = PodStatus(pod_id, phase, exit_code)

    def running(self) -> list[str]:
        with self._lock:
            return sorted(p for p, s in self.status.items() if s.phase is PodPhase.RUNNING)

    def finish_the_one_launched(self, wake: threading.Event) -> str:
        """Wait (waking the server's loop through `wake`) until one pod runs, finish it with exit code
        0 and return its id; fails unless exactly one runs."""
        for _ in range(2000):
            if self.running():
                break
            wake.set()
            time.sleep(0.01)
        [pod_id] = self.running()
        self.finish(pod_id)
        return pod_id

    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        with self._lock:
            self.stopped.append(pod_id)
            current = self.status.get(pod_id)
            if current is not None and not current.phase.is_final:
                self.status[pod_id] = PodStatus(pod_id, PodPhase.STOPPED, -15)

    def poll(self) -> list[PodStatus]:
        with self._lock:
            return list(self.status.values())
