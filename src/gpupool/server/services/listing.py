"""Listing workloads: filters as people type them (comma lists, any case, since), pages of objects or ids.

A filter naming a tenant or queue that does not exist is NotFound rather than an empty page, so a
typo never reads as "nothing there". A tenant token sees only its own tenant; naming another one is
the same NotFound, so it learns nothing about the names of other tenants.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from gpupool.api.workloads import WorkloadOut, WorkloadPage, WorkloadSummary
from gpupool.core.model import WorkloadStatus
from gpupool.errors import InvalidInput, NotFound, did_you_mean
from gpupool.server.auth import Principal
from gpupool.server.orm import QueueRow, TenantRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.converters import workload_row_to_out, workload_row_to_summary
from gpupool.server.services.workloads import _pods, _simulated_nodes

MAX_PAGE = 1000
"""Most workloads per page of whole objects."""
MAX_ID_PAGE = 10_000
"""Most ids per page with fields=id (an id is ~15 bytes: a page stays under 200 kB)."""
STATUSES = tuple(s.value for s in WorkloadStatus)


def words(values: Sequence[str] | None) -> list[str]:
    """['succeeded,FAILED', ' x '] -> ['succeeded', 'failed', 'x']: comma lists, any case, in order."""
    found: list[str] = []
    for value in values or ():
        for word in value.split(","):
            word = word.strip().lower()
            if len(word) > 64:
                raise InvalidInput(f"{word[:20]!r}... is longer than any name (64 characters at most).")
            if word and word not in found:
                found.append(word)
    return found


@dataclass(frozen=True)
class Filters:
    statuses: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    since_s: float | None = None
    id_prefix: str = ""
    name: str | None = None
    array_ids: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()
    """With array_ids: those arrays' tasks, and these workloads too (`gpupool ls ARRAY ID`)."""

    def apply(self, query: Any) -> Any:
        if self.array_ids and self.ids:
            query = query.where(or_(WorkloadRow.array_id.in_(self.array_ids), WorkloadRow.id.in_(self.ids)))
        elif self.array_ids:
            query = query.where(WorkloadRow.array_id.in_(self.array_ids))
        elif self.ids:
            query = query.where(WorkloadRow.id.in_(self.ids))
        if self.statuses:
            query = query.where(WorkloadRow.status.in_(self.statuses))
        if self.tenants:
            query = query.where(WorkloadRow.tenant.in_(self.tenants))
        if self.queues:
            query = query.where(WorkloadRow.queue.in_(self.queues))
        if self.since_s is not None:
            query = query.where(WorkloadRow.submit_s >= self.since_s)
        if self.id_prefix:
            query = query.where(WorkloadRow.id.startswith(self.id_prefix, autoescape=True))
        if self.name is not None:
            query = query.where(WorkloadRow.name == self.name)
        return query


def filters(session: Session, who: Principal, *, status: Sequence[str] = (), tenant: Sequence[str] = (),
            queue: Sequence[str] = (), since_s: float | None = None, id_prefix: str = "",
            name: str | None = None, array_id: Sequence[str] = (), workload_id: Sequence[str] = ()
            ) -> Filters:
    """Normalise the filters and check that each tenant and queue named exists (NotFound if not)."""
    statuses = words(status)
    for s in statuses:
        if s not in STATUSES:
            raise InvalidInput(f"{s!r} is not a status; use one of {', '.join(STATUSES)}."
                               + did_you_mean(s, list(STATUSES)), status=s)
    tenants = words(tenant)
    if who.tenant is not None:
        for t in tenants:
            if t != who.tenant:
                raise NotFound(f"No tenant {t!r} for this token: it lists only tenant {who.tenant}'s "
                               "workloads.", tenant=t)
        tenants = [who.tenant]
    elif tenants:
        known = set(session.scalars(select(TenantRow.name).where(TenantRow.name.in_(tenants))))
        for t in tenants:
            if t not in known:
                raise NotFound(f"No tenant {t!r}; list them with `gpupool tenant ls`.", tenant=t)
    queues = words(queue)
    if queues:
        found = select(QueueRow.name).where(QueueRow.name.in_(queues))
        if tenants:
            found = found.where(QueueRow.tenant.in_(tenants))
        known = set(session.scalars(found))
        for q in queues:
            if q not in known:
                scope = f" in tenant {', '.join(tenants)}" if tenants else ""
                raise NotFound(f"No queue {q!r}{scope}; list them with `gpupool queue ls`.", queue=q)
    return Filters(tuple(statuses), tuple(tenants), tuple(queues), since_s, id_prefix, name,
                   _ids(array_id), _ids(workload_id))


def _ids(values: Sequence[str]) -> tuple[str, ...]:
    """Ids as given (case kept: ids are case-sensitive), comma lists split, duplicates dropped."""
    found: dict[str, None] = {}
    for value in values:
        for one in value.split(","):
            if one.strip():
                found[one.strip()] = None
    return tuple(found)


def _ordered(query: Any, chosen: Filters) -> Any:
    if chosen.array_ids and not chosen.ids:  # one or more arrays: their tasks in index order
        return query.order_by(WorkloadRow.array_id, WorkloadRow.array_index)
    return query.order_by(WorkloadRow.submit_s.desc(), WorkloadRow.id)


def list_workloads(rt: Runtime, who: Principal, *, status: Sequence[str] = (), tenant: Sequence[str] = (),
                   queue: Sequence[str] = (), since_s: float | None = None, id_prefix: str = "",
                   name: str | None = None, limit: int = 100, offset: int = 0,
                   ids_only: bool = False, array_id: Sequence[str] = (),
                   workload_id: Sequence[str] = (), full: bool = False) -> WorkloadPage:
    """Newest first. `id_prefix` keeps the ids that start with it (how the CLI resolves a short id),
    `name` the exact name, `array_id` the tasks of those arrays (and `workload_id` those workloads).
    With ids_only the page holds `ids` (up to MAX_ID_PAGE) and no items; items are summaries (no
    command, environment or directories) unless `full`."""
    page_max = MAX_ID_PAGE if ids_only else MAX_PAGE
    if limit > page_max:
        more = "" if ids_only else f" ({MAX_ID_PAGE} with fields=id)"
        raise InvalidInput(f"limit is at most {page_max} per page{more}; page with offset.", limit=limit)
    with rt.store.read() as session:
        chosen = filters(session, who, status=status, tenant=tenant, queue=queue, since_s=since_s,
                         id_prefix=id_prefix, name=name, array_id=array_id, workload_id=workload_id)
        total = session.scalar(chosen.apply(select(func.count()).select_from(WorkloadRow))) or 0
        if ids_only:
            ids = session.scalars(
                _ordered(chosen.apply(select(WorkloadRow.id)), chosen).limit(limit).offset(offset))
            return WorkloadPage(items=[], ids=list(ids), total=int(total), limit=limit, offset=offset)
        rows = session.scalars(
            _ordered(chosen.apply(select(WorkloadRow)), chosen).limit(limit).offset(offset)).all()
        pods = _pods(session, [r.id for r in rows])
        simulated = _simulated_nodes(rt)
        retries = rt.config.failure.max_retries
        convert = workload_row_to_out if full else workload_row_to_summary
        items: list[WorkloadOut | WorkloadSummary] = [
            convert(r, pods[r.id], simulated, default_max_retries=retries) for r in rows]
    return WorkloadPage(items=items, ids=None, total=int(total), limit=limit, offset=offset)
