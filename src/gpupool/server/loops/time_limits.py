"""The time-limit part of the loop: workloads past their time limit (`submit --time-limit`) fail.

Given the store and a clock it decides on its own, checked at most every LIMIT_CHECK_S: the
workloads admitted or running whose `started_s + time_limit_s` is at or before now are failed
(reason time_limit) in one transaction, their rows read FOR UPDATE (a cancel after the read waits
for the commit), and their pods stopped after it, a launch no worker has begun taken back. A check
that finds none (most of them) only reads: it takes no write lock from the submissions.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import bindparam, select

from gpupool.api.events import EventReason
from gpupool.core.model import WorkloadStatus
from gpupool.server.loops.launching import preempt_grace_s
from gpupool.server.orm import WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.events import transition
from gpupool.server.services.requeue import stop_each_after_commit, stop_pods
from gpupool.server.states import PodState

LIMIT_CHECK_S = 0.5
"""How often the loop looks for workloads past their time limit."""

_OVERDUE = (WorkloadRow.status.in_((WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)),
            WorkloadRow.time_limit_s.is_not(None), WorkloadRow.started_s.is_not(None),
            WorkloadRow.started_s + WorkloadRow.time_limit_s <= bindparam("now"))
_ANY_OVERDUE = select(WorkloadRow.id).where(*_OVERDUE).limit(1)
"""Built once, as the statement below (a check runs twice a second, and most find none)."""
_OVERDUE_ROWS = select(WorkloadRow).where(*_OVERDUE).with_for_update()


class TimeLimits:
    """`enforce()` fails the workloads past their time limit; `on_ended` is told each one after the
    commit (the run-time history forgets it)."""

    def __init__(self, rt: Runtime, on_ended: Callable[[str], None] = lambda workload_id: None) -> None:
        self.rt = rt
        self.on_ended = on_ended
        self._next_check_s = float("-inf")

    def enforce(self) -> int:
        """Stop the workloads past their time limit: failed, reason time_limit. Returns how many."""
        now = self.rt.clock()
        if now < self._next_check_s:
            return 0
        self._next_check_s = now + LIMIT_CHECK_S
        with self.rt.store.read() as session:  # most checks find none: no write transaction then
            if session.connection().scalar(_ANY_OVERDUE, {"now": now}) is None:  # Core: no ORM work
                return 0
        to_stop: list[tuple[str, float]] = []
        ended: list[str] = []
        with self.rt.store.write() as session:
            # a cancel after this read waits for the commit
            rows = session.scalars(_OVERDUE_ROWS, {"now": now}).all()
            for row in rows:
                grace = preempt_grace_s(self.rt, row.spec)
                to_stop += [(pod_id, grace) for pod_id in stop_pods(session, row, PodState.STOPPED, now)]
                row.finished_s = now
                transition(session, row, WorkloadStatus.FAILED.value, EventReason.TIME_LIMIT,
                           f"Stopped at its time limit of {duration(row.time_limit_s or 0.0)}; give it a "
                           "longer "
                           "--time-limit, or make it checkpoint and resume.", now)
                ended.append(row.id)
        stop_each_after_commit(self.rt, to_stop, now)  # a launch not begun is taken back
        for workload_id in ended:
            self.on_ended(workload_id)
            self.rt.provider.forget_workload(workload_id)  # it ended for good: its checkpoints go
        return len(ended)


def duration(seconds: float) -> str:
    """3600 -> '1h', 5400 -> '1h30m', 90 -> '1m30s'."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "") + (f"{secs}s" if secs else "")
    return text or "0s"
