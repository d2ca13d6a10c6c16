"""The local provider: this machine is the one node, and pods run as real processes via the agent.

Each pod's GPUPOOL_CHECKPOINT_DIR is its workload's directory under the pods' scratch root on this
machine (agent/checkpoints.py); faults can be injected into simulated devices only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import platformdirs

from gpupool.agent.execs import ExecSession
from gpupool.agent.identity import Identities
from gpupool.agent.isolation import CGROUP_ROOT_ENV
from gpupool.agent.mps import MPS_CONTROL, MpsDaemon
from gpupool.agent.netns import NetworkSettings
from gpupool.agent.node import NodeAgent
from gpupool.agent.podstate import PodRecord
from gpupool.agent.probes.infiniband import SYSFS_ROOT
from gpupool.agent.probes.nvml import NvmlProbe
from gpupool.agent.procfs import proc_visibility
from gpupool.agent.runner import DEFAULT_MAX_LOG_BYTES
from gpupool.core.model import Node
from gpupool.errors import NotFound, ProviderError
from gpupool.pods import HealthEvent, LogChunk, PodLaunch, PodStatus
from gpupool.providers.base import Capability, DeviceReading, Provider
from gpupool.providers.registry import register_provider


def default_state_dir() -> Path:
    return Path(platformdirs.user_state_dir("gpupool")) / "agent"


def record_status(node: str, record: PodRecord) -> PodStatus:
    """The provider's status of a pod from the runner's record of it."""
    return PodStatus(pod_id=record.pod_id, phase=record.phase, exit_code=record.exit_code,
                     message=record.message, node=node, started_at_s=record.started_at_s,
                     finished_at_s=record.finished_at_s, never_started=record.never_started)


def devices_here() -> tuple[int, str]:
    """How many NVIDIA devices NVML finds on this machine, and what it says (why none): asked
    directly, with no agent started (an agent takes the pod network's block, clearing what its own
    pods do not hold)."""
    probe = NvmlProbe()
    try:
        found = probe.probe()
    finally:
        probe.close()
    return len(found.devices), found.message


@register_provider
class LocalProvider(Provider):
    """One node: this machine. Devices come from NVML, or are simulated from a spec such as '4xH100'
    (`simulate`), or only when NVML finds none (`fallback_simulate`); simulated devices carry
    simulated=True and the node the label gpupool.io/simulated=true. `guarded`: more directories
    whose filesystems the agent's disk guard watches besides its own (the store's: diskguard.py)."""

    name = "local"

    concurrent_launch = True
    """launch() may be called from several threads at once (for different pods)."""

    def __init__(self, state_dir: Path | str | None = None, *, simulate: str | None = None,
                 fallback_simulate: str | None = None, node_name: str | None = None,
                 cgroup_root: Path | str | None = None, clock: Callable[[], float] = time.time,
                 probe: NvmlProbe | None = None, mps: MpsDaemon | None = None,
                 ib_sysfs_root: Path | str = SYSFS_ROOT, identities: Identities | None = None,
                 scratch_root: Path | str | None = None, max_log_bytes: int = DEFAULT_MAX_LOG_BYTES,
                 network: NetworkSettings | None = None, network_slot: int = 0,
                 published: Sequence[tuple[str, int]] = (), guarded: Sequence[Path] = ()) -> None:
        self.agent = NodeAgent(state_dir or default_state_dir(), node_name=node_name, simulate=simulate,
                               fallback_simulate=fallback_simulate, probe=probe, mps=mps,
                               cgroup_root=cgroup_root, clock=clock, ib_sysfs_root=ib_sysfs_root,
                               identities=identities, scratch_root=scratch_root,
                               max_log_bytes=max_log_bytes, network=network, network_slot=network_slot,
                               published=published, guarded=guarded)
        self._closed = False
        self._final_statuses: dict[str, PodStatus] = {}

    def missing_capabilities(self) -> dict[Capability, str]:
        missing = {Capability.MULTI_NODE: "the local provider runs pods on this machine only"}
        real = [d for d in self.agent.node().devices if not d.simulated]
        if not real:
            missing[Capability.GPU] = f"no real accelerator: {self.agent.device_status}"
        if not self.agent.simulated:
            missing[Capability.FAULT_INJECTION] = (
                "this machine's devices are real; faults can be injected only into simulated devices"
            )
        if not self.agent.mps_available:
            missing[Capability.MPS] = f"{MPS_CONTROL} is not installed, so fractional slices are not capped"
        if not self.agent.identities.switch_users:
            missing[Capability.USER_ISOLATION] = (
                "the agent does not run as root, so pods run as its own user: a pool for that one user"
            )
        if not self.agent.network.active:
            missing[Capability.NETWORK_ISOLATION] = self.agent.network.unavailable
        if self.agent.containers is None:
            missing[Capability.CONTAINERS] = self.agent.containers_unavailable
        hidden = proc_visibility()
        if hidden:
            missing[Capability.HIDDEN_PROCESSES] = hidden
        if self.agent.cgroup_root is None:
            missing[Capability.CGROUPS] = (
                f"no writable cgroup v2 tree with cpu and memory controllers (set {CGROUP_ROOT_ENV} to a "
                "delegated cgroup); host limits fall back to RLIMITs"
            )
        return missing

    def nodes(self) -> list[Node]:
        return [self.agent.node()]

    def device_readings(self) -> dict[tuple[str, int], DeviceReading]:
        """From NVML's last reading (nodes() probes the devices each cycle): no extra driver call."""
        if self.agent.simulated:
            return {}
        return {(self.agent.node_name, d.index): DeviceReading(d.utilization_pct, d.memory_used_mib)
                for d in self.agent.probe_result.devices}

    def gang_address(self, node: str, port: int) -> str:
        return self.agent.network.gang_address(port) or self.node_address(node)

    def pod_address(self, node: str, pod_id: str) -> str:
        return self.agent.network.pod_address(pod_id) or self.node_address(node)

    def _check_node(self, node: str) -> None:
        if node != self.agent.node_name:
            raise ProviderError(
                f"Node {node!r} is not this machine ({self.agent.node_name!r}); the local provider "
                "runs pods here only."
            )

    def launch(self, pod: PodLaunch) -> None:
        self._check_node(pod.node)
        self.agent.launch(pod)

    def fence(self, epoch: int, confirm: Callable[[], None] | None = None) -> None:
        self.agent.fence(epoch, confirm)

    def remove_tenant(self, tenant: str) -> list[str]:
        agent = self.agent
        return agent.identities.remove(tenant, owned_under=(agent.scratch_root, agent.checkpoints.root))

    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        self.agent.stop(pod_id, grace_s)

    def add_exit_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` from a background thread soon after pods exit (and are reaped), so a
        control loop can poll at once instead of at its next interval."""
        self.agent.runner.add_exit_listener(listener)

    def poll(self) -> list[PodStatus]:
        node, finals = self.agent.node_name, self._final_statuses
        statuses = []
        for record in self.agent.poll():
            status = finals.get(record.pod_id)
            if status is None:
                status = record_status(node, record)
                if record.finished:  # a finished record never changes again: convert it once
                    finals[record.pod_id] = status
            statuses.append(status)
        return statuses

    def forget_pods(self, pod_ids: Sequence[str]) -> None:
        self.agent.forget_pods(pod_ids)
        for pod_id in pod_ids:
            self._final_statuses.pop(pod_id, None)  # only finished pods have one; others are kept

    def read_log(self, pod_id: str, stream: str = "stdout", offset: int = 0) -> LogChunk:
        return self.agent.read_log(pod_id, stream, offset)

    def exec(self, node: str, pod_id: str, command: Sequence[str], *, pty: bool = False, rows: int = 0,
             cols: int = 0) -> ExecSession:
        self._check_node(node)
        return self.agent.execs.start(pod_id, command, pty=pty, rows=rows, cols=cols)

    def inject_fault(self, node: str, device_uuid: str = "", reason: str = "injected fault") -> None:
        if node != self.agent.node_name:
            raise NotFound(f"No node {node!r} here; this machine is {self.agent.node_name!r}.")
        self.agent.inject_fault(device_uuid, reason)

    def clear_fault(self, node: str, device_uuid: str = "") -> None:
        if node != self.agent.node_name:
            raise NotFound(f"No node {node!r} here; this machine is {self.agent.node_name!r}.")
        self.agent.clear_fault(device_uuid)

    def health_events(self) -> list[HealthEvent]:
        return self.agent.health_events()

    def checkpoint_s(self, workload_id: str) -> float | None:
        return self.agent.checkpoint_s(workload_id)

    def read_checkpoint(self, workload_id: str, max_bytes: int) -> tuple[float | None, bytes] | None:
        return self.agent.checkpoint_archive(workload_id, max_bytes)

    def seed_checkpoint(self, workload_id: str, tenant: str, unix_user: str, data: bytes, *,
                        on_behalf: bool = False) -> int:
        return self.agent.seed_checkpoint(workload_id, tenant, unix_user, data, on_behalf=on_behalf)

    def forget_workload(self, workload_id: str) -> None:
        self.agent.forget_workload(workload_id)

    def close(self, *, stop_pods: bool = False) -> None:
        """Release NVML and timers. Pods keep running for the next start to re-adopt, unless
        `stop_pods` (then this blocks until they are reaped). Idempotent."""
        if not self._closed:
            self._closed = True
            self.agent.close(stop_pods=stop_pods)
