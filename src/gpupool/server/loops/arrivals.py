"""The arrivals part of the loop: which pending work a cycle looks at, and what the core may know of
each workload beyond its spec.

`Window`: like Kueue's best-effort FIFO, work that did not fit is set aside until capacity may have
changed, and meanwhile a cycle reads only the new arrivals (submitted after a horizon that trails
the newest seen by ARRIVAL_MARGIN_S, so a slow commit is never skipped); a full pass reads all
pending work (capacity changed, work was requeued, a backoff ended, FULL_RESCAN_S passed).

`Estimates`: the run-time estimate each arrival gets from history (when the user gave none), the
service and progress a requeued workload keeps, how often work was moved for locality; given to the
core as `WorkloadInfo`, as the replay gives it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pydantic import ValidationError
from sqlalchemy import func, select

from gpupool.api.workloads import STORED, WorkloadSpec
from gpupool.core.model import Node, Reason, Workload, WorkloadInfo, WorkloadStatus
from gpupool.core.scheduling.backfill import RuntimeEstimator
from gpupool.core.scheduling.keeper import PRUNE_SLACK
from gpupool.server.loops.rows import E, W
from gpupool.server.loops.snapshot import StoreView, WorkloadCache
from gpupool.server.orm import WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.specs import to_workload

FULL_RESCAN_S = 10.0
ARRIVAL_MARGIN_S = 10.0
"""New arrivals are read from (newest seen - margin), so a slow commit is never skipped."""
HISTORY_ROWS = 10_000
"""Succeeded workloads read at start-up for the run-time estimator's history."""


class Window:
    """Which pending work the next cycle reads: all of it (a full pass) or the arrivals since the
    horizon, less the work set aside as inadmissible since the last full pass."""

    def __init__(self) -> None:
        self.inadmissible: set[str] = set()
        """Work a cycle could not place, not read again until the next full pass."""
        self.horizon_s: float | None = None
        """Arrivals submitted after this are new (None: the next cycle is a full pass)."""
        self.last_full_s = float("-inf")
        self.backoff_s: float | None = None
        """When the next requeued workload's backoff ends (a full pass then looks at it)."""
        self._last_nodes: tuple[Node, ...] = ()

    def full_due(self, now: float, *, forced: bool) -> bool:
        """Whether this cycle is a full pass: `forced` (capacity changed, work requeued, the store
        audit found a difference), a requeued workload's backoff over, or FULL_RESCAN_S passed."""
        backoff_over = self.backoff_s is not None and now >= self.backoff_s
        return forced or backoff_over or self.horizon_s is None or now - self.last_full_s > FULL_RESCAN_S

    def begin(self, full: bool, now: float) -> None:
        """A full pass looks at the work set aside again."""
        if full:
            self.inadmissible.clear()
            self.last_full_s = now

    def since_s(self, full: bool) -> float | None:
        """The submit time after which the cycle reads pending work (None: all of it)."""
        return None if full else self.horizon_s

    def skip(self, head: frozenset[str]) -> frozenset[str]:
        """Pending work the cycle does not read: set aside, but for the reserved head `head`."""
        return frozenset(self.inadmissible - head)

    def seen(self, view: StoreView, *, full: bool, limit: int, now: float) -> bool:
        """Move the horizon past what the cycle read; returns whether more arrivals wait beyond the
        cycle's share (`limit`): the horizon then stays where it is, so the next cycle reads the
        ones after what this one decides (admitted or set aside)."""
        if full:
            self.backoff_s = view.next_backoff_s
        if view.snapshot.nodes != self._last_nodes:
            self._last_nodes = view.snapshot.nodes
            if not full:
                self.horizon_s = None  # nodes changed: look at everything next cycle
        more = not full and len(view.pending) >= limit
        if not more and (full or view.pending):
            newest = max((w.submit_time_s for w in view.pending), default=now) - ARRIVAL_MARGIN_S
            self.horizon_s = newest if self.horizon_s is None else max(self.horizon_s, newest)
        return more

    def candidates(self, view: StoreView, head: frozenset[str]) -> list[Workload]:
        """The pending work read that the cycle decides on: not set aside, or the reserved head."""
        return [w for w in view.pending if w.id not in self.inadmissible or w.id in head]


class Estimates:
    """What the core may know of each workload beyond its spec (`info`), kept as the replay keeps it:
    set on arrival and on requeue, dropped when the workload ends."""

    def __init__(self, rt: Runtime, cache: WorkloadCache) -> None:
        self.rt = rt
        self.cache = cache
        self.info: dict[str, WorkloadInfo] = {}
        """Run-time estimate from history, service received, progress kept, moves for locality."""
        self.noted: set[str] = set()
        self.estimator = RuntimeEstimator()
        self.history_loaded = False

    def note(self, pending: Sequence[Workload]) -> None:
        """A workload seen for the first time gets its history-based run-time estimate (when the
        user gave none), as the replay gives it on arrival."""
        noted = self.noted
        for w in pending:
            if w.id in noted:
                continue
            noted.add(w.id)
            if w.runtime_estimate_s is None and w.id not in self.info:
                estimate = self.estimator.history_s(w)
                if estimate is not None:
                    self.info[w.id] = WorkloadInfo(runtime_estimate_s=estimate)

    def finished(self, workload_id: str, worked_s: float | None) -> None:
        """A workload ended for good; with `worked_s` (it succeeded after that much work), its run
        time joins the history the estimates come from."""
        info = self.info.pop(workload_id, None)
        self.noted.discard(workload_id)
        if worked_s is None:
            return
        workload = self.cache.peek(workload_id)
        if workload is None:
            return
        used = info.runtime_estimate_s if info is not None else None
        self.estimator.observe(workload, worked_s, used if used is not None else workload.runtime_estimate_s)

    def requeued(self, row: WorkloadRow, moved_s: float | None, *, migrated: bool = False) -> None:
        """What the core should know of a requeued workload: the service it received, the progress
        it keeps (its checkpoints), its run-time estimate, how often it was moved for locality
        (one more when `moved_s`, the time of this move, is given) and off congestion (one more when
        `migrated`)."""
        before = self.info.get(row.id) or WorkloadInfo()
        self.info[row.id] = WorkloadInfo(
            attained_service_s=row.run_s * row.device_milli / 1000.0,
            progress_s=row.progress_s,
            runtime_estimate_s=before.runtime_estimate_s,
            moves=before.moves + (moved_s is not None),
            moved_s=before.moved_s if moved_s is None else moved_s,
            congestion_moves=before.congestion_moves + migrated,
        )

    def prune(self, view: StoreView) -> None:
        """Forget the workloads no longer pending nor placed, once there are many more than those."""
        if len(self.noted) > 2 * len(view.pending) + PRUNE_SLACK:
            live = {w.id for w in view.pending} | {a.workload.id for a in view.snapshot.allocations}
            self.noted &= live
            self.info = {k: v for k, v in self.info.items() if k in live}

    def load_history(self) -> None:
        """Run times of recently succeeded workloads, so estimates survive a restart."""
        self.history_loaded = True
        with self.rt.store.read() as session:
            rows = session.execute(
                select(W.c.tenant, W.c.spec, W.c.started_s, W.c.finished_s, W.c.progress_s)
                .where(W.c.status == WorkloadStatus.SUCCEEDED.value, W.c.started_s.is_not(None),
                       W.c.finished_s.is_not(None))
                .order_by(W.c.finished_s.desc()).limit(HISTORY_ROWS)
            ).all()
        for tenant, spec, started, finished, progress in reversed(rows):
            try:  # its queue and shape: estimates are kept by (tenant, queue, shape)
                parsed = WorkloadSpec.model_validate(spec, context=STORED)
                probe = to_workload("history", parsed, tenant, 0, 0.0)
            except ValidationError:
                continue  # a spec this version no longer reads: no history of it
            self.estimator.observe(probe, (finished - started) + (progress or 0.0), None)
        self._load_moves()

    def _load_moves(self) -> None:
        """How often each live workload was moved for locality and off congestion, from its events,
        so the bounds on moves per workload (`MoveRule.max_moves_each`, `MigrateRule.max_moves_each`)
        survive a restart."""
        live = (WorkloadStatus.PENDING.value, WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)
        with self.rt.store.read() as session:
            rows = session.execute(
                select(E.c.workload_id, E.c.reason, func.count(), func.max(E.c.at_s))
                .join(W, W.c.id == E.c.workload_id)
                .where(E.c.reason.in_((Reason.MOVED_FOR_LOCALITY.value, Reason.CONGESTION_MOVED.value)),
                       E.c.pod_id == "", E.c.to_status == WorkloadStatus.PENDING.value, W.c.status.in_(live))
                .group_by(E.c.workload_id, E.c.reason)
            ).all()
        for wid, reason, count, last in rows:
            before = self.info.get(wid) or WorkloadInfo()
            if reason == Reason.CONGESTION_MOVED.value:
                self.info[wid] = dataclasses.replace(before, congestion_moves=int(count))
            else:
                self.info[wid] = dataclasses.replace(before, moves=int(count), moved_s=float(last))
