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

from sqlalchemy import select

from gpupool.api.workloads import EventOut
from gpupool.errors import InvalidInput, NotFound
from gpupool.server.auth import Principal
from gpupool.server.orm import EventRow, TenantRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.converters import event_row_to_out

PAGE = 500
"""Events one read returns at most: what a slow client can make the server hold per stream."""
MAX_WORKLOADS = 100
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
        if who.tenant is not None:
            if tenant not in (None, who.tenant):
                raise NotFound(f"No tenant {tenant!r} for this token: it streams only tenant "
                               f"{who.tenant!r}'s events.", tenant=tenant)
            tenant = who.tenant
        elif tenant is not None and session.get(TenantRow, tenant) is None:
            raise NotFound(f"No tenant {tenant!r}; list them with `gpupool tenant ls`.", tenant=tenant)
        if ids:
            found = dict(session.execute(select(WorkloadRow.id, WorkloadRow.tenant)
                                         .where(WorkloadRow.id.in_(ids))).tuples().all())
            for workload_id in ids:
                if workload_id not in found or (tenant is not None and found[workload_id] != tenant):
                    raise NotFound(f"No workload {workload_id!r}; list yours with `gpupool ls`.",
                                   workload=workload_id)
    return StreamFilter(tenant=tenant, workload_ids=ids)


def read_after(rt: Runtime, wanted: StreamFilter, after_id: int, limit: int = PAGE
               ) -> tuple[list[EventOut], set[int] | None]:
    """The next events after `after_id` that `wanted` shows, oldest first, at most `limit`; and
    every id stored (whoever's) from after_id to the last one returned, where commits may become
    visible out of id order (None on SQLite, whose writes commit one at a time, in id order)."""
    query = select(EventRow).where(EventRow.id > after_id).order_by(EventRow.id).limit(limit)
    if wanted.workload_ids:
        query = query.where(EventRow.workload_id.in_(wanted.workload_ids))
    if wanted.tenant is not None:
        query = query.join(WorkloadRow, WorkloadRow.id == EventRow.workload_id).where(
            WorkloadRow.tenant == wanted.tenant)
    with rt.store.read() as session:
        events = [event_row_to_out(row) for row in session.scalars(query)]
        if not events or session.get_bind().dialect.name == "sqlite":
            return events, None
        present = set(session.scalars(select(EventRow.id).where(EventRow.id > after_id,
                                                                EventRow.id <= events[-1].id)))
    return events, present


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

    def take(self, events: list[EventOut], present: set[int] | None, now_s: float) -> list[EventOut]:
        """The events of a page (read after `done`) not delivered yet, marked delivered. `present`:
        every id stored in the page's range (None: ids become visible in order, so there are no
        gaps). `done` moves past each id delivered, or stored but not this stream's, or missing
        for longer than GAP_WAIT_S."""
        fresh = [e for e in events if e.id > self.done and e.id not in self.sent]
        self.sent.update(e.id for e in fresh)
        if present is None:
            self.done = max([self.done, *(e.id for e in events)])
            self.sent.clear()
            return fresh
        top = max((e.id for e in events), default=self.done)
        for number in range(self.done + 1, top):
            if number in present:
                self.sent.add(number)  # another stream's event: nothing to wait for
            else:
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
