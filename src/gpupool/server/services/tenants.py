"""Tenants, their queues and quotas, and bearer tokens; plus the first-start bootstrap."""

from __future__ import annotations

import secrets
from collections import Counter

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.core.model import WorkloadStatus
from gpupool.core.units import MILLI
from gpupool.errors import Conflict, NotFound, did_you_mean
from gpupool.server.auth import Principal, new_token, token_sha256
from gpupool.server.orm import QueueRow, TenantRow, TokenRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.schemas.tenants import (
    QueueCreate,
    QueueOut,
    QueueUpdate,
    TenantCreate,
    TenantOut,
    TokenCreate,
    TokenOut,
)
from gpupool.server.services.converters import milli_to_gpus

DEFAULT_TENANT = "default"
DEFAULT_QUEUE = "default"
_ACTIVE = (WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)


def bootstrap(rt: Runtime) -> str | None:
    """Create the default tenant and queue, and the admin token on first start.

    Returns the admin token when it was created now (the caller prints it once), else None.
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
        session.add(_token_row(token, None, "admin", now))
    return token


def _token_row(token: str, tenant: str | None, name: str, now: float) -> TokenRow:
    return TokenRow(id="tok-" + secrets.token_hex(6), token_sha256=token_sha256(token), tenant=tenant,
                    name=name, created_s=now)


def create_tenant(rt: Runtime, who: Principal, body: TenantCreate) -> TenantOut:
    """A new tenant with its `default` queue (no quota)."""
    who.require_admin()
    now = rt.clock()
    try:
        with rt.store.write() as session:
            if session.get(TenantRow, body.name) is not None:
                raise Conflict(f"Tenant {body.name!r} already exists; pick another name.")
            session.add(TenantRow(name=body.name, created_s=now))
            session.flush()
            session.add(QueueRow(tenant=body.name, name=DEFAULT_QUEUE, created_s=now))
    except IntegrityError:
        raise Conflict(f"Tenant {body.name!r} already exists; pick another name.") from None
    return TenantOut(name=body.name, created_s=now, queues=[DEFAULT_QUEUE])


def list_tenants(rt: Runtime, who: Principal) -> list[TenantOut]:
    with rt.store.read() as session:
        tenants = session.scalars(select(TenantRow).order_by(TenantRow.name)).all()
        queues = session.execute(select(QueueRow.tenant, QueueRow.name).order_by(QueueRow.name)).all()
        by_tenant: dict[str, list[str]] = {}
        for tenant, name in queues:
            by_tenant.setdefault(tenant, []).append(name)
        return [
            TenantOut(name=t.name, created_s=t.created_s, queues=by_tenant.get(t.name, []))
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


def create_token(rt: Runtime, who: Principal, body: TokenCreate) -> TokenOut:
    who.require_admin()
    token = new_token()
    with rt.store.write() as session:
        if body.tenant is not None:
            require_tenant(session, body.tenant)
        row = _token_row(token, body.tenant, body.name, rt.clock())
        session.add(row)
        token_id = row.id
    return TokenOut(id=token_id, tenant=body.tenant, name=body.name, token=token)
