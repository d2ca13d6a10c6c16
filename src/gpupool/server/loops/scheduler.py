"""The scheduling step: snapshot from the store, the core cycle, short writes, then launches.

Order matters for the crash-restart promise: pods are written as `launching` (with their node and
slices) in one transaction *before* they are handed to the nodes' launch workers (loops/launches.py),
and no provider call happens inside a transaction. The launches run outside the step; a later step
records what came of them (`record_launches`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, Row, bindparam, case, func, insert, select, update
from sqlalchemy.orm import Session

from gpupool.api.events import EventReason
from gpupool.api.workloads import WorkloadSpec
from gpupool.core.model import (
    Node,
    PodPlacement,
    PodRequest,
    Reason,
    Slice,
    Workload,
    WorkloadInfo,
    WorkloadStatus,
)
from gpupool.core.scheduling.backfill import RuntimeEstimator
from gpupool.core.scheduling.cycle import (
    Admit,
    CycleResult,
    Decision,
    EventKind,
    Policies,
    Refuse,
    Rejection,
    Reserve,
    Stop,
    Wait,
    unhandled,
)
from gpupool.core.scheduling.keeper import PRUNE_SLACK, ViewKeeper
from gpupool.pods import PodLaunch, nproc_per_node, torchrun_command
from gpupool.server.loops.fabric_view import FabricKeeper
from gpupool.server.loops.launches import LaunchWorkers
from gpupool.server.loops.snapshot import MAX_PENDING_PER_CYCLE, StoreView, WorkloadCache, load
from gpupool.server.loops.store_audit import StoreAudit
from gpupool.server.orm import Base, PodRow, TenantRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import enforcement, rendezvous
from gpupool.server.services.events import LOST, Move, apply_moves, not_made, transition
from gpupool.server.services.locks import lock_workloads
from gpupool.server.services.metering import slice_models
from gpupool.server.services.requeue import requeue, stop_each_after_commit, stop_pods
from gpupool.server.services.specs import to_workload
from gpupool.server.states import PodState

log = logging.getLogger("gpupool.scheduler")
FULL_RESCAN_S = 10.0
AUDIT_S = 60.0
"""How often (at most) a full pass checks the kept view against one built afresh from the store
(`ViewKeeper.cycle(audit=True)`); a difference would be a bug, and the view is then rebuilt. It
cannot see a store that diverged from the cache the snapshot is built from: `StoreAudit` does."""
LIMIT_CHECK_S = 0.5
"""How often the loop looks for workloads past their time limit."""
HISTORY_ROWS = 10_000
"""Succeeded workloads read at start-up for the run-time estimator's history."""
ARRIVAL_MARGIN_S = 10.0
ARRIVALS_PER_CYCLE = 128
"""A cycle that looks at new arrivals only takes at most this many, first in the core's order;
the rest go to the next cycles. A burst of submissions is then decided in several short cycles,
as if the loop had run during the burst, rather than one long one that holds up the API (which
shares the interpreter with the loop). Full passes read up to MAX_PENDING_PER_CYCLE."""
"""New arrivals are read from (newest seen - margin), so a slow commit is never skipped."""
_WAITS = "; it starts once the pods stopping on its devices have ended."
RECORD_CHUNK = 64
_W = Base.metadata.tables["workloads"]
_E = Base.metadata.tables["events"]
_P = Base.metadata.tables["pods"]
_INSERT_POD = insert(Base.metadata.tables["pods"])
_INSERT_EVENT = insert(Base.metadata.tables["events"])
_SET_REASON = update(_W).where(
    _W.c.id == bindparam("r_id"), _W.c.status == WorkloadStatus.PENDING.value,
    _W.c.reason != bindparam("r_reason"),
).values(
    reason=bindparam("r_reason"), message=bindparam("r_message"))


_Placed = tuple[Row[Any], Admit, list[PodPlacement], bool]
"""An admission to write: the workload's row as read, the decision, its placements by rank, and
whether its pods wait for a stopping pod to leave their devices."""


def _moves(a: Decision, b: Decision) -> bool:
    return type(a) is Stop and type(b) is Stop and a.kind is EventKind.MOVE and b.kind is EventKind.MOVE


def chunked(items: Sequence[Decision], size: int) -> Iterator[Sequence[Decision]]:
    """A cycle's decisions (`CycleResult.decisions`, in the order made) in transactions of about
    `size`: a stop and its requeue are one record, so they are never split, and a stop precedes the
    admission that takes its devices, in the same transaction or an earlier one. The cycle's
    topology moves (each a stop and an admission at once, one move taking the devices another
    leaves) stay in one transaction, where every stop is written before any admission."""
    start = 0
    while start < len(items):
        end = min(start + size, len(items))
        while end < len(items) and _moves(items[end - 1], items[end]):
            end += 1
        yield items[start:end]
        start = end


@dataclass(frozen=True, slots=True)
class CycleStats:
    admitted: int
    pending: int
    seconds: float
    stopped: int = 0
    """Workloads preempted or evicted by the cycle (requeued: the loop runs again at once)."""


@dataclass(slots=True)
class _Applied:
    """What a cycle's decisions came to, counted as they are applied."""

    admitted: int = 0
    requeued: int = 0
    """Stops that left work pending (preempted, evicted, migrated; not moves)."""
    reserved: bool = False


@dataclass(slots=True)
class _Batch:
    """One transaction's share of a cycle's decisions, sorted by kind."""

    stops: list[Stop] = dataclasses.field(default_factory=list)
    """Preempted, evicted, migrated and moved: each stopped and requeued (a move admitted again)."""
    admissions: list[Admit] = dataclasses.field(default_factory=list)
    rejections: list[Rejection] = dataclasses.field(default_factory=list)
    reservation: Reserve | None = None


class Scheduler:
    """One call of `cycle()` admits what fits now and hands it to the provider."""

    def __init__(self, rt: Runtime, policies: Policies, seed: int = 0) -> None:
        self.rt = rt
        self.policies = policies
        self.rng = random.Random(seed)
        self.cache = WorkloadCache()
        self.keeper: ViewKeeper = FabricKeeper(rt)
        """The core's view of the pool, kept from cycle to cycle and brought up to date with each
        snapshot, so a cycle costs what changed rather than the size of the pool."""
        self._inadmissible: set[str] = set()
        self._horizon_s: float | None = None
        self._last_full_s = float("-inf")
        self._last_nodes: tuple[Node, ...] = ()
        self._core_nodes: tuple[Node, ...] | None = None
        """The nodes the core last saw: a change (a device or node turned unhealthy) runs a cycle
        even with nothing pending, so that its work is evicted."""
        self.launches = LaunchWorkers(rt.provider, rt.clock, deadline_s=rt.settings.launch_deadline_s)
        """The nodes' launch workers (loops/launches.py): a slow node holds up only its own launches."""
        rt.launches = self.launches
        self._reasons: dict[str, str] = {}
        """The reason last stored for pending work this loop set aside (see `_apply`)."""
        self.info: dict[str, WorkloadInfo] = {}
        """What the core may know of a workload beyond its spec (run-time estimate from history,
        service received, progress kept): set on arrival and on requeue, as the replay does."""
        self._noted: set[str] = set()
        self.estimator = RuntimeEstimator()
        self._history_loaded = False
        self.reservation: tuple[str, float] | None = None
        """(head workload, expected start) as last stored."""
        self.on_slide: Callable[[float], None] | None = None
        """Told how far (seconds) the same head's reserved start moved later than last stored."""
        self.waiting = True
        """Whether pods may be waiting for a stopping pod to release their devices (checked at start)."""
        self.requeued = False
        """A cycle requeued work (preemption, eviction): the next cycle must look at all pending work."""
        self._next_limit_check_s = float("-inf")
        self._next_audit_s = float("-inf")
        self.store_audit = StoreAudit(rt.settings.store_audit_interval_s)
        """The cached placements against the store read afresh (loops/store_audit.py)."""
        self._backoff_s: float | None = None
        """When the next requeued workload's backoff ends (a full pass then looks at it)."""
        self.ports = rendezvous.PortBook()
        """The MASTER_PORT each multi-pod gang holds on its rank-0 node (services/rendezvous.py)."""

    # ------------------------------------------------------------------ the cycle

    def cycle(self, capacity_changed: bool = True) -> CycleStats:
        """Admit what fits now, and carry out the cycle's preemptions, evictions and reservation.

        Like Kueue's best-effort FIFO, work that did not fit is set aside until capacity may have
        changed (a pod ended, a cancel, an uncordon, a quota change, a node change) and only new
        arrivals are examined meanwhile; a full pass also runs every FULL_RESCAN_S.
        """
        start = time.perf_counter()
        now = self.rt.clock()
        exhausted = self.rt.budgets.exhausted_tenants(self.rt)  # every few seconds: spend, warnings
        if not self._history_loaded:
            self._load_history()
        backoff_over = self._backoff_s is not None and now >= self._backoff_s
        # before the snapshot is read: a difference drops the cache, so this cycle reads it afresh
        diverged = self.store_audit.due(now) and self.store_audit.check(self.rt, self.cache)
        if diverged:
            self._next_audit_s = float("-inf")  # and the kept view is checked against it
        full = (diverged or capacity_changed or self.requeued or backoff_over or self._horizon_s is None
                or now - self._last_full_s > FULL_RESCAN_S)
        self.requeued = False
        if full:
            self._inadmissible.clear()
            self._last_full_s = now
        limit = MAX_PENDING_PER_CYCLE if full else ARRIVALS_PER_CYCLE
        # Under backfill the head's reservation must hold in every cycle, so a cycle of new
        # arrivals looks at the reserved head too (else an arrival could take its devices).
        head = frozenset({self.reservation[0]}) if self.reservation is not None and not full else frozenset()
        view = load(self.rt, self.cache, since_s=None if full else self._horizon_s,
                    skip=frozenset(self._inadmissible - head), limit=limit, now_s=now, also=head)
        if full:
            self._backoff_s = view.next_backoff_s
        if view.snapshot.nodes != self._last_nodes:
            self._last_nodes = view.snapshot.nodes
            if not full:
                self._horizon_s = None  # nodes changed: look at everything next cycle
        more = not full and len(view.pending) >= limit
        if more:
            # More arrivals wait beyond this cycle's share: keep the horizon where it is (what is
            # decided now is admitted or set aside, so the next cycle reads the ones after it) and
            # run again soon, after the loop's rest.
            self.rt.wake.set()
        elif full or view.pending:
            newest = max((w.submit_time_s for w in view.pending), default=now) - ARRIVAL_MARGIN_S
            self._horizon_s = newest if self._horizon_s is None else max(self._horizon_s, newest)
        candidates = [w for w in view.pending if w.id not in self._inadmissible or w.id in head]
        nodes_changed = view.snapshot.nodes != self._core_nodes
        # with topology moves on, a full pass runs the cycle even with nothing pending: a spread
        # gang may move into a leaf that work ending has freed
        may_move = full and self.policies.moves is not None and bool(view.snapshot.allocations)
        # a telemetry sample waits to be judged (congested gangs may be due to move)
        sampled = self.rt.fabric is not None and self.rt.fabric.congestion_sample is not None
        if not candidates and not nodes_changed and not may_move and not sampled:
            if self.reservation is not None and not view.pending:
                self._clear_reservation()
            return CycleStats(0, len(view.pending), time.perf_counter() - start)
        self._core_nodes = view.snapshot.nodes
        self._note_arrivals(candidates)
        snapshot = dataclasses.replace(view.snapshot, workload_info=self.info)
        # the core enforces the queues' quotas itself (Kueue semantics), and tenants' budgets
        policies = dataclasses.replace(self.policies, quota=view.quota, exhausted_tenants=exhausted)
        audit = full and now >= self._next_audit_s
        if audit:
            self._next_audit_s = now + AUDIT_S
            drifts = self.keeper.drifts
        undoable = not full and self.policies.preemption
        rng_state = self.rng.getstate() if undoable else None
        result = self.keeper.cycle(snapshot, candidates, policies, now, self.rng, audit=audit,
                                   undoable=undoable)
        if audit and self.keeper.drifts != drifts:
            log.error("the scheduler's kept view had drifted from the store (its free capacity differed "
                      "from a view built afresh); it was built afresh")
        if rng_state is not None and result.victim_searches:
            # An arrival looked for victims, but a full pass may decide (and say) otherwise: older
            # work of its queue, set aside since the last one, comes first there, may hold the
            # backfill reservation (no preemption then) or use up the cycle's victim searches.
            # Nothing of this cycle is carried out: a full pass decides instead, from the same
            # random state, on the view built afresh.
            self.keeper.discard()
            self.rng.setstate(rng_state)
            return self.cycle(capacity_changed=True)
        launches, applied = self._record(result, view, more)
        self._launch(launches)
        if applied.requeued:
            self.requeued = True
        return CycleStats(applied.admitted, len(candidates), time.perf_counter() - start, applied.requeued)

    def _note_arrivals(self, pending: Sequence[Workload]) -> None:
        """A workload seen for the first time gets its history-based run-time estimate (when the
        user gave none), as the replay gives it on arrival."""
        noted = self._noted
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
        self._noted.discard(workload_id)
        if worked_s is None:
            return
        workload = self.cache.peek(workload_id)
        if workload is None:
            return
        used = info.runtime_estimate_s if info is not None else None
        self.estimator.observe(workload, worked_s, used if used is not None else workload.runtime_estimate_s)

    def _load_history(self) -> None:
        """Run times of recently succeeded workloads, so estimates survive a restart."""
        self._history_loaded = True
        with self.rt.store.read() as session:
            rows = session.execute(
                select(_W.c.tenant, _W.c.spec, _W.c.started_s, _W.c.finished_s, _W.c.progress_s)
                .where(_W.c.status == WorkloadStatus.SUCCEEDED.value, _W.c.started_s.is_not(None),
                       _W.c.finished_s.is_not(None))
                .order_by(_W.c.finished_s.desc()).limit(HISTORY_ROWS)
            ).all()
        for tenant, spec, started, finished, progress in reversed(rows):
            try:  # its queue and shape: estimates are kept by (tenant, queue, shape)
                probe = to_workload("history", WorkloadSpec.model_validate(spec), tenant, 0, 0.0)
            except ValidationError:
                continue  # a spec this version no longer reads: no history of it
            self.estimator.observe(probe, (finished - started) + (progress or 0.0), None)
        self._load_moves()

    def _load_moves(self) -> None:
        """How often each live workload was moved for locality, from its events, so the bound on
        moves per workload (`MoveRule.max_moves_each`) survives a restart."""
        live = (WorkloadStatus.PENDING.value, WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)
        with self.rt.store.read() as session:
            rows = session.execute(
                select(_E.c.workload_id, func.count(), func.max(_E.c.at_s))
                .join(_W, _W.c.id == _E.c.workload_id)
                .where(_E.c.reason == Reason.MOVED_FOR_LOCALITY.value, _E.c.pod_id == "",
                       _E.c.to_status == WorkloadStatus.PENDING.value, _W.c.status.in_(live))
                .group_by(_E.c.workload_id)
            ).all()
        for wid, count, last in rows:
            before = self.info.get(wid) or WorkloadInfo()
            self.info[wid] = dataclasses.replace(before, moves=int(count), moved_s=float(last))

    # ------------------------------------------------------------------ applying a cycle's decisions

    def _record(self, result: CycleResult, view: StoreView, more: bool) -> tuple[list[PodLaunch], _Applied]:
        """Every decision of the cycle, in short transactions of bulk statements, RECORD_CHUNK
        decisions at a time so that submissions are never kept waiting on the store's write lock
        for long; returns the pods to launch (after every chunk is committed).

        `more`: arrivals wait beyond this cycle's share; the refused are then set aside too (their
        refusal is stored only once every node is schedulable)."""
        now = self.rt.clock()
        by_id = {w.id: w for w in view.pending}
        items = result.decisions
        stopped = [d for d in items if type(d) is Stop]
        if self.policies.moves is not None and any(d.kind is EventKind.MOVE for d in stopped):
            # running work it moves is admitted again: its spec is the snapshot's
            running = {a.workload.id: a.workload for a in view.snapshot.allocations}
            by_id.update((d.workload_id, running[d.workload_id]) for d in stopped if d.kind is EventKind.MOVE)
        # the provider's facts are asked for before any transaction opens, in one call for the cycle
        marks = self.rt.provider.checkpoint_marks([d.workload_id for d in stopped]) if stopped else {}
        launches: list[PodLaunch] = []
        applied = _Applied()
        for n, chunk in enumerate(chunked(items, 2 * RECORD_CHUNK)):
            if n:
                time.sleep(0)  # let a waiting submission batch take the write lock in between
            launches += self._apply(chunk, view, by_id, marks, now, applied, more)
        if not applied.reserved and self.reservation is not None:
            self._clear_reservation()
        return launches, applied

    def _apply(self, chunk: Sequence[Decision], view: StoreView, by_id: dict[str, Workload],
               marks: dict[str, float | None], now: float, applied: _Applied, more: bool) -> list[PodLaunch]:
        """One transaction: every decision kind is dispatched here, in one match (a kind the core
        learns later fails the type check at `unhandled`, and raises there, rather than being
        dropped silently)."""
        batch = _Batch()
        inadmissible = self._inadmissible
        for decision in chunk:
            match decision:
                case Wait():
                    batch.rejections.append(decision)
                    inadmissible.add(decision.workload_id)
                case Stop(kind=EventKind.MOVE):  # stopped, requeued and admitted at once elsewhere
                    batch.stops.append(decision)
                    batch.admissions.append(Admit(decision.workload_id, decision.placements))
                case Stop():
                    batch.stops.append(decision)
                    applied.requeued += 1
                case Admit():
                    batch.admissions.append(decision)
                    applied.admitted += 1
                case Refuse():
                    batch.rejections.append(decision)
                    if more:
                        inadmissible.add(decision.workload_id)
                case Reserve():
                    batch.reservation = decision
                    applied.reserved = True
                case _:
                    unhandled(decision)
        to_stop: list[tuple[str, float]] = []
        recorded: list[dict[str, object]] = []
        launches: list[PodLaunch] = []
        allocated: list[tuple[str, list[str], list[PodPlacement]]] = []
        with self.rt.store.write() as session:
            if batch.stops:
                with session.no_autoflush:  # each requeue's pod query would flush the ones before it
                    to_stop = self._requeue(session, batch, marks, now)
                session.flush()
            conn = session.connection()
            if batch.admissions:
                launches, allocated = self._admit(conn, batch.admissions, by_id, now)
            recorded = self._reject(conn, batch.rejections, view, now)
            if batch.reservation is not None:
                self._write_reservation(conn, batch.reservation)
        if batch.reservation is not None:
            before, reserved = self.reservation, batch.reservation
            if (self.on_slide is not None and before is not None and before[0] == reserved.workload_id
                    and reserved.start_s > before[1]):
                self.on_slide(reserved.start_s - before[1])
            self.reservation = (reserved.workload_id, reserved.start_s)
        self._remember_reasons(recorded, view)
        for workload_id, pod_ids, placements in allocated:
            self.cache.admitted(by_id[workload_id], pod_ids, placements, now)
        # a victim's launch still queued is taken back: it never starts, and the pods waiting on its
        # devices are promoted at the next step rather than after its start-then-stop
        stop_each_after_commit(self.rt, to_stop, now)
        return launches

    def _requeue(self, session: Session, batch: _Batch, marks: dict[str, float | None],
                 now: float) -> list[tuple[str, float]]:
        """Stopped workloads (preempted, evicted, migrated, moved): their pods stop (SIGTERM, the
        class's grace unless the stop has none, SIGKILL) and they go back to pending, with the work
        lost since their last checkpoint (`marks`, read from the provider before the transaction)
        accounted.

        The rows are read FOR UPDATE, in id order: a cancel that comes after this read waits for the
        commit and then cancels the requeued workload, rather than being written over by it."""
        to_stop: list[tuple[str, float]] = []
        rows = {row.id: row for row in session.scalars(
            select(WorkloadRow).where(WorkloadRow.id.in_({d.workload_id for d in batch.stops}))
            .order_by(WorkloadRow.id).with_for_update())}
        for stop in batch.stops:
            row = rows.get(stop.workload_id)
            if row is None or row.status not in (WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value):
                # it ended (or was cancelled) while the cycle ran: the requeue lost, told as any other
                not_made("workload", LOST, stop.workload_id, _PLACED_LABEL, WorkloadStatus.PENDING.value,
                         stop.reason.value)
                continue
            grace = self._grace_s(row.spec) if stop.grace else 0.0
            mark = marks.get(row.id) if row.started_s is not None else None
            pods = requeue(session, row, stop.reason.value, stop.message, now, mark=mark)
            to_stop += [(pod_id, grace) for pod_id in pods]
            self._requeued_info(row, now if stop.kind is EventKind.MOVE else None)
        return to_stop

    def _requeued_info(self, row: WorkloadRow, moved_s: float | None) -> None:
        """What the core should know of a requeued workload: the service it received, the progress
        it keeps (its checkpoints), its run-time estimate, and how often it was moved for locality
        (one more when `moved_s`, the time of this move, is given)."""
        before = self.info.get(row.id) or WorkloadInfo()
        self.info[row.id] = WorkloadInfo(
            attained_service_s=row.run_s * row.device_milli / 1000.0,
            progress_s=row.progress_s,
            runtime_estimate_s=before.runtime_estimate_s,
            moves=before.moves + (moved_s is not None),
            moved_s=before.moved_s if moved_s is None else moved_s,
        )

    def _admit(self, conn: Connection, admissions: Sequence[Admit], by_id: dict[str, Workload],
               now: float) -> tuple[list[PodLaunch], list[tuple[str, list[str], list[PodPlacement]]]]:
        """Pods of the admitted workloads, `launching` (handed to the provider after the commit) or,
        where a device they take still holds a stopping pod, `waiting` (launched once it ended).

        Each workload's move to admitted is a compare-and-set on the pending status read here, made
        before anything else is written for it: one that lost (the user cancelled it since) gets no
        pod rows, no port and no launch."""
        admitted = _states(conn, [a.workload_id for a in admissions], with_spec=True)
        busy = _busy_devices(conn)
        placed: list[_Placed] = []
        moves: list[Move] = []
        for admission in admissions:
            row = admitted.get(admission.workload_id)
            if row is None or row.status != WorkloadStatus.PENDING.value:
                continue  # cancelled while the cycle ran
            in_order = sorted(admission.placements, key=lambda p: int(p.pod.removeprefix("r")))
            wait = bool(busy) and any((p.node, s.device_index) in busy for p in in_order for s in p.slices)
            where = ", ".join(sorted({p.node for p in admission.placements}))
            moves.append(Move(
                row.id, row.status, WorkloadStatus.ADMITTED.value, EventReason.ADMITTED,
                f"Placed on {where}" + (_WAITS if wait else "."),
                now, columns=(("attempt", row.attempt + 1), ("admitted_s", now), ("reserved_start_s", None)),
                # not held or waiting on a dependency since the cycle read it, nor updated
                expect=(("held", ""), ("waiting_on", ""), ("revision", self.cache.revision(row.id))),
            ))
            placed.append((row, admission, in_order, wait))
        lost = {m.workload_id for m in apply_moves(conn, moves)}
        if lost:
            log.info("%d admissions lost to a change made since the cycle read them (a cancel); "
                     "dropped", len(lost))
        return self._place_pods(conn, [p for p in placed if p[0].id not in lost], by_id, now)

    def _place_pods(self, conn: Connection, placed: list[_Placed], by_id: dict[str, Workload],
                    now: float) -> tuple[list[PodLaunch], list[tuple[str, list[str], list[PodPlacement]]]]:
        """The pod rows (and launches) of admissions whose move to admitted held."""
        launches: list[PodLaunch] = []
        pods: list[dict[str, object]] = []
        allocated: list[tuple[str, list[str], list[PodPlacement]]] = []
        notes: list[dict[str, object]] = []
        limits = _LimitNotes(self.rt)
        accounts = _unix_users(conn, {row.tenant for row, _, _, _ in placed})
        for row, admission, in_order, wait in placed:
            self._reasons.pop(row.id, None)
            attempt = row.attempt + 1
            world = len(admission.placements)
            allocated.append((row.id, [f"{row.id}-a{attempt}-{p.pod}" for p in in_order], in_order))
            state = PodState.WAITING if wait else PodState.LAUNCHING
            ranks = {int(p.pod.removeprefix("r")): p.node for p in in_order}
            gang = rendezvous.plan(self.rt, conn, self.ports, row, attempt, ranks) if world > 1 else None
            for placement in admission.placements:
                rank = int(placement.pod.removeprefix("r"))
                pod_id = f"{row.id}-a{attempt}-r{rank}"
                request = by_id[row.id].pods[rank]
                cpu_milli, memory_mib = placement.held_host(request)
                pods.append(dict(
                    id=pod_id, workload_id=row.id, attempt=attempt, name=placement.pod, rank=rank,
                    status=state.value, node=placement.node,
                    slices=[{"device_index": s.device_index, "compute_milli": s.compute_milli,
                             "memory_mib": s.memory_mib} for s in placement.slices],
                    models=slice_models(limits.node(placement.node), placement.slices),
                    cpu_milli=cpu_milli, memory_mib=memory_mib,
                    message="Waits for a preempted pod to leave its device." if wait else "",
                    created_s=now, exit_code=None, finished_s=None,
                ))
                if not wait:
                    account = accounts.get(row.tenant) or ""
                    launches.append(self._pod_launch(row, pod_id, placement.node, placement.slices, rank,
                                                     world, cpu_milli, memory_mib, account, gang=gang))
                held = dataclasses.replace(request, cpu_milli=cpu_milli, memory_mib=memory_mib)
                notes += limits.events(row.id, pod_id, placement.node, held, now)  # what it holds
            if wait:
                self.waiting = True
        if pods:
            conn.execute(_INSERT_POD, pods)
        if notes:
            conn.execute(_INSERT_EVENT, notes)
        return launches, allocated

    def _reject(self, conn: Connection, rejections: Sequence[Rejection], view: StoreView,
                now: float) -> list[dict[str, object]]:
        """Final rejections fail their workload (only while every node is schedulable); the others
        record why the workload waits, where that changed. Returns the reasons recorded."""
        final = view.unschedulable_nodes == 0
        failed = _states(conn, [r.workload_id for r in rejections if r.final and final], with_spec=False)
        moves: list[Move] = []
        reasons: list[dict[str, object]] = []
        for rejection in rejections:
            if rejection.final and final:
                row = failed.get(rejection.workload_id)
                if row is not None and row.status == WorkloadStatus.PENDING.value:
                    moves.append(Move(row.id, row.status, WorkloadStatus.FAILED.value,
                                      rejection.reason.value, rejection.message, now,
                                      columns=(("finished_s", now),)))
            elif self._reasons.get(rejection.workload_id) != rejection.reason.value:
                # The row's reason is set only where it differs (the UPDATE checks): the rows of
                # work that waits cycle after cycle for the same reason are not even read.
                reasons.append({"r_id": rejection.workload_id, "r_reason": rejection.reason.value,
                                "r_message": rejection.message[:1024]})
        apply_moves(conn, moves)
        if reasons:
            conn.execute(_SET_REASON, reasons)
        return reasons

    def _write_reservation(self, conn: Connection, reserved: Reserve) -> None:
        """Under backfill: the head workload's expected start, for `gpupool show` and `queue ls`."""
        start = round(reserved.start_s, 1)
        if self.reservation is not None and self.reservation[0] == reserved.workload_id \
                and round(self.reservation[1], 1) == start:
            return
        conn.execute(update(_W).where(_W.c.reserved_start_s.is_not(None), _W.c.id != reserved.workload_id)
                     .values(reserved_start_s=None))
        conn.execute(update(_W).where(_W.c.id == reserved.workload_id,
                                      _W.c.status == WorkloadStatus.PENDING.value)
                     .values(reserved_start_s=start))

    def _clear_reservation(self) -> None:
        """No head holds a reservation any more (nothing waits, or the cycle made none)."""
        with self.rt.store.write() as session:
            session.connection().execute(update(_W).where(_W.c.reserved_start_s.is_not(None))
                                         .values(reserved_start_s=None))
        self.reservation = None

    def _remember_reasons(self, recorded: list[dict[str, object]], view: StoreView) -> None:
        """Note the reasons now stored (after their commit), forgetting work no longer pending."""
        if len(self._reasons) > 2 * len(view.pending) + 1024:
            still = {w.id for w in view.pending} | self._inadmissible
            self._reasons = {k: v for k, v in self._reasons.items() if k in still}
        for item in recorded:
            self._reasons[str(item["r_id"])] = str(item["r_reason"])
        if len(self._noted) > 2 * len(view.pending) + PRUNE_SLACK:
            live = {w.id for w in view.pending} | {a.workload.id for a in view.snapshot.allocations}
            self._noted &= live
            self.info = {k: v for k, v in self.info.items() if k in live}

    # ------------------------------------------------------------------ pods waiting for their devices

    def promote_waiting(self) -> int:
        """Hand to the provider the waiting pods whose devices no stopping pod holds any more (a
        whole gang at once); returns how many workloads were started."""
        if not self.waiting:
            return 0
        launches: list[PodLaunch] = []
        with self.rt.store.write() as session:
            conn = session.connection()
            waiting = conn.execute(
                select(_P.c.id, _P.c.workload_id, _P.c.rank, _P.c.node, _P.c.slices, _P.c.cpu_milli,
                       _P.c.memory_mib).where(_P.c.status == PodState.WAITING.value)
            ).all()
            if not waiting:
                self.waiting = False
                return 0
            busy = _busy_devices(conn)
            gangs: dict[str, list[Any]] = {}
            for pod in waiting:
                gangs.setdefault(pod.workload_id, []).append(pod)
            ready = {wid: pods for wid, pods in gangs.items()
                     if not any((p.node, s["device_index"]) in busy for p in pods for s in p.slices)}
            if not ready:
                return 0
            lock_workloads(conn, ready)  # before their pods are written
            ready = _still_waiting(conn, ready)  # each gang's promotion: a compare-and-set on the read
            if not ready:
                return 0
            conn.execute(update(_P).where(_P.c.workload_id.in_(ready), _P.c.status == PodState.WAITING.value)
                         .values(status=PodState.LAUNCHING.value, message=""))
            rows = _states(conn, list(ready), with_spec=True)
            accounts = _unix_users(conn, {row.tenant for row in rows.values()})
            for wid, pods in ready.items():
                row = rows[wid]
                gang = rendezvous.recorded(self.rt, row, row.attempt, {p.rank: p.node for p in pods})
                for pod in pods:
                    slices = tuple(Slice(**s) for s in pod.slices)
                    launches.append(self._pod_launch(row, pod.id, pod.node, slices, pod.rank, len(pods),
                                                     pod.cpu_milli, pod.memory_mib,
                                                     accounts.get(row.tenant) or "", gang=gang))
        self._launch(launches)
        return len(ready)

    # ------------------------------------------------------------------ time limits

    def enforce_time_limits(self) -> int:
        """Stop the workloads past their time limit (`submit --time-limit`): failed, reason
        time_limit. Checked at most every LIMIT_CHECK_S."""
        now = self.rt.clock()
        if now < self._next_limit_check_s:
            return 0
        self._next_limit_check_s = now + LIMIT_CHECK_S
        to_stop: list[tuple[str, float]] = []
        ended: list[str] = []
        with self.rt.store.write() as session:
            rows = session.scalars(select(WorkloadRow).where(
                WorkloadRow.status.in_((WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)),
                WorkloadRow.time_limit_s.is_not(None), WorkloadRow.started_s.is_not(None),
                WorkloadRow.started_s + WorkloadRow.time_limit_s <= now)
                .with_for_update()).all()  # a cancel after this read waits for the commit
            for row in rows:
                grace = self._grace_s(row.spec)
                to_stop += [(pod_id, grace) for pod_id in stop_pods(session, row, PodState.STOPPED, now)]
                row.finished_s = now
                transition(session, row, WorkloadStatus.FAILED.value, EventReason.TIME_LIMIT,
                           f"Stopped at its time limit of {_duration(row.time_limit_s or 0.0)}; give it a "
                           "longer "
                           "--time-limit, or make it checkpoint and resume.", now)
                ended.append(row.id)
        stop_each_after_commit(self.rt, to_stop, now)  # a launch not begun is taken back
        for workload_id in ended:
            self.finished(workload_id, None)
            _forget(self.rt, workload_id)
        return len(ended)

    # ------------------------------------------------------------------ launching

    def _grace_s(self, spec: dict[str, Any]) -> float:
        """SIGTERM to SIGKILL when a pod of this spec's priority class is preempted."""
        return self.rt.config.grace_s(str(spec.get("priority_class") or ""))

    def _pod_launch(self, row: Row[Any], pod_id: str, node: str, slices: tuple[Slice, ...], rank: int,
                    world: int, cpu_milli: int, memory_mib: int, unix_user: str = "",
                    gang: rendezvous.Gang | None = None) -> PodLaunch:
        spec = row.spec
        env = {str(k): str(v) for k, v in dict(spec.get("env", {})).items()}
        env.update({"GPUPOOL_WORKLOAD_ID": row.id, "GPUPOOL_POD_ID": pod_id, "GPUPOOL_TENANT": row.tenant,
                    "GPUPOOL_ATTEMPT": str(row.attempt + 1 if row.status == WorkloadStatus.PENDING.value
                                           else row.attempt),
                    "GPUPOOL_PREEMPT_GRACE_S": f"{self._grace_s(spec):g}"})
        if spec.get("submit_dir"):  # where `gpupool submit` ran (SLURM_SUBMIT_DIR); see agent/workdir.py
            env["GPUPOOL_SUBMIT_DIR"] = str(spec["submit_dir"])
        if spec.get("array_index") is not None:  # one task of `gpupool submit --array`
            env["GPUPOOL_ARRAY_INDEX"] = str(spec["array_index"])
        if spec["command"][-2:] == ["-m", "gpupool.remote.worker"]:  # a function's worker pod: the API's
            from gpupool.server.services import calls  # URL and its call token (services/calls.py)
            env.update(calls.pod_env(self.rt, pod_id))
        command = tuple(spec["command"])
        if spec.get("launcher") == "torchrun":  # `submit --launcher torchrun`: each pod one torch node
            command = torchrun_command(command, nnodes=world, node_rank=rank, nproc=nproc_per_node(slices),
                                       master_addr=gang.master_addr if gang else "127.0.0.1",
                                       master_port=gang.master_port if gang else 0)
        return PodLaunch(
            pod_id=pod_id, workload_id=row.id, node=node, command=command,
            slices=slices, cpu_milli=cpu_milli, memory_mib=memory_mib, env=env,
            workdir=str(spec.get("workdir", "")), rank=rank, world_size=world, tenant=row.tenant,
            unix_user=unix_user, separate_stderr=bool(spec.get("separate_stderr", False)),
            **(gang.launch_fields(rank) if gang is not None else {}),
        )

    def _launch(self, launches: list[PodLaunch]) -> None:
        """Hand launches (recorded `launching` by a committed transaction) to the nodes' launch
        workers; `record_launches` records what came of them."""
        self.launches.submit(launches)

    def record_launches(self) -> int:
        """Record the launch outcomes ready now; returns how many.

        A pod that started is metered from its own start, and its workload (still `admitted`, in the
        attempt the pod belongs to) runs; a pod stopped meanwhile (a cancel, a preemption) is stopped
        with the provider now that the provider knows it. A pod whose launch failed never ran, so it
        is final at once (its slices free, a cancel of it done) and its workload, when the pod is of
        its current attempt and it is still placed, fails with the reason. Every write is a
        compare-and-set on the state read: a cancel committed while the launch was in flight wins."""
        outcomes = self.launches.collect()
        if not outcomes:
            return 0
        now = self.rt.clock()
        workload_of = {o.launch.pod_id: o.launch.workload_id for o in outcomes}
        started = {o.launch.pod_id: o.started_s for o in outcomes if o.started_s is not None}
        failed = {o.launch.pod_id: o.why for o in outcomes if o.started_s is None}
        to_stop: list[str] = []
        failed_workloads: dict[str, str] = {}
        with self.rt.store.write() as session, session.no_autoflush:
            conn = session.connection()
            lock_workloads(conn, set(workload_of.values()))  # before their pods
            pods = {r.id: r for r in conn.execute(select(_P.c.id, _P.c.status, _P.c.attempt)
                                                  .where(_P.c.id.in_(workload_of)))}
            if started:
                conn.execute(
                    # metered from its start, even a pod stopped (cancelled) while it was being launched
                    update(PodRow).where(PodRow.id == bindparam("p_id"), PodRow.started_s.is_(None))
                    .values(status=case((PodRow.status == PodState.LAUNCHING.value, PodState.RUNNING.value),
                                        else_=PodRow.status), started_s=bindparam("p_started_s")),
                    [{"p_id": pod_id, "p_started_s": at} for pod_id, at in started.items()],
                )
                # Stopped while it was being launched: the provider may not have known it when asked.
                to_stop += conn.scalars(select(PodRow.id).where(
                    PodRow.id.in_(started), PodRow.status == PodState.STOPPING.value)).all()
            for pod_id, why in failed.items():  # never started: nothing to wait for
                conn.execute(update(PodRow).where(
                    PodRow.id == pod_id, PodRow.started_s.is_(None),
                    PodRow.status.in_((PodState.LAUNCHING.value, PodState.STOPPING.value)),
                ).values(status=PodState.FAILED.value, finished_s=now,
                         message=f"Never started: {why}"[:1024]))
            states = _states(conn, sorted(set(workload_of.values())), with_spec=False)
            first_start: dict[str, float] = {}
            for pod_id, workload_id in workload_of.items():
                pod, row = pods.get(pod_id), states.get(workload_id)
                if (pod is None or row is None or pod.status != PodState.LAUNCHING.value
                        or pod.attempt != row.attempt):
                    continue  # stopped meanwhile, or of an attempt the workload has left
                at = started.get(pod_id)
                if at is None:
                    failed_workloads.setdefault(workload_id, failed[pod_id])
                else:
                    first_start[workload_id] = min(at, first_start.get(workload_id, at))
            placed = (WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)
            for workload_id, why in failed_workloads.items():  # rare: the ORM path, with its pods
                orm_row = session.get(WorkloadRow, workload_id, with_for_update=True)
                if (orm_row is None or orm_row.status not in placed
                        or orm_row.attempt != states[workload_id].attempt):
                    continue
                to_stop += stop_pods(session, orm_row, PodState.FAILED, now)
                transition(session, orm_row, WorkloadStatus.FAILED.value, EventReason.LAUNCH_FAILED,
                           f"The provider could not start it: {why}", now)
                orm_row.finished_s = now
            session.flush()
            apply_moves(conn, [Move(workload_id, WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value,
                                    EventReason.LAUNCHED, "Started.", now, columns=(("started_s", at),))
                               for workload_id, at in first_start.items()
                               if workload_id not in failed_workloads
                               and states[workload_id].status == WorkloadStatus.ADMITTED.value])
        if failed:
            self.rt.capacity_may_have_changed()
        for pod_id in [*to_stop, *failed]:  # a failed launch may have left something
            self.rt.provider.stop(pod_id, grace_s=0)
        return len(outcomes)


def _states(conn: Connection, ids: Sequence[str], *, with_spec: bool) -> dict[str, Row[Any]]:
    """id, status, attempt, reason and tenant (and the spec, for launches) of the workloads `ids`,
    in one query."""
    if not ids:
        return {}
    columns = [_W.c.id, _W.c.status, _W.c.attempt, _W.c.reason, _W.c.tenant]
    if with_spec:
        columns.append(_W.c.spec)
    return {r.id: r for r in conn.execute(select(*columns).where(_W.c.id.in_(set(ids))))}


class _LimitNotes:
    """The `limits_unenforced` events of one transaction's admissions (node layers computed once).

    None on a simulated node: nothing there is enforced, ever, and `gpupool node ls` says so once for
    the node (`gpupool show` derives the workload's unenforced limits from its nodes' layers), where
    an event would repeat it on every workload."""

    def __init__(self, rt: Runtime) -> None:
        self._missing = rt.provider.missing_capabilities()
        self._nodes = {n.name: n for n in rt.nodes()}
        self._sentences: dict[tuple[str, bool, bool], list[str]] = {}

    def node(self, name: str) -> Node | None:
        return self._nodes.get(name)

    def events(self, workload_id: str, pod_id: str, node_name: str, request: PodRequest,
               now: float) -> list[dict[str, object]]:
        node = self._nodes.get(node_name)
        if node is None or any(d.simulated for d in node.devices):
            return []
        key = (node_name, *enforcement.limits_asked(request))
        sentences = self._sentences.get(key)
        if sentences is None:
            layers = enforcement.node_layers(node, self._missing)
            sentences = self._sentences[key] = enforcement.unenforced(node, layers, request)
        admitted = WorkloadStatus.ADMITTED.value
        return [{"workload_id": workload_id, "pod_id": pod_id, "from_status": admitted,
                 "to_status": admitted, "reason": EventReason.LIMITS_UNENFORCED.value,
                 "message": sentence[:1024], "at_s": now} for sentence in sentences]


def _unix_users(conn: Connection, tenants: set[str]) -> dict[str, str | None]:
    """The Unix account the admin mapped to each of `tenants` (None: the pool's own account)."""
    if not tenants:
        return {}
    return dict(conn.execute(select(TenantRow.name, TenantRow.unix_user)
                             .where(TenantRow.name.in_(tenants))).all())


_PLACED_LABEL = f"{WorkloadStatus.ADMITTED.value}|{WorkloadStatus.RUNNING.value}"
"""The from of a stop that lost: it expects its workload placed, admitted or running."""


def _still_waiting(conn: Connection, ready: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The gangs of `ready` (read before their workloads were locked) whose pods all still wait: a
    gang a change reached since (a cancel stopped its pods) is not launched, its moves to launching
    lost (`not_made`)."""
    now_in: dict[str, str] = {r.id: r.status for r in conn.execute(
        select(_P.c.id, _P.c.status).where(_P.c.workload_id.in_(ready)))}
    kept: dict[str, list[Any]] = {}
    for wid, pods in ready.items():
        changed = [p.id for p in pods if now_in.get(p.id) != PodState.WAITING.value]
        for pod_id in changed:
            not_made("pod", LOST, pod_id, PodState.WAITING.value, PodState.LAUNCHING.value, "promoted")
        if not changed:
            kept[wid] = pods
    return kept


def _busy_devices(conn: Connection) -> set[tuple[str, int]]:
    """(node, device index) of every device a stopping pod still holds."""
    busy: set[tuple[str, int]] = set()
    query = select(_P.c.node, _P.c.slices).where(_P.c.status == PodState.STOPPING.value)
    for node, slices in conn.execute(query):
        busy.update((node, s["device_index"]) for s in slices)
    return busy


def _duration(seconds: float) -> str:
    """3600 -> '1h', 5400 -> '1h30m', 90 -> '1m30s'."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "") + (f"{secs}s" if secs else "")
    return text or "0s"


def _forget(rt: Runtime, workload_id: str) -> None:
    """The workload ended for good: the provider may drop what it kept for it (its checkpoints)."""
    rt.provider.forget_workload(workload_id)
