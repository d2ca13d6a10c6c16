"""Server-side pod states and the reasons the server records beside core's `Reason`."""

from __future__ import annotations

from enum import StrEnum


class PodState(StrEnum):
    LAUNCHING = "launching"
    """Recorded before the provider is asked to start it (so a crash never starts it twice)."""
    WAITING = "waiting"
    """Placed and holding its slices, but not yet handed to the provider: a pod stopping on one of
    its devices (a preempted or evicted victim) has not exited yet."""
    RUNNING = "running"
    STOPPING = "stopping"
    """Asked to stop (preemption, eviction, time limit): its slices are already given to the
    scheduler, but pods placed on its devices wait (WAITING) until the provider reports it ended."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"
    STOPPED = "stopped"

    @property
    def is_active(self) -> bool:
        return self in (PodState.LAUNCHING, PodState.WAITING, PodState.RUNNING)


ACTIVE_POD_STATES = (PodState.LAUNCHING.value, PodState.WAITING.value, PodState.RUNNING.value)
"""Pods that hold their slices in the scheduler's view."""


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
