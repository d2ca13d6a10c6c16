"""The events of many workloads as one stream (`GET /events/stream`, `gpupool events -f`): pages of
the events table after an id, narrowed to what the caller may see.

Each page is one short read (a pooled connection, released at once): a follower polls, so no client
holds a connection or a thread between pages. Ids grow with each insert, so "after id N" resumes
exactly where a client left off (SSE's Last-Event-ID). Where transactions commit concurrently
(PostgreSQL) a smaller id can become visible after a larger one; the follower waits for such a gap to
fill for GAP_WAIT_S before it steps past it, so a late commit is still delivered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.api.workloads import EventOut
from gpupool.errors import InvalidInput, NotFound
from gpupool.server.auth import Principal
from gpupool.server.orm import EventRow, TenantRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.converters import event_row_to_out

PAGE = 500
"""Events one read returns at most: what a slow client can make the server hold per stream."""
MAX_WORKLOADS = 100
SCAN = 50_000
"""The most ids one read looks across (a stream far behind catches up window by window)."""
GAP_WAIT_S = 5.0
"""How long an id below the newest one seen may stay missing (a transaction not yet committed)
before the stream steps past it (a rolled-back insert never fills its id)."""


@dataclass(frozen=True, slots=True)
class StreamFilter:
    """What one stream shows: `tenant` (None: every tenant, admin only) and `workload_ids` (empty: all)."""

    tenant: str | None
    workload_ids: tuple[str, ...] = ()


def stream_filter(rt: Runtime, who: Principal, tenant: str | None,
                  workload_ids: Sequence[str]) -> StreamFilter:
    """Check the filter before the stream starts: a tenant token sees only itself (naming another
    tenant, or another tenant's workload, is NotFound, as for a listing); an admin's tenant and
    workloads must exist."""
    ids = tuple(dict.fromkeys(w.strip() for w in workload_ids if w.strip()))
    if len(ids) > MAX_WORKLOADS:
        raise InvalidInput(f"A stream follows at most {MAX_WORKLOADS} workloads by id, not {len(ids)}; "
                           "follow the tenant's whole stream instead (no ids).")
    with rt.store.read() as session:
        tenant = stream_tenant(session, who, tenant)
        if ids:
            found = dict(session.execute(select(WorkloadRow.id, WorkloadRow.tenant)
                                         .where(WorkloadRow.id.in_(ids))).all())
            for workload_id in ids:
                if workload_id not in found or (tenant is not None and found[workload_id] != tenant):
                    raise NotFound(f"No workload {workload_id!r}; list yours with `gpupool ls`.",
                                   workload=workload_id)
    return StreamFilter(tenant=tenant, workload_ids=ids)


def stream_tenant(session: Session, who: Principal, tenant: str | None) -> str | None:
    """The tenant a stream may show: a tenant token only its own (naming another is NotFound, as for
    a listing); an admin's named tenant must exist (None: every tenant)."""
    if who.tenant is not None:
        if tenant not in (None, who.tenant):
            raise NotFound(f"No tenant {tenant!r} for this token: it streams only tenant "
                           f"{who.tenant}'s events.", tenant=tenant)
        return who.tenant
    if tenant is not None and session.get(TenantRow, tenant) is None:
        raise NotFound(f"No tenant {tenant!r}; list them with `gpupool tenant ls`.", tenant=tenant)
    return tenant


class _Numbered(Protocol):
    @property
    def id(self) -> int: ...


E = TypeVar("E", bound=_Numbered)
"""A workload's event, or a service's (serving/event_stream.py): anything with a growing id."""


@dataclass(frozen=True, slots=True)
class Page(Generic[E]):
    """One read of the events table after a stream's cursor: the events it shows, the highest id
    the read looked at (`scanned_to`), and, where commits may become visible out of id order
    (PostgreSQL), every id stored up to there, whoever's (`present`; None on SQLite, whose writes
    commit one at a time, in id order)."""

    events: list[E]
    scanned_to: int
    present: frozenset[int] | None = None


def read_after(rt: Runtime, wanted: StreamFilter, after_id: int, limit: int = PAGE) -> Page[EventOut]:
    """The next events after `after_id` that `wanted` shows, oldest first, at most `limit`."""
    query = select(EventRow).where(EventRow.id > after_id).order_by(EventRow.id).limit(limit)
    if wanted.workload_ids:
        query = query.where(EventRow.workload_id.in_(wanted.workload_ids))
    if wanted.tenant is not None:
        query = query.join(WorkloadRow, WorkloadRow.id == EventRow.workload_id).where(
            WorkloadRow.tenant == wanted.tenant)
    with rt.store.read() as session:
        newest, present = _bounds(session, after_id)
        events = [event_row_to_out(row) for row in session.scalars(query.where(EventRow.id <= newest))]
    return Page(events, events[-1].id if len(events) == limit else newest, present)


def read_all_after(rt: Runtime, after_id: int, limit: int = PAGE) -> tuple[Page[EventOut], list[str]]:
    """Every tenant's next events after `after_id`, and each one's tenant."""
    query = (select(EventRow, WorkloadRow.tenant).join(WorkloadRow, WorkloadRow.id == EventRow.workload_id)
             .where(EventRow.id > after_id).order_by(EventRow.id).limit(limit))
    with rt.store.read() as session:
        newest, present = _bounds(session, after_id)
        rows = session.execute(query.where(EventRow.id <= newest)).all()
    events = [event_row_to_out(row) for row, _ in rows]
    page = Page(events, events[-1].id if len(events) == limit else newest, present)
    return page, [str(tenant) for _, tenant in rows]


def _bounds(session: Session, after_id: int) -> tuple[int, frozenset[int] | None]:
    """The newest id stored (at most SCAN past `after_id`), and (where ids may show out of order)
    every id stored after `after_id` up to it: read before the events, so an event committed in
    between is either read (and delivered) or not yet present (a gap, waited for), never taken for
    another stream's."""
    newest = int(session.scalar(select(EventRow.id).order_by(EventRow.id.desc()).limit(1)) or 0)
    newest = min(newest, after_id + SCAN)
    if session.get_bind().dialect.name == "sqlite":
        return max(newest, after_id), None
    if newest <= after_id:
        return after_id, frozenset()
    present = session.scalars(select(EventRow.id).where(EventRow.id > after_id, EventRow.id <= newest))
    return newest, frozenset(present)


def encode(event: EventOut) -> bytes:
    """One event as a server-sent event: its id, its new status as the type, the event as data."""
    return (f"id: {event.id}\nevent: {event.to_status or 'event'}\ndata: {event.model_dump_json()}\n\n"
            .encode())


def newest_id(rt: Runtime) -> int:
    """The largest event id stored now (0 when none): where a stream that asks for no backlog starts."""
    with rt.store.read() as session:
        return int(session.scalar(select(EventRow.id).order_by(EventRow.id.desc()).limit(1)) or 0)


@dataclass(slots=True)
class Cursor:
    """Where a stream stands: every id up to `done` was delivered or given up on; `sent` holds the
    delivered ids above it, and `gaps` the missing ones below the newest, with when each was first
    seen missing."""

    done: int
    sent: set[int] = field(default_factory=set)
    gaps: dict[int, float] = field(default_factory=dict)

    def take(self, page: Page[E], now_s: float) -> list[E]:
        """The events of a page (read after `done`) not delivered yet, marked delivered; `done`
        moves past each id delivered, or stored but not this stream's, or missing (not committed
        yet, or never) for longer than GAP_WAIT_S."""
        fresh = [e for e in page.events if e.id > self.done and e.id not in self.sent]
        self.sent.update(e.id for e in fresh)
        if page.present is None:  # ids show in order: everything up to scanned_to was seen
            self.done = max(self.done, page.scanned_to)
            self.sent.clear()
            return fresh
        for number in range(self.done + 1, page.scanned_to + 1):
            if number in page.present:
                self.sent.add(number)  # delivered, or another stream's: nothing to wait for
            elif number not in self.sent:
                self.gaps.setdefault(number, now_s)
        while True:
            following = self.done + 1
            if following in self.sent:
                self.sent.discard(following)
                self.gaps.pop(following, None)
            elif following in self.gaps and now_s - self.gaps[following] >= GAP_WAIT_S:
                del self.gaps[following]
            else:
                return fresh
            self.done = following
