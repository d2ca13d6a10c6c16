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
    """Why a workload changed state (core's Reason covers scheduling decisions; the two never share a
    code). Each has an entry in `gpupool.reasons.CATALOGUE`."""

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
    TIME_LIMIT = "time_limit"
    """Stopped at its time limit (`submit --time-limit`)."""
    RETRYING = "retrying"
    """A pod failed; the workload waits (backoff) to run again, within its max_retries."""
    NODE_LOST = "node_lost"
    """The node it ran on is no longer listed by the provider; the workload is requeued."""
    LIMITS_UNENFORCED = "limits_unenforced"
    """Placed where one of its limits does not hold (no cgroup v2 tree, no MPS, simulated devices)."""
    LINK_LOST = "link_lost"
    """A fabric link failed and two of its nodes had no route left: the gang is requeued."""
    LINK_DEGRADED = "link_degraded"
    """A fabric link failed or healed and the gang's bottleneck changed (an event; it keeps running)."""


_P, _A, _R = "pending", "admitted", "running"
_S, _F, _C = "succeeded", "failed", "cancelled"

WORKLOAD_MOVES: dict[str, frozenset[str]] = {
    _P: frozenset({_A, _F, _C}),
    _A: frozenset({_R, _P, _S, _F, _C}),
    _R: frozenset({_P, _S, _F, _C}),
    _S: frozenset(),
    _F: frozenset(),
    _C: frozenset(),
}
"""Every workload status and the statuses it may move to (as Ray's autoscaler declares its
instance states): pending -> admitted (placed) -> running (launched) -> a final status, and
admitted or running -> pending when requeued (preemption, eviction, drain, retry, restart).
A final status never changes. A move not listed here is refused and logged."""

_PL, _PW, _PR, _PX = PodState.LAUNCHING.value, PodState.WAITING.value, PodState.RUNNING.value, \
    PodState.STOPPING.value
_PS, _PF, _PLO, _PST = PodState.SUCCEEDED.value, PodState.FAILED.value, PodState.LOST.value, \
    PodState.STOPPED.value

POD_MOVES: dict[str, frozenset[str]] = {
    _PW: frozenset({_PL, _PST, _PF, _PLO}),
    _PL: frozenset({_PR, _PX, _PS, _PF, _PLO, _PST}),
    _PR: frozenset({_PX, _PS, _PF, _PLO, _PST}),
    _PX: frozenset({_PST, _PS, _PF, _PLO}),
    _PS: frozenset(),
    _PF: frozenset(),
    _PLO: frozenset(),
    _PST: frozenset(),
}
"""Pod states likewise: waiting -> launching -> running -> stopping -> a final state."""


def workload_move_allowed(from_status: str, to_status: str) -> bool:
    """Whether the table allows it; staying in a status that is not final records an event only."""
    allowed = WORKLOAD_MOVES.get(from_status, frozenset())
    return to_status in allowed or (to_status == from_status and bool(allowed))


def pod_move_allowed(from_status: str, to_status: str) -> bool:
    return to_status in POD_MOVES.get(from_status, frozenset())
