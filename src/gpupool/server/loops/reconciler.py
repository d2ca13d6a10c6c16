"""Reconciliation: turn what the provider reports (exits, losses) into workload transitions.

`recover()` runs once at start-up: pods the store thinks are active are re-adopted when the
provider still knows them. One it does not know was either never handed to it (recorded `launching`,
the server stopped before the launch call: a provider knows every pod it was asked to launch, the
local one from a state file written before the process exists), and its workload goes back to
pending to be placed again; or it ran and is gone, and its workload fails (never started twice).
A pod its node reports `never_started` (the server died after the node saved its process id but
before letting its command run) counts as never handed over: its workload is placed again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from sqlalchemy import Connection, bindparam, select, update
from sqlalchemy.orm import Session

from gpupool.api.events import EventReason
from gpupool.core.model import Node, WorkloadStatus
from gpupool.pods import PodPhase, PodStatus
from gpupool.server.auth import FEDERATION_ID_ENV
from gpupool.server.federation_fence import names_federation_id
from gpupool.server.orm import Base, PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.events import LOST, REFUSED, LostMoves, Move, apply_moves, not_made, transition
from gpupool.server.services.locks import lock_workloads
from gpupool.server.services.requeue import requeue, stop_each_after_commit, stop_pods
from gpupool.server.states import ACTIVE_POD_STATES, PodState, pod_move_allowed

FinalHook = Callable[[str, float | None], None]
"""Called with a workload that ended for good, and the work it did when it succeeded."""
_NOT_HANDED = (PodState.LAUNCHING.value, PodState.WAITING.value)
_PLACED = (WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)

log = logging.getLogger("gpupool.reconciler")

_FINAL_PHASES = {PodPhase.SUCCEEDED: PodState.SUCCEEDED, PodPhase.FAILED: PodState.FAILED,
                 PodPhase.LOST: PodState.LOST, PodPhase.STOPPED: PodState.STOPPED}


def _started_attempts(session: Session, workload_ids: set[str], known: Mapping[str, PodStatus],
                      never: frozenset[str] = frozenset()) -> set[tuple[str, int]]:
    """(workload, attempt) pairs of which some pod was handed to the provider: it knows the pod, or
    the store saw it past `launching`, unless its node says it `never` ran. Such an attempt is never
    started again."""
    if not workload_ids:
        return set()
    rows = session.execute(select(PodRow.workload_id, PodRow.attempt, PodRow.id, PodRow.status)
                           .where(PodRow.workload_id.in_(workload_ids))).all()
    return {(w, a) for w, a, pod_id, status in rows
            if pod_id not in never and (pod_id in known or status not in _NOT_HANDED)}


class Reconciler:
    def __init__(self, rt: Runtime, on_final: FinalHook | None = None) -> None:
        self.rt = rt
        self.on_final = on_final
        self._known_nodes: frozenset[str] | None = None
        self._settled: set[str] = set()
        """Finished pods already applied that the provider may still list (one that does not
        forget lists them for ever); an id the provider no longer lists is dropped."""
        self.active = 0
        """Pods the provider reported starting or running at the last sync."""

    def recover(self) -> tuple[int, int]:
        """Re-adopt or mark lost every active pod after a (re)start; returns (adopted, lost)."""
        # a pod its node says never ran its command (the server died before letting it go) is not
        # adopted: it is requeued below like one never handed over
        statuses = self.rt.provider.poll()
        known = {s.pod_id: s for s in statuses if not s.never_started}
        never = frozenset(s.pod_id for s in statuses if s.never_started)
        now = self.rt.clock()
        adopted = lost = 0
        to_stop: list[str] = []
        settled: list[str] = []
        with self.rt.store.write() as session:
            settled = _already_settled(session, [s.pod_id for s in statuses if s.phase.is_final])
            active = PodRow.status.in_(ACTIVE_POD_STATES)
            workload_ids = set(session.scalars(select(PodRow.workload_id).where(active)))
            lock_workloads(session.connection(), workload_ids)  # before any pod is written
            # the pods read under the locks (a cancel committed meanwhile is not written over)
            pods = session.scalars(select(PodRow).where(active, PodRow.workload_id.in_(workload_ids))).all()
            started = _started_attempts(session, {p.workload_id for p in pods}, known, never)
            # the workloads in one read (one query per pod was most of a takeover's recovery)
            rows = {r.id: r for r in session.scalars(select(WorkloadRow).where(
                WorkloadRow.id.in_({p.workload_id for p in pods})))}
            for pod in pods:
                row = rows.get(pod.workload_id)
                if row is None or pod.status not in ACTIVE_POD_STATES:  # stopped with a sibling
                    continue
                if pod.id in known:
                    adopted += 1
                    if pod.status == PodState.LAUNCHING.value:
                        pod.status = PodState.RUNNING.value
                    if pod.started_s is None:  # launched just before the stop: metered from its start
                        pod.started_s = _within(known[pod.id].started_at_s, pod.created_s, now)
                    if row.status in (WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value):
                        row.started_s = row.started_s or now
                        transition(session, row, WorkloadStatus.RUNNING.value, EventReason.ADOPTED,
                                   f"Pod {pod.name} re-adopted after a server restart.", now, pod.id)
                    continue
                lost += 1
                launching = pod.status in _NOT_HANDED or pod.id in never
                pod.status, pod.finished_s = PodState.LOST.value, now
                pod.message = "The provider no longer knows this pod after a server restart."
                current = row.attempt == pod.attempt and not WorkloadStatus(row.status).is_final
                if current and launching and (row.id, row.attempt) not in started:
                    pod.message = "Never started: the server stopped before handing it to the provider."
                    to_stop += stop_pods(session, row, PodState.STOPPED, now)
                    transition(session, row, WorkloadStatus.PENDING.value, EventReason.REQUEUED_ON_RESTART,
                               "Requeued after a server restart: it was admitted but never started, so it "
                               "waits to be placed again.", now, pod.id)
                    row.admitted_s = None
                elif current:
                    to_stop += stop_pods(session, row, PodState.STOPPED, now)
                    transition(session, row, WorkloadStatus.FAILED.value, EventReason.LOST_ON_RESTART,
                               "Lost across a server restart: its pod could not be re-adopted, and it was "
                               "not started again so it can never run twice; resubmit it.", now, pod.id)
                    row.finished_s = now
            _hold_federated_copies(session, now)
            for pod in session.scalars(select(PodRow).where(PodRow.status == PodState.STOPPING.value)):
                if pod.id in known and not known[pod.id].phase.is_final:
                    to_stop.append(pod.id)  # asked to stop before the restart: ask again
                else:  # it ended while the server was down: its interval closes when it ended
                    status = known.get(pod.id)
                    _settle(pod, status, _within(status.finished_at_s if status else None,
                                                 pod.started_s or pod.created_s, now))
        for pod_id in to_stop:
            self.rt.provider.stop(pod_id, grace_s=0)
        # A provider opened afresh lists every finished pod of its nodes again (forgetting is not
        # kept across a restart): those whose end the store holds already are acknowledged now, so
        # the first sync after a takeover walks only what ended meanwhile, not the pool's history.
        self.rt.provider.forget_pods(settled)
        if adopted or lost:
            log.info("recovery: %d pod(s) re-adopted, %d marked lost", adopted, lost)
        return adopted, lost

    def sync(self) -> int:
        """Apply every newly finished pod the provider reports; returns how many changed."""
        statuses = self.rt.provider.poll()
        if len(self._settled) > len(statuses):  # some were forgotten, and are never listed again
            self._settled.intersection_update(s.pod_id for s in statuses)
        self.active = sum(1 for s in statuses if s.phase in (PodPhase.STARTING, PodPhase.RUNNING))
        # A pod whose launch outcome is not recorded yet waits for it (read after the poll): its end
        # is applied once the store knows it started.
        flying = self.rt.launches.in_flight() if self.rt.launches is not None else frozenset()
        finished = [s for s in statuses if s.phase in _FINAL_PHASES and s.pod_id not in self._settled
                    and s.pod_id not in flying]
        if not finished:
            return 0
        now = self.rt.clock()
        to_stop: list[str] = []
        ended: list[tuple[str, float | None]] = []
        if all(s.phase is PodPhase.SUCCEEDED for s in finished):
            with self.rt.store.write() as session:
                ended = _apply_successes(session.connection(), finished, now)
        else:
            with self.rt.store.write() as session, session.no_autoflush:
                ids = [f.pod_id for f in finished]
                workload_ids = set(session.scalars(select(PodRow.workload_id).where(PodRow.id.in_(ids))))
                lock_workloads(session.connection(), workload_ids)  # before any pod is written
                # the pods are read under their workloads' locks: each change below is made from the
                # state they hold now (one read before would let a cancel's stopped be overwritten)
                pods = {p.id: p for p in session.scalars(select(PodRow).where(PodRow.id.in_(ids)))}
                query = select(WorkloadRow).where(WorkloadRow.id.in_(workload_ids))
                rows = {r.id: r for r in session.scalars(query)}
                for status in finished:
                    to_stop += self._apply(session, status, now, pods, rows, ended)
        self._settled.update(s.pod_id for s in finished)
        # their final states are committed: the provider stops listing them, so a pool that has run
        # many pods does not walk all of them at every poll
        self.rt.provider.forget_pods([s.pod_id for s in finished])
        for pod_id in to_stop:
            self.rt.provider.stop(pod_id, grace_s=0)
        self._ended(ended)
        return len(finished)

    def nodes_gone(self, nodes: Sequence[Node]) -> int:
        """Workloads with pods on nodes the provider no longer lists: those pods are lost and the
        workloads requeued (reason node_lost). Checked when the node list changes."""
        names = frozenset(n.name for n in nodes)
        if names == self._known_nodes:
            return 0
        self._known_nodes = names
        now = self.rt.clock()
        to_stop: list[str] = []
        requeued = 0
        with self.rt.store.write() as session:
            on_gone = (PodRow.status.in_(ACTIVE_POD_STATES), PodRow.node.not_in(names))
            workload_ids = set(session.scalars(select(PodRow.workload_id).where(*on_gone)))
            lock_workloads(session.connection(), workload_ids)  # before any pod is written
            by_workload: dict[str, list[PodRow]] = {}
            # read under the locks: a pod a cancel stopped meanwhile is not written over as lost
            for pod in session.scalars(select(PodRow).where(*on_gone, PodRow.workload_id.in_(workload_ids))):
                by_workload.setdefault(pod.workload_id, []).append(pod)
            for workload_id, lost_pods in sorted(by_workload.items()):
                row = session.get(WorkloadRow, workload_id)
                for pod in lost_pods:
                    pod.status, pod.finished_s = PodState.LOST.value, now
                    pod.message = f"Node {pod.node} is no longer in the pool."
                session.flush()
                if row is None or row.status not in _PLACED:
                    continue
                gone = ", ".join(sorted({p.node for p in lost_pods}))
                to_stop += requeue(session, row, EventReason.NODE_LOST,
                                   f"Requeued: node {gone} left the pool.", now, pod_id=lost_pods[0].id)
                requeued += 1
        # its pods on the nodes left: a launch still queued behind a hung one is taken back
        stop_each_after_commit(self.rt, [(pod_id, 0.0) for pod_id in to_stop], now)
        if requeued:
            log.warning("%d workload(s) requeued: their nodes left the pool", requeued)
            self.rt.capacity_may_have_changed()
        return requeued

    def _ended(self, ended: Sequence[tuple[str, float | None]]) -> None:
        """After the commit: tell the scheduler (run-time history) and the provider (checkpoints)."""
        for workload_id, worked_s in ended:
            if self.on_final is not None:
                self.on_final(workload_id, worked_s)
            self.rt.provider.forget_workload(workload_id)

    def _apply(self, session: Session, status: PodStatus, now: float, pods: dict[str, PodRow],
               rows: dict[str, WorkloadRow], ended: list[tuple[str, float | None]]) -> list[str]:
        pod = pods.get(status.pod_id)
        if pod is None:
            return []
        if pod.status == PodState.STOPPING.value:
            _settle(pod, status, now)  # it was stopped on purpose: its workload has moved on already
            return []
        if not PodState(pod.status).is_active:
            return []  # already settled here (cancel, drain, recovery); the provider only confirms it
        pod.status = _FINAL_PHASES[status.phase].value
        pod.exit_code, pod.finished_s, pod.message = status.exit_code, now, status.message[:1024]
        row = rows.get(pod.workload_id)
        if row is None or row.attempt != pod.attempt or WorkloadStatus(row.status).is_final:
            return []
        if status.phase is PodPhase.SUCCEEDED:
            if row.spec.get("replicas", 1) == 1:
                siblings = [pod.status]
            else:
                session.flush()
                siblings = list(session.scalars(
                    select(PodRow.status).where(PodRow.workload_id == row.id, PodRow.attempt == row.attempt)
                ))
            if all(s == PodState.SUCCEEDED.value for s in siblings):
                row.exit_code, row.finished_s = 0, now
                transition(session, row, WorkloadStatus.SUCCEEDED.value, EventReason.COMPLETED,
                           "Every pod exited 0.", now)
                ended.append((row.id, _worked_s(row.started_s, row.progress_s, now)))
            return []
        what = f"exited with code {status.exit_code}" if status.exit_code is not None else "was lost"
        detail = f": {status.message}" if status.message and status.message != what else ""
        session.flush()  # this pod is final now; only its siblings are left to stop
        if status.never_started and row.status in _PLACED and row.spec.get("replicas", 1) == 1:
            # its node says the command never ran (its server died before letting it go): placed
            # again, as recovery does with a pod never handed over; no retry is used up
            self.rt.capacity_may_have_changed()
            return requeue(session, row, EventReason.REQUEUED_ON_RESTART,
                           f"Requeued: pod {pod.name} never started (its server stopped before letting it "
                           "run); it waits to be placed again.", now, say_lost=False, pod_id=pod.id)
        failure = self.rt.config.failure
        limit = row.spec.get("max_retries")
        max_retries = failure.max_retries if limit is None else int(limit)
        # A pod the provider lost may have run (its agent cannot always tell: "stopped while starting
        # the pod"), so it is a failure like an exit code: retried only within the workload's
        # max_retries, never started again on the pool's own initiative. (Work on a node that left
        # the pool, or on broken hardware, is requeued by nodes_gone and by the cycle's evictions.)
        reason = EventReason.POD_FAILED if status.phase is PodPhase.FAILED else EventReason.POD_LOST
        if row.retries < max_retries:
            backoff = failure.requeue_backoff * 2 ** row.retries
            self.rt.capacity_may_have_changed()
            return requeue(session, row, EventReason.RETRYING,
                           f"Pod {pod.name} {what}{detail}; retry {row.retries + 1} of {max_retries} "
                           f"in {backoff:g}s.", now, say_lost=False, retry=True, not_before_s=now + backoff,
                           pod_id=pod.id)
        to_stop = stop_pods(session, row, PodState.STOPPED, now)
        row.exit_code, row.finished_s = status.exit_code, now
        after = f" (after {row.retries} retries)" if row.retries else ""
        transition(session, row, WorkloadStatus.FAILED.value, reason,
                   f"Pod {pod.name} {what}{detail}{after}.", now, pod.id)
        ended.append((row.id, None))
        return to_stop


def _already_settled(session: Session, pod_ids: Sequence[str], chunk: int = 500) -> list[str]:
    """Of these pods (final at their provider), those the store holds final too, or knows not at
    all: nothing is left to apply for them."""
    active: set[str] = set()
    for at in range(0, len(pod_ids), chunk):
        part = pod_ids[at:at + chunk]
        active.update(session.scalars(select(PodRow.id).where(PodRow.id.in_(part),
                                                              PodRow.status.not_in(_FINAL_STATES))))
    return [pod_id for pod_id in pod_ids if pod_id not in active]


_FINAL_STATES = (PodState.SUCCEEDED.value, PodState.FAILED.value, PodState.LOST.value, PodState.STOPPED.value)


def _hold_federated_copies(session: Session, now: float) -> None:
    """After a restart, a federation hub's pending copies (FEDERATION_ID_ENV in their environment)
    wait, held, for the hub: while this pool was away the hub may have placed them elsewhere, and it
    releases the ones it still places here or cancels the others (docs/federation.md)."""
    # locked as read, in id order: a cancel committed meanwhile is waited for, and its row then no
    # longer pending, rather than held (and given a hold's event) after it was cancelled
    pending = session.scalars(select(WorkloadRow).where(WorkloadRow.status == WorkloadStatus.PENDING.value,
                                                        WorkloadRow.held == "", names_federation_id())
                              .order_by(WorkloadRow.id).with_for_update()).all()
    for row in pending:
        if FEDERATION_ID_ENV in (row.spec.get("env") or {}):
            row.held = "user"
            transition(session, row, WorkloadStatus.PENDING.value, EventReason.HELD,
                       "Held after a server restart: a federation hub's copy waits for the hub to release "
                       "or cancel it.", now)


def _worked_s(started_s: float | None, progress_s: float | None, now: float) -> float | None:
    """The work a succeeded workload did: its last run plus the progress it kept from earlier ones."""
    if started_s is None:
        return None
    return max(0.0, now - started_s) + (progress_s or 0.0)


def _within(at_s: float | None, low: float, high: float) -> float:
    """A time the provider reported, kept within what the store knows (`high` when none)."""
    return high if at_s is None else min(max(at_s, low), high)


def _settle(pod: PodRow, status: PodStatus | None, now: float) -> None:
    """A stopping pod ended (as the provider reports, or unknown to it: stopped)."""
    if status is None:
        pod.status, pod.message = PodState.STOPPED.value, pod.message or "Stopped."
    else:
        pod.status = _FINAL_PHASES[status.phase].value
        pod.exit_code, pod.message = status.exit_code, status.message[:1024]
    pod.finished_s = now


_PODS = Base.metadata.tables["pods"]
_WORKLOADS = Base.metadata.tables["workloads"]
_SETTLE_POD = update(_PODS).where(
    _PODS.c.id == bindparam("p_id"), _PODS.c.status == bindparam("p_expected")).values(
    status=bindparam("p_status"), exit_code=bindparam("p_exit_code"), finished_s=bindparam("p_finished_s"),
    message=bindparam("p_message"))
# built once, as the statement above (the loop settles pods at every step)
_POD_STATES = select(_PODS.c.id, _PODS.c.status).where(_PODS.c.id.in_(bindparam("ids", expanding=True)))
_SETTLED_PODS = select(_PODS.c.id, _PODS.c.workload_id, _PODS.c.attempt, _PODS.c.status).where(
    _PODS.c.id.in_(bindparam("ids", expanding=True)))
_ATTEMPTS = select(_WORKLOADS.c.id, _WORKLOADS.c.status, _WORKLOADS.c.attempt, _WORKLOADS.c.started_s,
                   _WORKLOADS.c.progress_s).where(_WORKLOADS.c.id.in_(bindparam("ids", expanding=True)))
_GANG_PODS = select(_PODS.c.workload_id, _PODS.c.attempt, _PODS.c.status).where(
    _PODS.c.workload_id.in_(bindparam("ids", expanding=True)))


def _still_as_read(conn: Connection, settled: list[dict[str, object]]) -> list[dict[str, object]]:
    """The settles whose pod row (read before its workload was locked) still holds the state read,
    and that the pod table allows; the others are not made (`not_made`: refused or lost, alike)."""
    now_in: dict[str, str] = {r.id: r.status for r in conn.execute(
        _POD_STATES, {"ids": sorted({str(row["p_id"]) for row in settled})})}
    kept, seen = [], set()
    for row in settled:
        was, to = str(row["p_expected"]), str(row["p_status"])
        if row["p_id"] in seen:  # the provider told of it twice: settled once
            continue
        seen.add(row["p_id"])
        if now_in.get(str(row["p_id"])) != was:
            not_made("pod", LOST, str(row["p_id"]), was, to, EventReason.COMPLETED)
        elif not pod_move_allowed(was, to):
            not_made("pod", REFUSED, str(row["p_id"]), was, to, EventReason.COMPLETED)
        else:
            kept.append(row)
    return kept


def _apply_successes(conn: Connection, finished: Sequence[PodStatus],
                     now: float) -> list[tuple[str, float | None]]:
    """`Reconciler._apply` for a batch of pods that all exited 0, with bulk statements: the same pod
    rows, and a workload succeeds (with its `completed` event) once every pod of its current
    attempt has succeeded. Returns the workloads that succeeded, with the work each did."""
    ids = [s.pod_id for s in finished]
    pods = {r.id: r for r in conn.execute(_SETTLED_PODS, {"ids": sorted(set(ids))})}
    settled: list[dict[str, object]] = []
    for status in finished:
        pod = pods.get(status.pod_id)
        if pod is None:
            continue
        if pod.status != PodState.STOPPING.value and not PodState(pod.status).is_active:
            continue  # already settled here (cancel, drain, recovery); the provider only confirms it
        settled.append({"p_id": pod.id, "p_expected": pod.status, "p_status": PodState.SUCCEEDED.value,
                        "p_exit_code": status.exit_code, "p_finished_s": now,
                        "p_message": status.message[:1024]})
    if not settled:
        return []
    lock_workloads(conn, {pods[str(row["p_id"])].workload_id for row in settled})  # before the pods
    settled = _still_as_read(conn, settled)  # each pod's settle is a compare-and-set on what was read
    if not settled:
        return []
    if conn.execute(_SETTLE_POD, settled).rowcount != len(settled):
        raise LostMoves("a pod row its workload's lock held changed under the settle")
    attempts: dict[str, set[int]] = {}
    for row in settled:
        if row["p_expected"] != PodState.STOPPING.value:  # a stopping pod's workload has moved on already
            pod = pods[str(row["p_id"])]
            attempts.setdefault(pod.workload_id, set()).add(pod.attempt)
    if not attempts:
        return []
    rows = {r.id: r for r in conn.execute(_ATTEMPTS, {"ids": sorted(attempts)})
            if r.attempt in attempts[r.id] and not WorkloadStatus(r.status).is_final}
    if not rows:
        return []
    done = dict.fromkeys(rows, True)
    for workload_id, attempt, pod_status in conn.execute(_GANG_PODS, {"ids": sorted(rows)}):
        if attempt == rows[workload_id].attempt and pod_status != PodState.SUCCEEDED.value:
            done[workload_id] = False
    lost = {m.workload_id for m in apply_moves(conn, [
        Move(workload_id, rows[workload_id].status, WorkloadStatus.SUCCEEDED.value, EventReason.COMPLETED,
             "Every pod exited 0.", now, columns=(("exit_code", 0), ("finished_s", now)))
        for workload_id, succeeded in done.items() if succeeded
    ])}  # a workload cancelled since it was read stays cancelled
    return [(workload_id, _worked_s(rows[workload_id].started_s, rows[workload_id].progress_s, now))
            for workload_id, succeeded in done.items() if succeeded and workload_id not in lost]
