"""Reconciliation: turn what the provider reports (exits, losses) into workload transitions.

`recover()` runs once at start-up: pods the store thinks are active are re-adopted when the
provider still knows them. One it does not know was either never handed to it (recorded `launching`,
the server stopped before the launch call: a provider knows every pod it was asked to launch, the
local one from a state file written before the process exists), and its workload goes back to
pending to be placed again; or it ran and is gone, and its workload fails (never started twice).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from sqlalchemy import Connection, bindparam, select, update
from sqlalchemy.orm import Session

from gpupool.core.model import WorkloadStatus
from gpupool.providers.base import PodPhase, PodStatus
from gpupool.server.orm import Base, PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.events import Move, apply_moves, transition
from gpupool.server.services.workloads import stop_pods
from gpupool.server.states import ACTIVE_POD_STATES, EventReason, PodState

log = logging.getLogger("gpupool.reconciler")

_FINAL_PHASES = {PodPhase.SUCCEEDED: PodState.SUCCEEDED, PodPhase.FAILED: PodState.FAILED,
                 PodPhase.LOST: PodState.LOST, PodPhase.STOPPED: PodState.STOPPED}


def _started_attempts(session: Session, workload_ids: set[str],
                      known: Mapping[str, PodStatus]) -> set[tuple[str, int]]:
    """(workload, attempt) pairs of which some pod was handed to the provider: it knows the pod, or
    the store saw it past `launching`. Such an attempt is never started again."""
    if not workload_ids:
        return set()
    rows = session.execute(select(PodRow.workload_id, PodRow.attempt, PodRow.id, PodRow.status)
                           .where(PodRow.workload_id.in_(workload_ids))).all()
    return {(w, a) for w, a, pod_id, status in rows if pod_id in known or status != PodState.LAUNCHING.value}


class Reconciler:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._settled: set[str] = set()
        self.active = 0
        """Pods the provider reported starting or running at the last sync."""

    def recover(self) -> tuple[int, int]:
        """Re-adopt or mark lost every active pod after a (re)start; returns (adopted, lost)."""
        known = {s.pod_id: s for s in self.rt.provider.poll()}
        now = self.rt.clock()
        adopted = lost = 0
        to_stop: list[str] = []
        with self.rt.store.write() as session:
            pods = session.scalars(select(PodRow).where(PodRow.status.in_(ACTIVE_POD_STATES))).all()
            started = _started_attempts(session, {p.workload_id for p in pods}, known)
            for pod in pods:
                row = session.get(WorkloadRow, pod.workload_id)
                if row is None or pod.status not in ACTIVE_POD_STATES:  # stopped with a sibling
                    continue
                if pod.id in known:
                    adopted += 1
                    if pod.status == PodState.LAUNCHING.value:
                        pod.status = PodState.RUNNING.value
                    if row.status in (WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value):
                        row.started_s = row.started_s or now
                        transition(session, row, WorkloadStatus.RUNNING.value, EventReason.ADOPTED,
                                   f"Pod {pod.name} re-adopted after a server restart.", now, pod.id)
                    continue
                lost += 1
                launching = pod.status == PodState.LAUNCHING.value
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
        for pod_id in to_stop:
            self.rt.provider.stop(pod_id, grace_s=0)
        if adopted or lost:
            log.info("recovery: %d pod(s) re-adopted, %d marked lost", adopted, lost)
        return adopted, lost

    def sync(self) -> int:
        """Apply every newly finished pod the provider reports; returns how many changed."""
        statuses = self.rt.provider.poll()
        self.active = sum(1 for s in statuses if s.phase in (PodPhase.STARTING, PodPhase.RUNNING))
        finished = [s for s in statuses if s.phase in _FINAL_PHASES and s.pod_id not in self._settled]
        if not finished:
            return 0
        now = self.rt.clock()
        to_stop: list[str] = []
        if all(s.phase is PodPhase.SUCCEEDED for s in finished):
            with self.rt.store.write() as session:
                _apply_successes(session.connection(), finished, now)
            self._settled.update(s.pod_id for s in finished)
            return len(finished)
        with self.rt.store.write() as session, session.no_autoflush:
            ids = [f.pod_id for f in finished]
            pods = {p.id: p for p in session.scalars(select(PodRow).where(PodRow.id.in_(ids)))}
            workload_ids = {p.workload_id for p in pods.values()}
            query = select(WorkloadRow).where(WorkloadRow.id.in_(workload_ids))
            rows = {r.id: r for r in session.scalars(query)}
            for status in finished:
                to_stop += self._apply(session, status, now, pods, rows)
        self._settled.update(s.pod_id for s in finished)
        for pod_id in to_stop:
            self.rt.provider.stop(pod_id, grace_s=0)
        return len(finished)

    def _apply(self, session: Session, status: PodStatus, now: float, pods: dict[str, PodRow],
               rows: dict[str, WorkloadRow]) -> list[str]:
        pod = pods.get(status.pod_id)
        if pod is None:
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
            return []
        reason = EventReason.POD_FAILED if status.phase is PodPhase.FAILED else EventReason.POD_LOST
        what = f"exited with code {status.exit_code}" if status.exit_code is not None else "was lost"
        detail = f": {status.message}" if status.message and status.message != what else ""
        session.flush()  # this pod is final now; only its siblings are left to stop
        to_stop = stop_pods(session, row, PodState.STOPPED, now)
        row.exit_code, row.finished_s = status.exit_code, now
        transition(session, row, WorkloadStatus.FAILED.value, reason,
                   f"Pod {pod.name} {what}{detail}.", now, pod.id)
        return to_stop


_PODS = Base.metadata.tables["pods"]
_WORKLOADS = Base.metadata.tables["workloads"]
_SETTLE_POD = update(_PODS).where(_PODS.c.id == bindparam("p_id")).values(
    status=bindparam("p_status"), exit_code=bindparam("p_exit_code"), finished_s=bindparam("p_finished_s"),
    message=bindparam("p_message"))


def _apply_successes(conn: Connection, finished: Sequence[PodStatus], now: float) -> None:
    """`Reconciler._apply` for a batch of pods that all exited 0, with bulk statements: the same pod
    rows, and a workload succeeds (with its `completed` event) once every pod of its current
    attempt has succeeded."""
    ids = [s.pod_id for s in finished]
    pods = {r.id: r for r in conn.execute(
        select(_PODS.c.id, _PODS.c.workload_id, _PODS.c.attempt, _PODS.c.status).where(_PODS.c.id.in_(ids)))}
    settled: list[dict[str, object]] = []
    attempts: dict[str, set[int]] = {}
    for status in finished:
        pod = pods.get(status.pod_id)
        if pod is None or not PodState(pod.status).is_active:
            continue  # already settled here (cancel, drain, recovery); the provider only confirms it
        settled.append({"p_id": pod.id, "p_status": PodState.SUCCEEDED.value, "p_exit_code": status.exit_code,
                        "p_finished_s": now, "p_message": status.message[:1024]})
        attempts.setdefault(pod.workload_id, set()).add(pod.attempt)
    if not settled:
        return
    conn.execute(_SETTLE_POD, settled)
    rows = {r.id: r for r in conn.execute(
        select(_WORKLOADS.c.id, _WORKLOADS.c.status, _WORKLOADS.c.attempt)
        .where(_WORKLOADS.c.id.in_(attempts))
    ) if r.attempt in attempts[r.id] and not WorkloadStatus(r.status).is_final}
    if not rows:
        return
    done = dict.fromkeys(rows, True)
    for workload_id, attempt, pod_status in conn.execute(
        select(_PODS.c.workload_id, _PODS.c.attempt, _PODS.c.status).where(_PODS.c.workload_id.in_(rows))
    ):
        if attempt == rows[workload_id].attempt and pod_status != PodState.SUCCEEDED.value:
            done[workload_id] = False
    apply_moves(conn, [
        Move(workload_id, rows[workload_id].status, WorkloadStatus.SUCCEEDED.value, EventReason.COMPLETED,
             "Every pod exited 0.", now, columns=(("exit_code", 0), ("finished_s", now)))
        for workload_id, succeeded in done.items() if succeeded
    ])
