"""The decision applier: a cycle's decisions (`CycleResult.decisions`) written to the store.

Every decision kind is dispatched in one match (`DecisionApplier._apply`: a kind the core learns
later fails the type check at `unhandled` rather than being dropped), in short transactions of bulk
statements, RECORD_CHUNK decisions at a time: stops requeue their workloads (their pods stopping),
admissions write their pods `launching` (or `waiting` on a stopping pod's devices) and return their
launches, to be handed over after the commit, refusals and waits record why, a reservation is
stored. Each write is a compare-and-set on the state read (a cancel committed meanwhile wins).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, bindparam, insert, select, update
from sqlalchemy.orm import Session

from gpupool.api.events import EventReason
from gpupool.core.model import PodPlacement, Workload, WorkloadStatus
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
from gpupool.pods import PodLaunch
from gpupool.server.loops.arrivals import Estimates, Window
from gpupool.server.loops.launching import PodLauncher, preempt_grace_s
from gpupool.server.loops.rows import W, busy_devices, states, unix_users
from gpupool.server.loops.snapshot import StoreView, WorkloadCache
from gpupool.server.orm import Base, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import rendezvous
from gpupool.server.services.events import LOST, Move, apply_moves, not_made
from gpupool.server.services.metering import slice_models
from gpupool.server.services.requeue import requeue, stop_each_after_commit
from gpupool.server.states import PodState

log = logging.getLogger("gpupool.scheduler")
_WAITS = "; it starts once the pods stopping on its devices have ended."
RECORD_CHUNK = 64
_INSERT_POD = insert(Base.metadata.tables["pods"])
_SET_REASON = update(W).where(
    W.c.id == bindparam("r_id"), W.c.status == WorkloadStatus.PENDING.value,
    W.c.reason != bindparam("r_reason"),
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




@dataclass(slots=True)
class Applied:
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


class DecisionApplier:
    """Writes each cycle's decisions (`record`) and keeps what was last written: the pending reasons
    stored, the backfill reservation."""

    def __init__(self, rt: Runtime, policies: Policies, cache: WorkloadCache, window: Window,
                 estimates: Estimates, launcher: PodLauncher, ports: rendezvous.PortBook) -> None:
        self.rt = rt
        self.policies = policies
        self.cache = cache
        self.window = window
        """Work a wait (or a refusal, when more arrivals wait) sets aside until the next full pass."""
        self.estimates = estimates
        self.launcher = launcher
        self.ports = ports
        """The MASTER_PORT each multi-pod gang holds on its rank-0 node (services/rendezvous.py)."""
        self.reasons: dict[str, str] = {}
        """The reason last stored for pending work this loop set aside (see `_apply`)."""
        self.reservation: tuple[str, float] | None = None
        """(head workload, expected start) as last stored."""
        self.on_slide: Callable[[float], None] | None = None
        """Told how far (seconds) the same head's reserved start moved later than last stored."""

    def record(self, result: CycleResult, view: StoreView, more: bool) -> tuple[list[PodLaunch], Applied]:
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
        applied = Applied()
        for n, chunk in enumerate(chunked(items, 2 * RECORD_CHUNK)):
            if n:
                time.sleep(0)  # let a waiting submission batch take the write lock in between
            launches += self._apply(chunk, view, by_id, marks, now, applied, more)
        if not applied.reserved and self.reservation is not None:
            self.clear_reservation()
        return launches, applied

    def _apply(self, chunk: Sequence[Decision], view: StoreView, by_id: dict[str, Workload],
               marks: dict[str, float | None], now: float, applied: Applied, more: bool) -> list[PodLaunch]:
        """One transaction: every decision kind is dispatched here, in one match (a kind the core
        learns later fails the type check at `unhandled`, and raises there, rather than being
        dropped silently)."""
        batch = _Batch()
        inadmissible = self.window.inadmissible
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
            recorded = self._reject(conn, batch.rejections, now)
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
            grace = preempt_grace_s(self.rt, row.spec) if stop.grace else 0.0
            mark = marks.get(row.id) if row.started_s is not None else None
            pods = requeue(session, row, stop.reason.value, stop.message, now, mark=mark)
            self.cache.requeued(row.id)
            to_stop += [(pod_id, grace) for pod_id in pods]
            self.estimates.requeued(row, now if stop.kind is EventKind.MOVE else None,
                                    migrated=stop.kind is EventKind.MIGRATE)
        return to_stop

    def _admit(self, conn: Connection, admissions: Sequence[Admit], by_id: dict[str, Workload],
               now: float) -> tuple[list[PodLaunch], list[tuple[str, list[str], list[PodPlacement]]]]:
        """Pods of the admitted workloads, `launching` (handed to the provider after the commit) or,
        where a device they take still holds a stopping pod, `waiting` (launched once it ended).

        Each workload's move to admitted is a compare-and-set on the pending status read here, made
        before anything else is written for it: one that lost (the user cancelled it since) gets no
        pod rows, no port and no launch."""
        admitted = states(conn, [a.workload_id for a in admissions], with_spec=True)
        busy = busy_devices(conn)
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
        # A node's unenforced limits are said once for the node (node ls, node show), and `gpupool
        # show` derives a workload's from its nodes' layers: no event on every workload placed there.
        nodes = {n.name: n for n in self.rt.nodes()}
        accounts = unix_users(conn, {row.tenant for row, _, _, _ in placed})
        for row, admission, in_order, wait in placed:
            self.reasons.pop(row.id, None)
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
                    models=slice_models(nodes.get(placement.node), placement.slices),
                    cpu_milli=cpu_milli, memory_mib=memory_mib,
                    message="Waits for a preempted pod to leave its device." if wait else "",
                    created_s=now, exit_code=None, finished_s=None,
                    epoch=self.rt.store.fence_epoch(),  # the leader's (several servers), else None
                ))
                if not wait:
                    account = accounts.get(row.tenant) or ""
                    launches.append(self.launcher.pod_launch(row, pod_id, placement.node, placement.slices,
                                                             rank, world, cpu_milli, memory_mib, account,
                                                             gang=gang, conn=conn))
            if wait:
                self.launcher.waiting = True
        if pods:
            conn.execute(_INSERT_POD, pods)
        return launches, allocated

    def _reject(self, conn: Connection, rejections: Sequence[Rejection],
                now: float) -> list[dict[str, object]]:
        """Final rejections fail their workload (the core judged on the pool as built: a cordoned
        node, or one with a failed device, counts as the room it has when it is back); the others
        record why the workload waits, where that changed. Returns the reasons recorded."""
        failed = states(conn, [r.workload_id for r in rejections if r.final], with_spec=False)
        moves: list[Move] = []
        reasons: list[dict[str, object]] = []
        for rejection in rejections:
            if rejection.final:
                row = failed.get(rejection.workload_id)
                if row is not None and row.status == WorkloadStatus.PENDING.value:
                    moves.append(Move(row.id, row.status, WorkloadStatus.FAILED.value,
                                      rejection.reason.value, rejection.message, now,
                                      columns=(("finished_s", now),)))
            elif self.reasons.get(rejection.workload_id) != rejection.reason.value:
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
        conn.execute(update(W).where(W.c.reserved_start_s.is_not(None), W.c.id != reserved.workload_id)
                     .values(reserved_start_s=None))
        conn.execute(update(W).where(W.c.id == reserved.workload_id,
                                      W.c.status == WorkloadStatus.PENDING.value)
                     .values(reserved_start_s=start))

    def clear_reservation(self) -> None:
        """No head holds a reservation any more (nothing waits, or the cycle made none)."""
        with self.rt.store.write() as session:
            session.connection().execute(update(W).where(W.c.reserved_start_s.is_not(None))
                                         .values(reserved_start_s=None))
        self.reservation = None

    def _remember_reasons(self, recorded: list[dict[str, object]], view: StoreView) -> None:
        """Note the reasons now stored (after their commit), forgetting work no longer pending."""
        if len(self.reasons) > 2 * len(view.pending) + 1024:
            still = {w.id for w in view.pending} | self.window.inadmissible
            self.reasons = {k: v for k, v in self.reasons.items() if k in still}
        for item in recorded:
            self.reasons[str(item["r_id"])] = str(item["r_reason"])
        self.estimates.prune(view)


_PLACED_LABEL = f"{WorkloadStatus.ADMITTED.value}|{WorkloadStatus.RUNNING.value}"
"""The from of a stop that lost: it expects its workload placed, admitted or running."""
