"""Server-side pod and workload states, and the moves between them (the reasons recorded with a move
are `gpupool.api.events.EventReason`).

The transition tables are keyed by the enums; each edge carries one line saying why it exists.
`markdown()` renders them for docs/admission.md (tests/server/test_states.py keeps it in sync)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import TypeVar

from gpupool.core.model import WorkloadStatus


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

S = TypeVar("S", WorkloadStatus, PodState)

_W = WorkloadStatus
WORKLOAD_EDGES: Mapping[tuple[WorkloadStatus, WorkloadStatus], str] = MappingProxyType({
    (_W.PENDING, _W.ADMITTED): "a cycle placed it: its pods are written and launched (or wait)",
    (_W.PENDING, _W.FAILED): "it fits no node of the pool, even empty (a final rejection)",
    (_W.PENDING, _W.CANCELLED): "the user cancelled it before it was placed",
    (_W.ADMITTED, _W.RUNNING): "the provider started its pods (or a restart adopted them)",
    (_W.ADMITTED, _W.PENDING): "stopped before its waiting pods launched (preempted, evicted, drained, "
                               "requeued on restart)",
    (_W.ADMITTED, _W.SUCCEEDED): "every pod exited 0 before its launch was recorded",
    (_W.ADMITTED, _W.FAILED): "its launch failed, a pod failed past its retries, its time limit, or "
                              "lost on restart",
    (_W.ADMITTED, _W.CANCELLED): "the user cancelled it while it held slices",
    (_W.RUNNING, _W.PENDING): "requeued: preempted, evicted, a node or link lost, drained, a retry, "
                              "a restart, or a topology move",
    (_W.RUNNING, _W.SUCCEEDED): "every pod exited 0",
    (_W.RUNNING, _W.FAILED): "a pod failed past its retries, its time limit, or lost on restart",
    (_W.RUNNING, _W.CANCELLED): "the user cancelled it",
})
"""Every workload move and why it exists (as Ray's autoscaler declares its instance states):
pending -> admitted (placed) -> running (launched) -> a final status, and admitted or running ->
pending when requeued. A final status never changes. A move not listed here is refused."""

_P = PodState
POD_EDGES: Mapping[tuple[PodState, PodState], str] = MappingProxyType({
    (_P.WAITING, _P.LAUNCHING): "the stopping pod it waited for ended: it is handed to the provider",
    (_P.WAITING, _P.STOPPED): "its workload was stopped (cancel, preemption) before it launched",
    (_P.WAITING, _P.FAILED): "its workload failed (a peer's launch, its time limit) before it launched",
    (_P.WAITING, _P.LOST): "its node went away before it launched",
    (_P.LAUNCHING, _P.RUNNING): "the provider reports it running",
    (_P.LAUNCHING, _P.STOPPING): "asked to stop with a grace (preemption, a topology move)",
    (_P.LAUNCHING, _P.SUCCEEDED): "it exited 0 before it was seen running",
    (_P.LAUNCHING, _P.FAILED): "it could not start, or exited non-zero",
    (_P.LAUNCHING, _P.LOST): "its node or the provider lost it",
    (_P.LAUNCHING, _P.STOPPED): "stopped at once (cancel, eviction, time limit)",
    (_P.RUNNING, _P.STOPPING): "asked to stop with a grace (preemption, a topology move)",
    (_P.RUNNING, _P.SUCCEEDED): "it exited 0",
    (_P.RUNNING, _P.FAILED): "it exited non-zero",
    (_P.RUNNING, _P.LOST): "its node or the provider lost it",
    (_P.RUNNING, _P.STOPPED): "stopped at once (cancel, eviction, time limit)",
    (_P.STOPPING, _P.STOPPED): ("the provider reports it ended after the stop, or its launch was not "
                                "begun and was taken back"),
    (_P.STOPPING, _P.SUCCEEDED): "it exited 0 within its grace",
    (_P.STOPPING, _P.FAILED): "it exited non-zero within its grace",
    (_P.STOPPING, _P.LOST): "its node or the provider lost it while it stopped",
})
"""Every pod move and why it exists: waiting -> launching -> running -> stopping -> a final state."""


def _moves(states: type[S], edges: Mapping[tuple[S, S], str]) -> Mapping[S, frozenset[S]]:
    return MappingProxyType({s: frozenset(b for a, b in edges if a is s) for s in states})


WORKLOAD_MOVES: Mapping[WorkloadStatus, frozenset[WorkloadStatus]] = _moves(WorkloadStatus, WORKLOAD_EDGES)
"""Each workload status and the statuses it may move to (from `WORKLOAD_EDGES`)."""
POD_MOVES: Mapping[PodState, frozenset[PodState]] = _moves(PodState, POD_EDGES)
"""Each pod state and the states it may move to (from `POD_EDGES`)."""


def workload_move_allowed(from_status: str, to_status: str) -> bool:
    """Whether the table allows it; staying in a status that is not final records an event only.
    (The enums are StrEnums: a stored string finds its member's entry.)"""
    allowed = WORKLOAD_MOVES.get(from_status, frozenset())  # type: ignore[call-overload]
    return to_status in allowed or (to_status == from_status and bool(allowed))


def pod_move_allowed(from_status: str, to_status: str) -> bool:
    return to_status in POD_MOVES.get(from_status, frozenset())  # type: ignore[call-overload]


def _table(title: str, edges: Mapping[tuple[S, S], str]) -> list[str]:
    lines = [f"| {title} from | to | why |", "|---|---|---|"]
    lines += [f"| `{a.value}` | `{b.value}` | {why} |" for (a, b), why in edges.items()]
    return lines


def markdown() -> str:
    """The two tables as docs/admission.md shows them (between its `states` markers)."""
    return "\n".join([*_table("Workload", WORKLOAD_EDGES), "", *_table("Pod", POD_EDGES)]) + "\n"
