"""Stopping a workload's pods and sending it back to pending: one path for drain, preemption,
eviction, lost nodes, pod-failure retries and the time limit's stop.

A pod that was handed to the provider is marked `stopping` (its slices go back to the scheduler
at once, and a pod placed on one of its devices waits until the provider reports it ended); a pod
that never was (`waiting`) is final at once. Work lost to a stop is accounted from the workload's
last checkpoint (the mtime of `$GPUPOOL_CHECKPOINT_DIR/.checkpoint`, when the pod reported one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from gpupool.core.model import WorkloadStatus
from gpupool.server.orm import PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.events import transition
from gpupool.server.states import ACTIVE_POD_STATES, PodState

_ACTIVE_PODS = select(PodRow).where(PodRow.workload_id == bindparam("workload_id"),
                                    PodRow.status.in_(ACTIVE_POD_STATES))
"""Built once: building a statement costs more than running this one."""


def stop_pods(session: Session, row: WorkloadRow, to: PodState, now: float) -> list[str]:
    """Stop the workload's active pods: those the provider knows become `stopping` (settled when it
    reports their end), those it never saw become `to` at once. Returns the ids to stop (after the
    commit) with the provider."""
    ids = []
    for pod in session.scalars(_ACTIVE_PODS, {"workload_id": row.id}):
        if pod.status == PodState.WAITING.value:
            pod.status, pod.finished_s = to.value, now
            pod.message = pod.message or "Stopped before it started."
            continue
        pod.status = PodState.STOPPING.value
        ids.append(pod.id)
    return ids


def stop_after_commit(rt: Runtime, pod_ids: list[str], now: float, grace_s: float | None = None) -> set[str]:
    """After the commit that marked `pod_ids` stopping: a pod whose launch no node's worker has
    begun is taken back and ends at once (`stopped`, it never reached the provider); the provider is
    asked to stop the others. Each end is a compare-and-set on `stopping` with no start recorded.
    Returns the ids taken back."""
    return stop_each_after_commit(rt, [(pod_id, grace_s) for pod_id in pod_ids], now)


def stop_each_after_commit(rt: Runtime, stops: Sequence[tuple[str, float | None]], now: float) -> set[str]:
    """`stop_after_commit` with each pod's own grace (None: the provider's default). Every stop path
    (cancel, preemption, time limit, drain, requeue, a lost link, a node that left) comes here, so
    a launch still queued never starts only to be stopped; what a taken-back pod held is free at
    once, and the loop is woken to promote the pods waiting on its devices. Returns the ids taken back."""
    pod_ids = [pod_id for pod_id, _ in stops]
    taken = rt.launches.withdraw(pod_ids) if rt.launches is not None and pod_ids else set()
    if taken:
        with rt.store.write() as session:
            session.execute(update(PodRow).where(
                PodRow.id.in_(taken), PodRow.status == PodState.STOPPING.value, PodRow.started_s.is_(None),
            ).values(status=PodState.STOPPED.value, finished_s=now, message="Stopped before it started."))
    for pod_id, grace_s in stops:
        if pod_id not in taken:
            if grace_s is None:
                rt.provider.stop(pod_id)
            else:
                rt.provider.stop(pod_id, grace_s=grace_s)
    if taken:
        rt.capacity_may_have_changed()
    return taken


@dataclass(frozen=True, slots=True)
class Lost:
    """What a stop costs: run seconds of this attempt, the part kept by a checkpoint, and the
    device-seconds of work after it (lost)."""

    ran_s: float = 0.0
    kept_s: float = 0.0
    lost_device_s: float = 0.0


def lost_work(row: WorkloadRow, now: float, checkpoint_s: float | None) -> Lost:
    """The accounting of stopping `row`'s current run at `now`, given its last checkpoint mark."""
    started = row.started_s
    if started is None or now <= started:
        return Lost()
    ran = now - started
    devices = row.device_milli / 1000.0
    if checkpoint_s is not None and started < checkpoint_s <= now:
        # to the microsecond: the difference of two epoch times carries float noise (240 s of
        # checkpoints read 240.0000000000009 s) that would break ties between victims of equal
        # lost work otherwise than the replay, which counts checkpoints as multiples of the interval
        kept = round(checkpoint_s - started, 6)
        return Lost(ran, kept, (now - checkpoint_s) * devices)
    return Lost(ran, 0.0, ran * devices)


def requeue(session: Session, row: WorkloadRow, reason: str, message: str, now: float, *,
            mark: float | None = None, say_lost: bool = True, retry: bool = False,
            not_before_s: float | None = None, pod_id: str = "") -> list[str]:
    """Stop `row`'s pods and move it back to pending (the next admission is attempt + 1), keeping
    the accounts of its run up to now from its checkpoint `mark` (`lost_work`): run time, progress
    kept, lost device-seconds, told in the event's message unless `say_lost` is False; `retry`
    counts a requeue after a failure against the workload's max_retries. Returns the pods to stop."""
    lost = lost_work(row, now, mark)
    if say_lost:
        message += lost_text(lost)
    to_stop = stop_pods(session, row, PodState.STOPPED, now)
    row.run_s = (row.run_s or 0.0) + lost.ran_s
    row.progress_s = (row.progress_s or 0.0) + lost.kept_s
    row.lost_device_s = (row.lost_device_s or 0.0) + lost.lost_device_s
    if retry:
        row.retries = (row.retries or 0) + 1
    row.not_before_s = not_before_s
    row.admitted_s = None
    row.started_s = None
    row.reserved_start_s = None
    transition(session, row, WorkloadStatus.PENDING.value, reason, message, now, pod_id)
    return to_stop


def lost_text(lost: Lost) -> str:
    """' (N GPU-seconds of work lost since its last checkpoint)' for an event's message."""
    if lost.ran_s <= 0:
        return ""
    since = "its last checkpoint" if lost.kept_s > 0 else "it started"
    return f" {lost.lost_device_s:.0f} GPU-seconds of work lost since {since}."
