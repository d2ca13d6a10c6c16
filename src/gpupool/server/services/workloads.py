"""Workload use cases: submit, list, get, cancel, events and logs."""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.api.array_spec import parse_array
from gpupool.api.dependency_spec import Verdict
from gpupool.api.events import EventReason
from gpupool.api.workloads import (
    ArrayCancelled,
    EventOut,
    WorkloadCreated,
    WorkloadOut,
    WorkloadSpec,
    check_array_size,
)
from gpupool.core.model import Workload, WorkloadStatus
from gpupool.errors import Conflict, Forbidden, InvalidInput, NotFound, PriorityNotAllowed
from gpupool.providers.nodespec import CONTAINERS_LABEL
from gpupool.server.auth import Principal
from gpupool.server.orm import EventRow, PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import audit, dependencies
from gpupool.server.services.converters import event_row_to_out, workload_row_to_out
from gpupool.server.services.events import Move, apply_moves, transition
from gpupool.server.services.fabric_listing import with_network
from gpupool.server.services.locks import own_rows
from gpupool.server.services.mounts import check as check_mounts
from gpupool.server.services.requeue import stop_after_commit, stop_pods
from gpupool.server.services.secrets import check_user as check_secret_user
from gpupool.server.services.secrets import check_uses as check_secret_uses
from gpupool.server.services.specs import CAPACITY, check_constraints, check_fits, priority_class, to_workload
from gpupool.server.services.submit_writer import Submission, SubmitWriter, commit
from gpupool.server.states import PodState


def new_workload_id() -> str:
    return "w-" + secrets.token_hex(6)


def submit(rt: Runtime, who: Principal, spec: WorkloadSpec) -> WorkloadCreated:
    """Validate against the core model, check the queue and its quota, then store it pending."""
    submission = prepare(rt, who, spec)
    commit(rt, [submission])
    if submission.error is not None:
        raise submission.error
    return created(submission)


async def submit_grouped(rt: Runtime, writer: SubmitWriter, who: Principal,
                         spec: WorkloadSpec, *, hold: bool = False) -> WorkloadCreated:
    """The same through the group-commit writer (one transaction for concurrent submissions);
    answers once the submission is committed. With `hold` it is stored held (sbatch --hold): a
    federation hub fills its checkpoint before releasing it."""
    submission = prepare(rt, who, spec)
    for row in submission.workloads if hold else ():
        row.update(held="admin" if who.is_admin else "user", message="Submitted held; release it to run.")
    await writer.store(submission)
    return created(submission)


def created(submission: Submission) -> WorkloadCreated:
    tasks = len(submission.workloads) if submission.workloads[0]["array_id"] is not None else None
    return WorkloadCreated(id=submission.id, status=WorkloadStatus.PENDING.value, tasks=tasks)


TASK_ORDER_S = 1e-6
"""The tasks of an array are submitted this far apart, in index order, so that first-come ordering
considers them lowest index first (as Slurm does) rather than in the order of their ids' text."""


def prepare(rt: Runtime, who: Principal, spec: WorkloadSpec, *,
            service_class: str | None = None) -> Submission:
    """The rows one submission writes: the pending workload (or every task of an array) and the
    `submitted` events. `service_class`: a service's replica, in the class its service resolved."""
    tenant = who.tenant_for(spec.tenant)
    if who.max_priority is not None and spec.priority > who.max_priority:  # the admin is not limited
        raise PriorityNotAllowed(
            f"Tenant {tenant} may submit at priority <= {who.max_priority}; ask the admin "
            f"(gpupool tenant set {tenant} --max-priority N).",
            priority=spec.priority, max_priority=who.max_priority)
    if spec.array_index is not None:
        raise InvalidInput("array_index is set by the server on each task of an array; leave it out and "
                           "submit the array with `array` (gpupool submit --array 0-9).", field="array_index")
    if spec.rendezvous is not None:
        raise InvalidInput("rendezvous is set by the server when a gang is placed; leave it out (each pod "
                           "finds MASTER_ADDR and MASTER_PORT in its environment).", field="rendezvous")
    if spec.serve_port is not None and service_class is None:
        raise InvalidInput("serve_port is set by the server on a service's replicas; leave it out (create a "
                           "service with `gpupool service create`).", field="serve_port")
    if (spec.service_role is not None or spec.pair_with is not None) and service_class is None:
        raise InvalidInput("service_role and pair_with are set by the server on a paired service's replicas; "
                           "leave them out (create the service with `gpupool service create --role R "
                           "--pair-with NAME`).", field="pair_with")
    if spec.on_behalf is not None and service_class is None:
        raise InvalidInput("on_behalf is set by the server on work the admin or a federation hub submits for "
                           "a tenant; leave it out.", field="on_behalf")
    if service_class is None and who.on_behalf is not None:  # a replica's comes from its service
        spec = spec.model_copy(update={"on_behalf": who.on_behalf})
    chosen = service_class or priority_class(rt.config, spec.priority_class, tenant, who.max_priority)
    if spec.mounts or spec.secrets:  # only names and paths are stored, checked now
        check_mounts(rt.config, tenant, spec.mounts)
        check_secret_user(who, tenant, spec.secrets)
        check_secret_uses(rt, tenant, spec.secrets)
    if spec.on_behalf is not None and spec.secrets:  # a replica of a service the admin created
        raise Forbidden(f"This service was created or changed by the {spec.on_behalf} for tenant {tenant}, "
                        f"so its replicas run as {tenant}'s on-behalf account, which is given no secrets "
                        f"(all such work for {tenant} shares it). Create the service with one of {tenant}'s "
                        "own tokens to give it secrets, or leave them out.")
    spec = check_fits(spec, CAPACITY.get(rt.nodes()))  # O(shapes): the summary is cached per node list
    if spec.image is not None:
        check_image(rt, spec.image)
    check_constraints(spec, rt.nodes())
    now = rt.clock()
    waiting = _waiting_on(rt, tenant, spec)
    if spec.array is not None:
        submission = _array(spec, tenant, now, chosen)
    else:
        workload_id = new_workload_id()
        workload = to_workload(workload_id, spec, tenant, spec.priority, now, priority_class=chosen)
        stored = _stored(spec, tenant, chosen)
        submission = Submission(
            id=workload_id, tenant=tenant, queue=spec.queue, device_milli=workload.total_device_milli,
            workloads=[_row(workload, spec, stored, None)], events=[_event(workload_id, now)],
            parsed=[workload])
    if waiting:
        _wait_on(submission, waiting, now)
    return submission


def check_image(rt: Runtime, name: str) -> None:
    """Refuse an image the store does not hold, or any image where no node can run containers."""
    if rt.images.get(name) is None:
        names = rt.images.names()
        have = f"it has {', '.join(names)}" if names else "it has none yet (an admin imports them)"
        raise InvalidInput(f"No image {name!r} in this pool: {have}; see `gpupool image ls`, and "
                           "`gpupool image import FILE.tar NAME`.", field="image")
    if not any(CONTAINERS_LABEL in node.labels for node in rt.nodes()):
        raise InvalidInput(f"No node of this pool can run containers, so work in image {name!r} would never "
                           "start: install crun on the nodes (Debian: apt-get install crun) and restart "
                           "their agents; `gpupool node show NAME` says why a node cannot.", field="image")


def _waiting_on(rt: Runtime, tenant: str, spec: WorkloadSpec) -> str:
    """What a submission's --dependency waits on now ('' when it holds or there is none); NotFound
    when it names work that is not the tenant's."""
    if spec.dependency is None:
        return ""
    with rt.store.read() as session:
        judgement = dependencies.at_submit(session, tenant, spec.name, spec.dependency)
    if judgement.verdict is Verdict.MET:
        return ""
    return judgement.why or spec.dependency


def _wait_on(submission: Submission, waiting: str, now: float) -> None:
    """Store the submission's rows as waiting on `waiting` (the loop judges them from there on)."""
    message = f"Waits for {waiting}."
    for row in submission.workloads:
        row.update(waiting_on=waiting[:1024], reason=EventReason.WAITING_FOR_DEPENDENCY.value,
                   message=message)
    submission.events.extend(
        dict(workload_id=row["id"], pod_id="", from_status=WorkloadStatus.PENDING.value,
             to_status=WorkloadStatus.PENDING.value, reason=EventReason.WAITING_FOR_DEPENDENCY.value,
             message=message, at_s=now) for row in submission.workloads)


def _stored(spec: WorkloadSpec, tenant: str, chosen: str | None) -> dict[str, Any]:
    """The spec as stored: its tenant, and its priority class as resolved (the config may change)."""
    stored = spec.model_dump(mode="json", exclude_defaults=True)
    stored["tenant"] = tenant
    if chosen is not None:
        stored["priority_class"] = chosen
    return stored


def _array(spec: WorkloadSpec, tenant: str, now: float, chosen: str | None) -> Submission:
    """Every task of an array: ids ARRAY_INDEX, each spec carrying its array_index."""
    tasks = parse_array(spec.array or "")
    array_id = new_workload_id()
    spec = spec.model_copy(update={"array": None})
    template = to_workload(array_id, spec, tenant, spec.priority, now, priority_class=chosen)
    stored = _stored(spec, tenant, chosen)
    check_array_size(len(json.dumps(stored)), len(tasks.indexes))
    rows: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    parsed: list[Workload] = []
    for position, index in enumerate(tasks.indexes):
        task = dataclasses.replace(template, id=f"{array_id}_{index}",
                                   submit_time_s=now + position * TASK_ORDER_S)
        row = _row(task, spec, {**stored, "array_index": index}, (array_id, index, tasks.limit))
        rows.append(row)
        events.append(_event(task.id, task.submit_time_s))
        parsed.append(task)
    return Submission(id=array_id, tenant=tenant, queue=spec.queue, device_milli=template.total_device_milli,
                      workloads=rows, events=events, parsed=parsed)


def _row(workload: Workload, spec: WorkloadSpec, stored: dict[str, Any],
         array: tuple[str, int, int | None] | None) -> dict[str, Any]:
    """The workloads row of a new submission (every key, so that rows insert in one statement)."""
    array_id, array_index, array_limit = array or (None, None, None)
    return dict(
        id=workload.id, name=spec.name, tenant=workload.tenant, queue=spec.queue,
        status=WorkloadStatus.PENDING.value, priority=spec.priority, device_milli=workload.total_device_milli,
        spec=stored, attempt=0, reason=EventReason.SUBMITTED.value, message="Submitted.",
        submit_s=workload.submit_time_s, admitted_s=None, started_s=None, finished_s=None, exit_code=None,
        time_limit_s=spec.time_limit_s, array_id=array_id, array_index=array_index, array_limit=array_limit,
        held="", waiting_on="", revision=0,
    )


def _event(workload_id: str, at_s: float) -> dict[str, Any]:
    return dict(workload_id=workload_id, pod_id="", from_status="", to_status=WorkloadStatus.PENDING.value,
                reason=EventReason.SUBMITTED.value, message="Submitted.", at_s=at_s)


def _simulated_nodes(rt: Runtime) -> frozenset[str]:
    return frozenset(n.name for n in rt.nodes() if any(d.simulated for d in n.devices))


def _visible(session: Session, who: Principal, workload_id: str, *, lock: bool = False) -> WorkloadRow:
    """The workload's row if `who` may see it; with `lock`, read FOR UPDATE (until the commit), and
    for a tenant only where it is the tenant's: another tenant's id locks nothing of its owner's."""
    if lock:
        query = own_rows(select(WorkloadRow).where(WorkloadRow.id == workload_id), who, WorkloadRow.tenant)
        row = session.scalars(query.with_for_update().execution_options(populate_existing=True)).first()
    else:
        row = session.get(WorkloadRow, workload_id)
    if row is None or not who.may_see(row.tenant):
        # A tenant learns nothing about other tenants' ids: not found, not forbidden.
        raise NotFound(f"No workload {workload_id!r}; list yours with `gpupool ls`.", workload=workload_id)
    return row


def _pods(session: Session, ids: Sequence[str]) -> dict[str, list[PodRow]]:
    result: dict[str, list[PodRow]] = {i: [] for i in ids}
    if ids:
        for pod in session.scalars(select(PodRow).where(PodRow.workload_id.in_(ids))):
            result[pod.workload_id].append(pod)
    return result


def get(rt: Runtime, who: Principal, workload_id: str) -> WorkloadOut:
    simulated = _simulated_nodes(rt)
    with rt.store.read() as session:
        row = _visible(session, who, workload_id)
        detail = workload_row_to_out(row, _pods(session, [row.id])[row.id], simulated,
                                     default_max_retries=rt.config.failure.max_retries)
    return with_network(rt, detail)  # its place in the fabric, when the pool knows one


def cancel(rt: Runtime, who: Principal, workload_id: str) -> WorkloadOut:
    """Mark it cancelled (final at once), then ask the provider to stop its pods.

    The row is locked from its read to the commit: an admission the scheduler writes meanwhile
    waits, then finds it cancelled and is dropped (it never adds pods this cancel did not stop)."""
    now = rt.clock()
    with rt.store.write() as session:
        row = _visible(session, who, workload_id, lock=True)
        if WorkloadStatus(row.status).is_final:
            raise Conflict(f"Workload {workload_id} already {row.status}; there is nothing to cancel.",
                           status=row.status)
        row_status_before = row.status
        to_stop = stop_pods(session, row, PodState.STOPPED, now)
        transition(session, row, WorkloadStatus.CANCELLED.value, EventReason.CANCELLED_BY_USER,
                   "Cancelled by the user.", now)
        row.finished_s = now
        if who.is_admin:  # the admin acting on a tenant's work: the tenant can learn who did it
            audit.record(session, who, "workload.cancel", workload_id, now,
                         f"tenant={row.tenant} was={row_status_before}")
    if row_status_before == WorkloadStatus.PENDING.value:
        rt.left_pending.append(workload_id)  # committed: the loop's kept queue drops it
    stop_after_commit(rt, to_stop, now)  # a pod whose launch no worker has begun ends at once
    rt.provider.forget_workload(workload_id)  # ended for good: its checkpoints go
    rt.capacity_may_have_changed()
    return get(rt, who, workload_id)


MOVES_PER_CALL = 500
"""apply_moves checks each refused move against the legal ones (quadratic in a call's moves): an
array's 10,000 pending tasks go in calls of this many."""


def cancel_array(rt: Runtime, who: Principal, array_id: str) -> ArrayCancelled:
    """Cancel every unfinished task of an array in one transaction: pending ones in bulk, those
    holding slices one by one (their pods are stopped after the commit); finished ones stay."""
    now = rt.clock()
    message = "Cancelled by the user (its array was cancelled)."
    with rt.store.write() as session:
        conn = session.connection()
        query = own_rows(select(WorkloadRow.id, WorkloadRow.status, WorkloadRow.tenant)
                         .where(WorkloadRow.array_id == array_id), who, WorkloadRow.tenant)
        tasks = conn.execute(query.order_by(WorkloadRow.id).with_for_update()).all()  # locked in id order
        if not tasks or not who.may_see(tasks[0].tenant):
            raise NotFound(f"No array {array_id!r}; list yours with `gpupool ls`.", array=array_id)
        pending = WorkloadStatus.PENDING.value
        cancelled = WorkloadStatus.CANCELLED.value
        moves = [Move(t.id, pending, cancelled, EventReason.CANCELLED_BY_USER.value, message, now,
                      columns=(("finished_s", now),)) for t in tasks if t.status == pending]
        for start in range(0, len(moves), MOVES_PER_CALL):
            apply_moves(conn, moves[start:start + MOVES_PER_CALL])
        holding = [t.id for t in tasks if t.status != pending and not WorkloadStatus(t.status).is_final]
        to_stop: list[str] = []
        for row in session.scalars(select(WorkloadRow).where(WorkloadRow.id.in_(holding))) if holding else ():
            to_stop += stop_pods(session, row, PodState.STOPPED, now)
            transition(session, row, cancelled, EventReason.CANCELLED_BY_USER, message, now)
            row.finished_s = now
        unfinished = sum(1 for t in tasks if not WorkloadStatus(t.status).is_final)
        if who.is_admin and unfinished:
            audit.record(session, who, "array.cancel", array_id, now,
                         f"tenant={tasks[0].tenant} tasks={unfinished}")
    stop_after_commit(rt, to_stop, now)  # a pod whose launch no worker has begun ends at once
    if to_stop:
        rt.capacity_may_have_changed()
    return ArrayCancelled(id=array_id, cancelled=unfinished, finished=len(tasks) - unfinished)


def events(rt: Runtime, who: Principal, workload_id: str) -> list[EventOut]:
    with rt.store.read() as session:
        _visible(session, who, workload_id)
        rows = session.scalars(
            select(EventRow).where(EventRow.workload_id == workload_id).order_by(EventRow.id)
        ).all()
        return [event_row_to_out(r) for r in rows]
