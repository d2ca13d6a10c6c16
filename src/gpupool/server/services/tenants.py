"""Tenants (limits, Unix account), their queues and quotas; plus the first-start bootstrap."""

from __future__ import annotations

import getpass
import os
from collections import Counter

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.agent.identity import mapped_account
from gpupool.core.model import WorkloadStatus
from gpupool.core.units import MILLI
from gpupool.errors import Conflict, InvalidInput, NotFound, did_you_mean
from gpupool.server.auth import Principal, new_token
from gpupool.server.orm import QueueRow, TenantRow, TokenRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.schemas.tenants import (
    QueueCreate,
    QueueOut,
    QueueUpdate,
    TenantCreate,
    TenantOut,
    TenantUpdate,
)
from gpupool.server.services import audit
from gpupool.server.services.converters import milli_to_gpus
from gpupool.server.services.tokens import token_row, write_private_file

DEFAULT_TENANT = "default"
DEFAULT_QUEUE = "default"
_ACTIVE = (WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)


def bootstrap(rt: Runtime) -> str | None:
    """Create the default tenant and queue, and the admin token on first start.

    The admin token (which never expires) is written to DATA_DIR/admin-token (0600) before its
    hash is committed, so a crash leaves either both or a file that the next start replaces.
    Returns the admin token when it was created now, else None.
    """
    now = rt.clock()
    with rt.store.write() as session:
        if session.get(TenantRow, DEFAULT_TENANT) is None:
            session.add(TenantRow(name=DEFAULT_TENANT, created_s=now))
            session.flush()
        if session.get(QueueRow, (DEFAULT_TENANT, DEFAULT_QUEUE)) is None:
            session.add(QueueRow(tenant=DEFAULT_TENANT, name=DEFAULT_QUEUE, created_s=now))
        has_admin = session.scalars(select(TokenRow.id).where(TokenRow.tenant.is_(None))).first()
        if has_admin is not None or not rt.settings.create_admin_token:
            return None
        token = new_token()
        write_private_file(rt.settings.admin_token_path, token + "\n")
        session.add(token_row(token, None, "admin", now))
    return token


def server_is_root() -> bool:
    return os.geteuid() == 0


def single_user_warning() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # an account with no name (containers)
        user = f"uid {os.geteuid()}"
    return (f"gpupool runs as {user}, not root, so every pod runs as {user} and tenants are not "
            "isolated from each other; this pool is for that one user.")


def check_unix_user(session: Session, name: str, tenant: str) -> None:
    """An existing, unprivileged account on this machine (the agent checks it again at launch) that
    no other tenant is mapped to."""
    mapped_account(name)
    other = session.scalars(select(TenantRow.name).where(TenantRow.unix_user == name,
                                                         TenantRow.name != tenant)).first()
    if other is not None:
        raise InvalidInput(f"Unix account {name!r} already runs tenant {other!r}'s pods; give each "
                           "tenant its own account so they cannot reach each other's files.",
                           unix_user=name)


def create_tenant(rt: Runtime, who: Principal, body: TenantCreate) -> TenantOut:
    """A new tenant with its `default` queue (no quota)."""
    who.require_admin()
    now = rt.clock()
    try:
        with rt.store.write() as session:
            if session.get(TenantRow, body.name) is not None:
                raise Conflict(f"Tenant {body.name!r} already exists; pick another name.")
            if body.unix_user is not None:
                check_unix_user(session, body.unix_user, body.name)
            session.add(TenantRow(name=body.name, created_s=now, max_priority=body.max_priority,
                                  max_pending=body.max_pending, unix_user=body.unix_user))
            session.flush()
            session.add(QueueRow(tenant=body.name, name=DEFAULT_QUEUE, created_s=now))
            audit.record(session, who, "tenant.create", body.name, now, _limits_text(
                body.max_priority, body.max_pending, body.unix_user))
    except IntegrityError:
        raise Conflict(f"Tenant {body.name!r} already exists; pick another name.") from None
    warning = None if body.name == DEFAULT_TENANT or server_is_root() else single_user_warning()
    return TenantOut(name=body.name, created_s=now, queues=[DEFAULT_QUEUE], max_priority=body.max_priority,
                     max_pending=body.max_pending, unix_user=body.unix_user, warning=warning)


def _limits_text(max_priority: int, max_pending: int, unix_user: str | None) -> str:
    return f"max_priority={max_priority} max_pending={max_pending} unix_user={unix_user or '-'}"


def update_tenant(rt: Runtime, who: Principal, name: str, body: TenantUpdate) -> TenantOut:
    """Change the fields given; a tenant's tokens see new limits within a second on every process."""
    who.require_admin()
    given = body.model_fields_set
    with rt.store.write() as session:
        row = session.get(TenantRow, name)
        if row is None:
            require_tenant(session, name)
        assert row is not None
        if "unix_user" in given and body.unix_user is not None:
            check_unix_user(session, body.unix_user, name)
        if "unix_user" in given:
            row.unix_user = body.unix_user
        if body.max_priority is not None:
            row.max_priority = body.max_priority
        if body.max_pending is not None:
            row.max_pending = body.max_pending
        audit.record(session, who, "tenant.update", name, rt.clock(),
                     _limits_text(row.max_priority, row.max_pending, row.unix_user))
    rt.auth.forget()
    return next(t for t in list_tenants(rt, who) if t.name == name)


def list_tenants(rt: Runtime, who: Principal) -> list[TenantOut]:
    with rt.store.read() as session:
        tenants = session.scalars(select(TenantRow).order_by(TenantRow.name)).all()
        queues = session.execute(select(QueueRow.tenant, QueueRow.name).order_by(QueueRow.name)).all()
        by_tenant: dict[str, list[str]] = {}
        for tenant, name in queues:
            by_tenant.setdefault(tenant, []).append(name)
        return [
            TenantOut(name=t.name, created_s=t.created_s, queues=by_tenant.get(t.name, []),
                      max_priority=t.max_priority, max_pending=t.max_pending, unix_user=t.unix_user)
            for t in tenants
            if who.may_see(t.name)
        ]


def require_tenant(session: Session, name: str) -> None:
    if session.get(TenantRow, name) is None:
        names = list(session.scalars(select(TenantRow.name)).all())
        raise NotFound(f"No tenant named {name!r}.{did_you_mean(name, names)}", tenant=name)


def create_queue(rt: Runtime, who: Principal, body: QueueCreate) -> QueueOut:
    who.require_admin()
    quota = None if body.quota_gpus is None else round(body.quota_gpus * MILLI)
    try:
        with rt.store.write() as session:
            require_tenant(session, body.tenant)
            if session.get(QueueRow, (body.tenant, body.name)) is not None:
                raise Conflict(f"Queue {body.tenant}/{body.name} already exists; update it instead.")
            session.add(QueueRow(tenant=body.tenant, name=body.name, quota_device_milli=quota,
                                 created_s=rt.clock()))
            audit.record(session, who, "queue.create", f"{body.tenant}/{body.name}", rt.clock(),
                         f"quota_gpus={body.quota_gpus}")
    except IntegrityError:
        raise Conflict(f"Queue {body.tenant}/{body.name} already exists; update it instead.") from None
    return _queue_outs(rt, who, tenant=body.tenant, name=body.name)[0]


def update_queue(rt: Runtime, who: Principal, tenant: str, name: str, body: QueueUpdate) -> QueueOut:
    who.require_admin()
    with rt.store.write() as session:
        row = session.get(QueueRow, (tenant, name))
        if row is None:
            raise NotFound(f"No queue {tenant}/{name}; create it with `gpupool queue create`.")
        row.quota_device_milli = None if body.quota_gpus is None else round(body.quota_gpus * MILLI)
        audit.record(session, who, "queue.update", f"{tenant}/{name}", rt.clock(),
                     f"quota_gpus={body.quota_gpus}")
    rt.capacity_may_have_changed()
    return _queue_outs(rt, who, tenant=tenant, name=name)[0]


def list_queues(rt: Runtime, who: Principal, tenant: str | None) -> list[QueueOut]:
    if tenant is not None and not who.may_see(tenant):
        raise NotFound(f"No tenant named {tenant!r}.", tenant=tenant)
    return _queue_outs(rt, who, tenant=tenant or who.tenant)


def _queue_outs(rt: Runtime, who: Principal, tenant: str | None, name: str | None = None) -> list[QueueOut]:
    with rt.store.read() as session:
        query = select(QueueRow).order_by(QueueRow.tenant, QueueRow.name)
        if tenant is not None:
            query = query.where(QueueRow.tenant == tenant)
        if name is not None:
            query = query.where(QueueRow.name == name)
        rows = session.scalars(query).all()
        counts = session.execute(
            select(WorkloadRow.tenant, WorkloadRow.queue, WorkloadRow.status,
                   func.count(), func.sum(WorkloadRow.device_milli))
            .where(WorkloadRow.status.in_((WorkloadStatus.PENDING.value, *_ACTIVE)))
            .group_by(WorkloadRow.tenant, WorkloadRow.queue, WorkloadRow.status)
        ).all()
        number: Counter[tuple[str, str, str]] = Counter()
        used: Counter[tuple[str, str]] = Counter()
        for t, q, status, count, milli in counts:
            number[(t, q, status)] += int(count)
            if status in _ACTIVE:
                used[(t, q)] += int(milli or 0)
        return [
            QueueOut(
                tenant=r.tenant,
                name=r.name,
                quota_gpus=milli_to_gpus(r.quota_device_milli),
                used_gpus=used[(r.tenant, r.name)] / MILLI,
                pending=number[(r.tenant, r.name, WorkloadStatus.PENDING.value)],
                running=sum(number[(r.tenant, r.name, s)] for s in _ACTIVE),
            )
            for r in rows
            if who.may_see(r.tenant)
        ]
