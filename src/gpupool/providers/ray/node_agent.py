"""The node agent actor: one detached actor per gpupool node, describing it and serving its files.

`gpupool node join` (or the provider, for simulated nodes) starts it pinned to its Ray node. It
probes the node's devices and IB ports with the agent's probes (NVML, sysfs), keeps injected
faults of simulated devices, and serves what outlives a pod's actor: finished pods' logs and the
workloads' checkpoint marks. The provider reads the node from it (`describe`), so the device list
comes from the machine itself, joined with Ray's node table by the node label.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

import ray

from gpupool.agent.runner import Runner
from gpupool.core.model import Node
from gpupool.errors import NotFound
from gpupool.providers.base import Capability, HealthEvent, LogChunk
from gpupool.providers.local import LocalProvider
from gpupool.providers.ray.nodeconfig import NodeConfig


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


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class NodeAgentActor:
    """Serves one node's description, faults, finished pods' logs and checkpoint marks."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.local = LocalProvider(config.agent_dir(), simulate=config.simulate or None,
                                   node_name=config.name, ib_sysfs_root=config.ib_sysfs_root,
                                   scratch_root=config.scratch())
        self._runners: dict[str, Runner] = {}
        self._seq = 0

    def describe(self) -> NodeDescription:
        self._seq += 1
        return NodeDescription(node=self.local.nodes()[0], config=self.config,
                               events=tuple(self.local.health_events()),
                               missing=self.local.missing_capabilities(), hostname=socket.gethostname(),
                               seq=self._seq)

    def inject_fault(self, device_uuid: str, reason: str) -> NodeDescription:
        self.local.inject_fault(self.config.name, device_uuid, reason)
        return self.describe()

    def clear_fault(self, device_uuid: str) -> NodeDescription:
        self.local.clear_fault(self.config.name, device_uuid)
        return self.describe()

    def read_log(self, pod_id: str, stream: str, offset: int) -> LogChunk:
        """A pod's log from its files (the pod has ended and its actor is gone)."""
        runner = self._runners.get(pod_id)
        if runner is None:
            directory = self.config.pod_dir(pod_id)
            if not (directory / "pods" / pod_id).is_dir():
                raise NotFound(f"No pod {pod_id!r} on node {self.config.name}.")
            runner = self._runners[pod_id] = Runner(directory)
        return runner.read_log(pod_id, stream, offset)

    def process_env(self, names: list[str]) -> dict[str, str]:
        """These variables as the node's Ray worker processes have them (what a pod actor inherits)."""
        return {name: os.environ[name] for name in names if name in os.environ}

    def checkpoint_s(self, workload_id: str) -> float | None:
        return self.local.checkpoint_s(workload_id)

    def forget_workload(self, workload_id: str) -> None:
        self.local.forget_workload(workload_id)
