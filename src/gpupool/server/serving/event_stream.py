"""Service events as one stream (`GET /events/services/stream`, `gpupool events --services [-f]`):
pages of the service_events table after an id, narrowed to the caller's tenant (and services).

The same cursor as the workload stream (services/event_stream.py): ids grow with each insert, so a
client resumes with Last-Event-ID; where commits become visible out of id order (PostgreSQL) a missing
id is waited for before the stream steps past it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.api.services import ServiceStreamEvent
from gpupool.errors import InvalidInput, NotFound
from gpupool.server.auth import Principal
from gpupool.server.orm import ServiceEventRow, ServiceRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.event_stream import MAX_WORKLOADS, PAGE, SCAN, Page, stream_tenant

MAX_SERVICES = MAX_WORKLOADS


@dataclass(frozen=True, slots=True)
class ServiceFilter:
    """`tenant` (None: every tenant, admin only) and `service_ids` (empty: all of them)."""

    tenant: str | None
    service_ids: tuple[str, ...] = ()


def stream_filter(rt: Runtime, who: Principal, tenant: str | None, names: Sequence[str]) -> ServiceFilter:
    """Checked before the stream starts: a tenant token streams only its own services (another
    tenant, or another tenant's service, is NotFound); a named service must exist (the admin's: of
    `tenant`, default `default`)."""
    wanted = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
    if len(wanted) > MAX_SERVICES:
        raise InvalidInput(f"A stream follows at most {MAX_SERVICES} services by name, not {len(wanted)}; "
                           "follow the tenant's whole stream instead (no names).")
    with rt.store.read() as session:
        tenant = stream_tenant(session, who, tenant)
        ids = []
        owner = tenant or "default"
        for name in wanted:
            found = session.scalar(select(ServiceRow.id).where(ServiceRow.tenant == owner,
                                                               ServiceRow.name == name))
            if found is None:
                raise NotFound(f"No service {name!r}; list yours with `gpupool service ls`.", service=name)
            ids.append(found)
    return ServiceFilter(tenant=tenant, service_ids=tuple(ids))


def read_after(rt: Runtime, wanted: ServiceFilter, after_id: int,
               limit: int = PAGE) -> Page[ServiceStreamEvent]:
    """The next service events after `after_id` that `wanted` shows, oldest first, at most `limit`."""
    query = (select(ServiceEventRow, ServiceRow.tenant, ServiceRow.name)
             .join(ServiceRow, ServiceRow.id == ServiceEventRow.service_id)
             .where(ServiceEventRow.id > after_id).order_by(ServiceEventRow.id).limit(limit))
    if wanted.service_ids:
        query = query.where(ServiceEventRow.service_id.in_(wanted.service_ids))
    if wanted.tenant is not None:
        query = query.where(ServiceRow.tenant == wanted.tenant)
    with rt.store.read() as session:
        newest, present = _bounds(session, after_id)
        events = [ServiceStreamEvent(id=row.id, tenant=tenant, service=name, reason=row.reason,
                                     message=row.message, at_s=row.at_s)
                  for row, tenant, name in session.execute(query.where(ServiceEventRow.id <= newest))]
    return Page(events, events[-1].id if len(events) == limit else newest, present)


def _bounds(session: Session, after_id: int) -> tuple[int, frozenset[int] | None]:
    """As services/event_stream._bounds, over the service_events table."""
    newest = min(int(session.scalar(select(ServiceEventRow.id).order_by(ServiceEventRow.id.desc())
                                    .limit(1)) or 0), after_id + SCAN)
    if session.get_bind().dialect.name == "sqlite":
        return max(newest, after_id), None
    if newest <= after_id:
        return after_id, frozenset()
    return newest, frozenset(session.scalars(select(ServiceEventRow.id).where(
        ServiceEventRow.id > after_id, ServiceEventRow.id <= newest)))


def newest_id(rt: Runtime) -> int:
    with rt.store.read() as session:
        return int(session.scalar(select(ServiceEventRow.id).order_by(ServiceEventRow.id.desc()).limit(1))
                   or 0)


def encode(event: ServiceStreamEvent) -> bytes:
    """One event as a server-sent event: its id, `service` as the type, the event as data."""
    return f"id: {event.id}\nevent: service\ndata: {event.model_dump_json()}\n\n".encode()
