"""The in-memory provider for the simulator and tests: deterministic, clock-driven, with faults.

Pods "run" from launch for `duration_s` (or until stopped) on an injected clock. Per pod, the
launch environment may override: GPUPOOL_FAKE_DURATION_S (seconds), GPUPOOL_FAKE_EXIT_CODE (the
code it ends with), GPUPOOL_FAKE_IGNORE_TERM=1 (a stop then takes the whole grace period and
ends with SIGKILL's 137 instead of SIGTERM's 143) and GPUPOOL_FAKE_CHECKPOINT_S (the pod reports a
checkpoint every that many seconds of running, as the simulator's checkpoint_interval_s: the
latest one is checkpoint_s of its workload, kept across the workload's attempts until
forget_workload, as a checkpoint directory is).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpupool.core.model import Node
from gpupool.errors import InvalidInput, NotFound, ProviderError
from gpupool.pods import HealthEvent, LogChunk, PodLaunch, PodPhase, PodStatus
from gpupool.providers.base import Capability, Provider
from gpupool.providers.nodespec import SPEC_SYNTAX, nodes_from_openb_csv, nodes_from_spec
from gpupool.providers.registry import register_provider

if TYPE_CHECKING:
    from gpupool.agent.execs import ExecSession

__all__ = ["SPEC_SYNTAX", "FakeProvider", "nodes_from_openb_csv", "nodes_from_spec"]

SIGTERM_EXIT = 143
SIGKILL_EXIT = 137


@dataclass
class _FakePod:
    launch: PodLaunch
    started_at_s: float
    duration_s: float
    exit_code: int
    ignore_term: bool
    checkpoint_every_s: float | None = None
    stop_at_s: float | None = None
    grace_s: float = 0.0


def _env_float(pod: PodLaunch, key: str, default: float) -> float:
    raw = pod.env.get(key)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise InvalidInput(f"Pod {pod.pod_id!r}: {key} must be a number, got {raw!r}.") from None


@register_provider
class FakeProvider(Provider):
    """Simulated nodes (a list, or a spec for nodes_from_spec) and pods that end on the clock."""

    name = "fake"

    def __init__(self, nodes: Sequence[Node] | str = "2x8xT4", *, clock: Callable[[], float] | None = None,
                 duration_s: float = 60.0, startup_s: float = 0.0) -> None:
        self._nodes = {n.name: n for n in (nodes_from_spec(nodes) if isinstance(nodes, str) else nodes)}
        self._now = 0.0
        self._clock = clock or (lambda: self._now)
        self.duration_s = duration_s
        self.startup_s = startup_s
        self._pods: dict[str, _FakePod] = {}
        self._checkpointing: dict[str, list[_FakePod]] = {}
        """Per workload, its pods that report checkpoints (until forget_workload)."""
        self._faults: dict[tuple[str, str], str] = {}
        self._events: list[HealthEvent] = []
        self._statuses: dict[str, PodStatus] = {}
        """Each pod's status as of its last change (poll recomputes only the pods whose status changed)."""
        self._changes: list[tuple[float, int, str]] = []
        """(when a pod's status next changes, a sequence number, pod id): a heap."""
        self._sequence = 0
        self._polled_at = -math.inf
        self._forgotten: set[str] = set()
        """Finished pods forget_pods acknowledged: poll() leaves them out (read_log still knows them)."""

    def advance(self, seconds: float) -> None:
        """Move the built-in clock forward (only when no clock was injected)."""
        self._now += seconds

    def missing_capabilities(self) -> dict[Capability, str]:
        reason = "the fake provider simulates pods in memory"
        return {Capability.REAL_PROCESSES: f"{reason}; nothing is executed",
                Capability.GPU: f"{reason}; its devices are simulated",
                Capability.MPS: f"{reason}; there is no device to share",
                Capability.CGROUPS: f"{reason}; no host limits apply",
                Capability.USER_ISOLATION: f"{reason}; no process runs as any account"}

    def nodes(self) -> list[Node]:
        out = []
        for node in self._nodes.values():
            devices = tuple(replace(d, healthy=d.healthy and (node.name, d.uuid) not in self._faults)
                            for d in node.devices)
            healthy = node.healthy and (node.name, "") not in self._faults
            out.append(replace(node, devices=devices, healthy=healthy))
        return out

    def launch(self, pod: PodLaunch) -> None:
        if pod.node not in self._nodes:
            raise ProviderError(f"Unknown node {pod.node!r}; the fake provider has {len(self._nodes)} nodes.")
        if pod.pod_id in self._pods:
            return
        every_s = _env_float(pod, "GPUPOOL_FAKE_CHECKPOINT_S", 0.0)
        fake = self._pods[pod.pod_id] = _FakePod(
            launch=pod, started_at_s=self._clock(),
            duration_s=_env_float(pod, "GPUPOOL_FAKE_DURATION_S", self.duration_s),
            exit_code=int(_env_float(pod, "GPUPOOL_FAKE_EXIT_CODE", 0)),
            ignore_term=pod.env.get("GPUPOOL_FAKE_IGNORE_TERM") == "1",
            checkpoint_every_s=every_s if every_s > 0 else None)
        if fake.checkpoint_every_s is not None:
            self._checkpointing.setdefault(pod.workload_id, []).append(fake)
        self._track(fake)

    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        pod = self._pods.get(pod_id)
        if pod is None or pod.stop_at_s is not None or self._status(pod).phase.is_final:
            return
        pod.stop_at_s, pod.grace_s = self._clock(), max(0.0, grace_s)
        self._track(pod)

    def _track(self, pod: _FakePod) -> None:
        """Record the pod's status now and when it changes next (a launch, a stop, a change seen);
        never again once forgotten (a stopped pod's natural end may still be queued, and an injected
        clock that steps back may make an ended pod run again)."""
        if pod.launch.pod_id in self._forgotten:
            return
        now = self._clock()
        self._statuses[pod.launch.pod_id] = self._status(pod)
        run_from = pod.started_at_s + self.startup_s
        times = [run_from, run_from + pod.duration_s]
        if pod.stop_at_s is not None:
            times.append(pod.stop_at_s + (pod.grace_s if pod.ignore_term else 0.0))
        upcoming = [t for t in times if t > now]
        if upcoming:
            self._sequence += 1
            heapq.heappush(self._changes, (min(upcoming), self._sequence, pod.launch.pod_id))

    def _status(self, pod: _FakePod) -> PodStatus:
        now = self._clock()
        run_from = pod.started_at_s + self.startup_s
        natural_end = run_from + pod.duration_s
        base = PodStatus(pod_id=pod.launch.pod_id, phase=PodPhase.STARTING, node=pod.launch.node,
                         started_at_s=pod.started_at_s)
        if pod.stop_at_s is not None and pod.stop_at_s < natural_end:
            end = pod.stop_at_s + (pod.grace_s if pod.ignore_term else 0.0)
            if now >= end and end < natural_end:
                code = SIGKILL_EXIT if pod.ignore_term else SIGTERM_EXIT
                how = "killed after the grace period" if pod.ignore_term else "stopped by SIGTERM"
                return replace(base, phase=PodPhase.STOPPED, exit_code=code, message=how, finished_at_s=end)
        if now >= natural_end:
            phase = PodPhase.SUCCEEDED if pod.exit_code == 0 else PodPhase.FAILED
            return replace(base, phase=phase, exit_code=pod.exit_code, finished_at_s=natural_end,
                           message=f"exited with code {pod.exit_code}")
        return replace(base, phase=PodPhase.RUNNING) if now >= run_from else base

    def poll(self) -> list[PodStatus]:
        """Every pod's status but those forget_pods acknowledged; only those whose status may have
        changed since the last call are worked out again (the pods running on undisturbed cost
        nothing)."""
        now = self._clock()
        if now < self._polled_at:  # an injected clock went back: work every status out afresh
            self._changes.clear()
            for pod in self._pods.values():
                self._track(pod)
        self._polled_at = now
        changes = self._changes
        while changes and changes[0][0] <= now:
            _, _, pod_id = heapq.heappop(changes)
            self._track(self._pods[pod_id])
        return list(self._statuses.values())

    def forget_pods(self, pod_ids: Sequence[str]) -> None:
        for pod_id in pod_ids:
            status = self._statuses.get(pod_id)
            if status is not None and status.phase.is_final:
                del self._statuses[pod_id]
                self._forgotten.add(pod_id)

    def read_log(self, pod_id: str, stream: str = "stdout", offset: int = 0) -> LogChunk:
        if stream not in ("stdout", "stderr"):
            raise InvalidInput(f"Unknown log stream {stream!r}; use 'stdout' or 'stderr'.")
        pod = self._pods.get(pod_id)
        if pod is None:
            raise NotFound(f"No pod {pod_id!r} on the fake provider.", pod_id=pod_id)
        status = self._status(pod)
        text = ""
        if stream == "stdout":
            text = f"fake pod {pod_id} started at {pod.started_at_s:g}s on {pod.launch.node}\n"
            if status.phase.is_final:
                text += f"fake pod {pod_id} {status.phase.value}: {status.message}\n"
        data = text.encode()
        return LogChunk(data[offset:].decode(), len(data), status.phase.is_final)

    def _check(self, node: str, device_uuid: str) -> None:
        if node not in self._nodes:
            raise NotFound(f"No node {node!r} in the fake provider.")
        if device_uuid and device_uuid not in {d.uuid for d in self._nodes[node].devices}:
            raise NotFound(f"Node {node!r} has no device {device_uuid!r}.")

    def exec(self, node: str, pod_id: str, command: Sequence[str], *, pty: bool = False, rows: int = 0,
             cols: int = 0) -> ExecSession:
        raise ProviderError("Pods of the fake provider are not processes, so nothing can run inside them; "
                            "gpupool exec and alloc need the local provider (gpupool up --simulate).")

    def inject_fault(self, node: str, device_uuid: str = "", reason: str = "injected fault") -> None:
        self._check(node, device_uuid)
        if (node, device_uuid) not in self._faults:
            self._faults[(node, device_uuid)] = reason
            self._events.append(HealthEvent(self._clock(), node, device_uuid, False, reason))

    def clear_fault(self, node: str, device_uuid: str = "") -> None:
        self._check(node, device_uuid)
        if self._faults.pop((node, device_uuid), None) is not None:
            self._events.append(HealthEvent(self._clock(), node, device_uuid, True, "fault cleared"))

    def health_events(self) -> list[HealthEvent]:
        return list(self._events)

    def _last_checkpoint_s(self, pod: _FakePod) -> float | None:
        assert pod.checkpoint_every_s is not None
        status = self._status(pod)
        run_from = pod.started_at_s + self.startup_s
        until = status.finished_at_s if status.finished_at_s is not None else self._clock()
        done = until - run_from
        if done < pod.checkpoint_every_s:
            return None
        return run_from + math.floor(done / pod.checkpoint_every_s) * pod.checkpoint_every_s

    def checkpoint_s(self, workload_id: str) -> float | None:
        marks = [m for p in self._checkpointing.get(workload_id, ()) if (m := self._last_checkpoint_s(p))
                 is not None]
        return max(marks, default=None)

    def forget_workload(self, workload_id: str) -> None:
        self._checkpointing.pop(workload_id, None)
