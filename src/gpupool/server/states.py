"""Server-side pod states and the reasons the server records beside core's `Reason`."""

from __future__ import annotations

from enum import StrEnum


class PodState(StrEnum):
    LAUNCHING = "launching"
    """Recorded before the provider is asked to start it (so a crash never starts it twice)."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"
    STOPPED = "stopped"

    @property
    def is_active(self) -> bool:
        return self in (PodState.LAUNCHING, PodState.RUNNING)


ACTIVE_POD_STATES = (PodState.LAUNCHING.value, PodState.RUNNING.value)


class EventReason(StrEnum):
    """Why a workload changed state (core's Reason covers scheduling decisions)."""

    SUBMITTED = "submitted"
    ADMITTED = "admitted"
    LAUNCHED = "launched"
    COMPLETED = "completed"
    POD_FAILED = "pod_failed"
    POD_LOST = "pod_lost"
    LOST_ON_RESTART = "lost_on_restart"
    REQUEUED_ON_RESTART = "requeued_on_restart"
    """Admitted but never handed to the provider before the server stopped: placed again."""
    ADOPTED = "adopted"
    LAUNCH_FAILED = "launch_failed"
    CANCELLED_BY_USER = "cancelled_by_user"
    NODE_DRAINED = "node_drained"
    NODE_GONE = "node_gone"
    NEVER_FITS = "never_fits"
    LIMITS_UNENFORCED = "limits_unenforced"
    """Placed where one of its limits does not hold (no cgroup v2 tree, no MPS, simulated devices)."""
