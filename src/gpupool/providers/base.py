"""The provider contract: what nodes and devices exist, and how work starts and stops on them.

Implementations: `local` (processes on this machine, the embedded default) and `fake` (the
simulator and tests). One contract test suite runs against every provider.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from gpupool.core.model import Node, Slice


class PodPhase(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class PodLaunch:
    """Everything a provider needs to start one pod: where, what, and inside which limits."""

    pod_id: str
    workload_id: str
    node: str
    command: tuple[str, ...]
    slices: tuple[Slice, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = ""
    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    ib_hcas: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PodStatus:
    pod_id: str
    phase: PodPhase
    exit_code: int | None = None
    message: str = ""


class Capability(StrEnum):
    """Optional features; a provider lists what it lacks with a reason."""

    REAL_PROCESSES = "real_processes"
    GPU = "gpu"
    MPS = "mps"
    CGROUPS = "cgroups"
    MULTI_NODE = "multi_node"
    FAULT_INJECTION = "fault_injection"


class Provider(ABC):
    """Where work runs. Every method is safe to call from the scheduler loop."""

    name: ClassVar[str]

    def missing_capabilities(self) -> dict[Capability, str]:
        """Each optional capability this provider lacks, with the reason. Non-blocking."""
        return {}

    @abstractmethod
    def nodes(self) -> list[Node]:
        """The nodes and devices that exist now. Non-blocking, idempotent, never raises for an
        unhealthy device (it is reported with healthy=False)."""

    @abstractmethod
    def launch(self, pod: PodLaunch) -> None:
        """Start the pod asynchronously and return at once. Idempotent by pod_id: launching a pod
        id that is already known does nothing. Raises ProviderError if the node is unknown."""

    @abstractmethod
    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        """Ask the pod to stop (SIGTERM, then SIGKILL after grace_s); returns without waiting.
        Idempotent; stopping an unknown or finished pod does nothing."""

    @abstractmethod
    def poll(self) -> list[PodStatus]:
        """The current status of every pod this provider knows, including finished ones with
        their exit codes. Non-blocking, idempotent."""

    def close(self) -> None:
        """Release the provider's resources (threads, daemons). Idempotent."""
