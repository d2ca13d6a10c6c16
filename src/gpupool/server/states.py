"""Server-side pod and workload states, and the moves between them (the reasons recorded with a move
are `gpupool.api.events.EventReason`)."""

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
