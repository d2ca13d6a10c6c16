"""Job control of one workload: hold and release while pending, update a pending spec, and requeue
admitted or running work (Slurm's scontrol hold/release/update and requeue).

Each reads the workload's row locked (FOR UPDATE) and writes only if it still holds the status the
decision rests on; the scheduler's admission in turn expects the row not held, not waiting on a
dependency and of the revision it placed (services/events.py `Move.expect`), so neither can undo
the other. A tenant acts only on its own work (another tenant's id reads as unknown); the admin
acts on anyone's, and is audited.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from gpupool.api.events import EventReason
from gpupool.api.workloads import (
    STORED,
    WorkloadOut,
    WorkloadSpec,
    WorkloadUpdate,
    set_spec_field,
    spec_field,
)
from gpupool.core.model import WorkloadStatus
from gpupool.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    PriorityNotAllowed,
    QuotaExceeded,
    TooManyPending,
)
from gpupool.server.auth import Principal
from gpupool.server.orm import QueueRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import audit
from gpupool.server.services import workloads as workload_service
from gpupool.server.services.events import transition
from gpupool.server.services.requeue import requeue as requeue_row
from gpupool.server.services.requeue import stop_after_commit
from gpupool.server.services.specs import CAPACITY, check_fits, to_workload
from gpupool.server.services.submit_writer import max_pending_fix, pending_room

_PENDING = WorkloadStatus.PENDING.value


def _only_pending(row: WorkloadRow, verb: str) -> None:
    if row.status != _PENDING:
        raise Conflict(f"Workload {row.id} is {row.status}; only pending work can be {verb} "
                       "(`gpupool requeue ID` sends admitted or running work back to pending).",
                       status=row.status)


def hold(rt: Runtime, who: Principal, workload_id: str) -> WorkloadOut:
    """Keep a pending workload from being placed until released (an admin's hold only the admin
    releases). Holding held work is a no-op."""
    now = rt.clock()
    with rt.store.write() as session:
        row = workload_service._visible(session, who, workload_id, lock=True)
        _only_pending(row, "held")
        by = "admin" if who.is_admin else "user"
        held = row.held != by and row.held != "admin"
        if held:
            row.held = by
            transition(session, row, _PENDING, EventReason.HELD, f"Held by the {by}.", now)
            if who.is_admin:
                audit.record(session, who, "workload.hold", workload_id, now, f"tenant={row.tenant}")
    if held:
        rt.left_pending.append(workload_id)  # committed: the loop's kept queue drops it
    return workload_service.get(rt, who, workload_id)


def release(rt: Runtime, who: Principal, workload_id: str) -> WorkloadOut:
    """Let a held workload be placed again (pending work that is not held is left as it is)."""
    now = rt.clock()
    with rt.store.write() as session:
        row = workload_service._visible(session, who, workload_id, lock=True)
        _only_pending(row, "released")
        if row.held == "admin" and not who.is_admin:
            raise Forbidden(f"Workload {workload_id} was held by the admin; only the admin may release it.",
                            workload=workload_id)
        if row.held:
            row.held = ""
            transition(session, row, _PENDING, EventReason.RELEASED, "Released.", now)
            if who.is_admin:
                audit.record(session, who, "workload.release", workload_id, now, f"tenant={row.tenant}")
    rt.capacity_may_have_changed()  # it is older than the scheduler's horizon of new arrivals
    return workload_service.get(rt, who, workload_id)


def update(rt: Runtime, who: Principal, workload_id: str, change: WorkloadUpdate) -> WorkloadOut:
    """Change a pending workload's priority (within the tenant's limit), time limit, gpus or
    replicas; refused with a sentence once it was admitted."""
    now = rt.clock()
    with rt.store.write() as session:
        row = workload_service._visible(session, who, workload_id, lock=True)
        _only_pending(row, "updated")
        limit = who.max_priority
        if change.priority is not None and limit is not None and change.priority > limit:
            raise PriorityNotAllowed(
                f"Tenant {row.tenant} may use priority <= {who.max_priority}; ask the admin "
                f"(gpupool tenant set {row.tenant} --max-priority N).",
                priority=change.priority, max_priority=who.max_priority)
        stored: dict[str, Any] = dict(row.spec)
        said: list[str] = []
        for field, value in change.fields():
            was = spec_field(stored, field)
            if was != value:
                said.append(f"{field} {_shown(was)} -> {_shown(value)}")
                set_spec_field(stored, field, value)
        if not said:
            return workload_service.get(rt, who, workload_id)
        try:
            spec = WorkloadSpec.model_validate(stored, context=STORED)  # an update changes no env, no workdir
        except ValidationError as exc:
            raise InvalidInput(f"That update leaves an invalid spec: {exc.errors()[0]['msg']}.",
                               field="update") from None
        check_fits(spec, CAPACITY.get(rt.nodes()))
        parsed = to_workload(row.id, spec, row.tenant, spec.priority, row.submit_s)
        queue = session.get(QueueRow, (row.tenant, row.queue))
        limit_milli = None if queue is None else queue.quota_device_milli
        if limit_milli is not None and parsed.total_device_milli > limit_milli:  # as at submit
            raise QuotaExceeded(
                f"The workload would ask for {parsed.total_device_milli / 1000:g} GPUs but queue "
                f"{row.tenant}/{row.queue} may hold at most {limit_milli / 1000:g}; ask for less or "
                "raise the quota.", requested_gpus=parsed.total_device_milli / 1000,
                quota_gpus=limit_milli / 1000)
        row.spec = stored
        row.priority = spec.priority
        row.time_limit_s = spec.time_limit_s
        row.device_milli = parsed.total_device_milli
        row.revision = (row.revision or 0) + 1
        transition(session, row, _PENDING, EventReason.UPDATED, "Updated: " + "; ".join(said) + ".", now)
        if who.is_admin:
            audit.record(session, who, "workload.update", workload_id, now,
                         f"tenant={row.tenant} " + "; ".join(said))
    rt.capacity_may_have_changed()
    return workload_service.get(rt, who, workload_id)


def _shown(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "none" if value is None else str(value)


def requeue(rt: Runtime, who: Principal, workload_id: str, *, hold_after: bool = False) -> WorkloadOut:
    """Stop an admitted or running workload's pods and send it back to pending (Slurm's requeue);
    with `hold_after` it waits held there. Its pods are stopped after the commit."""
    now = rt.clock()
    with rt.store.write() as session:
        if who.tenant is not None:
            _room_for_one_more(session, who.tenant, workload_id)
        row = workload_service._visible(session, who, workload_id, lock=True)
        if row.status not in (WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value):
            raise Conflict(f"Workload {workload_id} is {row.status}; only admitted or running work can be "
                           "requeued (pending work waits already; finished work is resubmitted).",
                           status=row.status)
        by = "the admin" if who.is_admin else "the user"
        to_stop = requeue_row(session, row, EventReason.REQUEUED_BY_USER.value, f"Requeued by {by}.", now)
        if hold_after:
            row.held = "admin" if who.is_admin else "user"
            transition(session, row, _PENDING, EventReason.HELD, f"Held by {by} (requeue --hold).", now)
        if who.is_admin:
            audit.record(session, who, "workload.requeue", workload_id, now, f"tenant={row.tenant}")
    stop_after_commit(rt, to_stop, now)  # a launch no worker has begun is taken back
    rt.capacity_may_have_changed()
    return workload_service.get(rt, who, workload_id)


def _room_for_one_more(session: Any, tenant: str, workload_id: str) -> None:
    """A tenant's requeue gives it one more pending workload, so its max_pending holds as for a
    submission: refused (429) at the limit, counted as a submission counts (`pending_room`: the
    tenant's row locked first), so two requeues, or a requeue and a submission, cannot both take the
    last place. The admin's requeue is not limited."""
    room = pending_room(session.connection(), tenant)
    if room is None:
        return
    pending, limit = room
    if pending >= limit:
        raise TooManyPending(
            f"Tenant {tenant} already has {pending} pending workload{'' if pending == 1 else 's'} and its "
            f"limit is {limit}, so {workload_id} was not requeued; {max_pending_fix(tenant)}.",
            tenant=tenant, max_pending=limit)


def read_checkpoint(rt: Runtime, who: Principal, workload_id: str, since_s: float | None,
                    max_bytes: int) -> tuple[float | None, bytes | None] | None:
    """The workload's checkpoint directory as a tar and its mark (GET /workloads/ID/checkpoint):
    None when it has no mark (none saved), (mark, None) when its mark is not after `since_s`. Only
    its tenant reads it, and the admin or a federation hub only of work they submitted for it (the
    tenant's own pods write there as its account, their secrets among what they may write); another
    tenant's id is unknown."""
    with rt.store.read() as session:
        row = workload_service._visible(session, who, workload_id)
        if who.on_behalf is not None and not row.spec.get("on_behalf"):
            raise Forbidden(f"Workload {row.id} was submitted with one of tenant {row.tenant}'s own tokens; "
                            f"its checkpoint is what its pods wrote as {row.tenant}'s account, read with one "
                            f"of {row.tenant}'s tokens only (the {who.on_behalf} reads the checkpoints of "
                            "work it submitted).", workload=row.id)
    mark = rt.provider.checkpoint_s(workload_id)  # a pod touches the mark once its files are saved
    if mark is None:
        return None
    if since_s is not None and mark <= since_s:
        return mark, None
    # the archive is built in the server's memory (up to twice max_bytes while it is): a few at once
    give_back = checkpoint_slot(rt, who)
    try:
        return rt.provider.read_checkpoint(workload_id, max_bytes)
    finally:
        give_back()


def checkpoint_slot(rt: Runtime, who: Principal) -> Callable[[], None]:
    """One of the checkpoint transfers the server holds in memory at once (TooManyRequests past
    them); the returned call gives it back."""
    whose = f"Tenant {who.tenant}" if who.tenant else "The admin"
    return rt.checkpoint_transfers.take(who.tenant or "", whose)


def check_seedable(rt: Runtime, who: Principal, workload_id: str) -> None:
    """What `seed_checkpoint` refuses, checked before its archive is read: held work of the caller's
    that never ran (checked again under the row's lock when the files are written)."""
    with rt.store.read() as session:
        _refuse_unseedable(workload_service._visible(session, who, workload_id), who)


def _refuse_unseedable(row: WorkloadRow, who: Principal) -> None:
    if who.on_behalf is not None and not row.spec.get("on_behalf"):  # its files are read as code runs
        raise Forbidden(f"Workload {row.id} was submitted with one of tenant {row.tenant}'s own tokens and "
                        f"runs as its account; a checkpoint from the {who.on_behalf} could run code there "
                        f"(a pickle loads as it reads). Put it with one of {row.tenant}'s tokens.",
                        workload=row.id)
    if row.status != _PENDING or row.attempt != 0 or not row.held:
        raise Conflict(f"Workload {row.id} is {row.status}{'' if row.held else ', not held'}"
                       f"{', and has run before' if row.attempt else ''}; a checkpoint is given only to "
                       "held work that never ran (submit it with ?hold=true, put the checkpoint, then "
                       "release it).", workload=row.id, status=row.status)


def seed_checkpoint(rt: Runtime, who: Principal, workload_id: str, data: bytes) -> WorkloadOut:
    """Fill the checkpoint directory of a held workload that never ran (PUT /workloads/ID/checkpoint):
    a federation hub resumes there work that a silent member ran. Held, so no pod starts while the
    files are written; the row stays locked until they are."""
    with rt.store.write() as session:
        row = workload_service._visible(session, who, workload_id, lock=True)
        _refuse_unseedable(row, who)
        tenant, unix_user = row.tenant, _unix_user(session, row.tenant)
        size = rt.provider.seed_checkpoint(workload_id, tenant, unix_user, data,
                                           on_behalf=bool(row.spec.get("on_behalf")))
        transition(session, row, _PENDING, EventReason.HELD,
                   f"Given a checkpoint of {size} bytes to resume from.", rt.clock())
    return workload_service.get(rt, who, workload_id)


def _unix_user(session: Any, tenant: str) -> str:
    from sqlalchemy import select

    from gpupool.server.orm import TenantRow

    return str(session.scalar(select(TenantRow.unix_user).where(TenantRow.name == tenant)) or "")
