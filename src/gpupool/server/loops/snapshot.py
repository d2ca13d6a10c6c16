"""Build what the core cycle needs from the store: the cluster snapshot, pending work and quotas."""

from __future__ import annotations

import collections
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, func, or_, select, union_all

from gpupool.api.workloads import STORED, WorkloadSpec
from gpupool.core.model import (
    Allocation,
    AllocationChanges,
    ClusterSnapshot,
    PodPlacement,
    Slice,
    Workload,
    WorkloadStatus,
)
from gpupool.core.quota import QuotaConfig
from gpupool.server.loops.pending_queue import KeptPending
from gpupool.server.orm import NodeFlagRow, PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.arrays import throttled
from gpupool.server.services.quotas import read_quota
from gpupool.server.services.specs import CAPACITY, to_workload
from gpupool.server.states import ACTIVE_POD_STATES

log = logging.getLogger("gpupool.scheduler")

MAX_PENDING_PER_CYCLE = 5000
MAX_CHANGES_SLACK = 4096
"""`WorkloadCache` keeps the allocations ended since the last cycle up to the number cached plus
this many; past it, the next snapshot carries no changes (the keeper compares in full)."""


if TYPE_CHECKING:  # (a subscript SQLAlchemy 2.0 does not take at run time)
    from sqlalchemy import Select

    _PendingRows = Select[str, str, int, float, int | None, int]
    """(id, tenant, priority, submit_s, array_limit, revision) of pending workloads."""


def _within_array_limits(pending_query: _PendingRows) -> Any:
    """The pending rows, each array with a %N limit contributing at most N of its tasks (its lowest
    indexes): `throttled` keeps at most that many of them eligible, the lowest indexes first, so the
    rest could not run this cycle anyway. Without this, one array of thousands of throttled tasks
    filled the cycle's read (`MAX_PENDING_PER_CYCLE`) ahead of every other tenant's work, which then
    waited unread while the pool stood idle. Only the limited arrays' tasks are ranked (a window
    function over every pending row cost a 10,000-row read 40 %)."""
    rank = func.row_number().over(partition_by=WorkloadRow.array_id,
                                  order_by=(WorkloadRow.array_index, WorkloadRow.id)).label("array_rank")
    ranked = pending_query.where(WorkloadRow.array_limit.is_not(None)).add_columns(rank).subquery()
    limited = select(ranked.c.id, ranked.c.tenant, ranked.c.priority, ranked.c.submit_s, ranked.c.array_limit,
                     ranked.c.revision).where(ranked.c.array_rank <= ranked.c.array_limit)
    return union_all(pending_query.where(WorkloadRow.array_limit.is_(None)), limited).subquery()


def _taking_turns(both: Any) -> _PendingRows:
    """The read of a store with more pending work than one cycle reads: each priority in turn, and
    within it the tenants taking turns (every tenant's oldest, then every tenant's second oldest,
    ...). In the core's order alone, one tenant's thousands of workloads that cannot start (its
    queue's quota used up, say) filled the read, and every other tenant's work of that priority or
    lower went unread, never considered while the backlog lasted. The window function doubles the
    read's cost (10,000 pending: 19 against 37 ms of CPU on SQLite, bench/pending_read.py), so it
    runs only while the store holds more than one read takes (`WorkloadCache.saturated`)."""
    turn = func.row_number().over(partition_by=(both.c.tenant, both.c.priority),
                                  order_by=(both.c.submit_s, both.c.id)).label("turn")
    ranked = select(*both.c, turn).subquery()
    return select(ranked.c.id, ranked.c.tenant, ranked.c.priority, ranked.c.submit_s, ranked.c.array_limit,
                  ranked.c.revision).order_by(ranked.c.priority.desc(), ranked.c.turn, ranked.c.submit_s,
                                              ranked.c.id)


@functools.lru_cache(maxsize=16)
def _pending_read(arrivals: bool, backoff: bool, limit: int, turns: bool = False) -> _PendingRows:
    """The pending rows a cycle reads, built once for each shape: with `arrivals`, only the ids
    given as `wanted`; with `backoff`, only work whose backoff ended by `now_s`; with `turns`, the
    tenants taking turns within each priority (`_taking_turns`), else in the core's order. Building
    and keying this statement cost more than running it on a small pool (1.3 ms of a cycle's CPU),
    and SQLAlchemy keeps a statement's cache key once it has computed it."""
    query = select(WorkloadRow.id, WorkloadRow.tenant, WorkloadRow.priority,
                   WorkloadRow.submit_s, WorkloadRow.array_limit, WorkloadRow.revision).where(
                       WorkloadRow.status == WorkloadStatus.PENDING.value,
                       WorkloadRow.held == "", WorkloadRow.waiting_on == "")
    if arrivals:
        query = query.where(WorkloadRow.id.in_(bindparam("wanted", expanding=True)))
    if backoff:
        query = query.where(or_(WorkloadRow.not_before_s.is_(None),
                                WorkloadRow.not_before_s <= bindparam("now_s")))
    both = _within_array_limits(query)
    if turns:  # the rows taken in turns, then put in the core's order
        both = _taking_turns(both).limit(limit).subquery()
    return select(*both.c).order_by(both.c.priority.desc(), both.c.submit_s, both.c.id).limit(limit)


# The other reads of `load`, built once (see `_pending_read`).
_RECENT = select(WorkloadRow.id).where(WorkloadRow.status == WorkloadStatus.PENDING.value,
                                       WorkloadRow.submit_s >= bindparam("since_s"))
_NEXT_BACKOFF = select(func.min(WorkloadRow.not_before_s)).where(
    WorkloadRow.status == WorkloadStatus.PENDING.value, WorkloadRow.not_before_s > bindparam("now_s"))
_ACTIVE_IDS = (select(PodRow.workload_id, PodRow.id, WorkloadRow.priority)
               .join(WorkloadRow, WorkloadRow.id == PodRow.workload_id)
               .where(PodRow.status.in_(ACTIVE_POD_STATES)))
_ACTIVE_ROWS = (select(PodRow.workload_id, PodRow.id, PodRow.rank, PodRow.node, PodRow.slices,
                       PodRow.cpu_milli, PodRow.memory_mib, WorkloadRow.tenant,
                       WorkloadRow.priority, WorkloadRow.submit_s, WorkloadRow.admitted_s)
                .join(WorkloadRow, WorkloadRow.id == PodRow.workload_id)
                .where(PodRow.status.in_(ACTIVE_POD_STATES),
                       PodRow.workload_id.in_(bindparam("changed", expanding=True))))
_SPECS = select(WorkloadRow.id, WorkloadRow.spec).where(WorkloadRow.id.in_(bindparam("ids", expanding=True)))
_CORDONED = select(NodeFlagRow.name).where(NodeFlagRow.cordoned.is_(True))


@dataclass(frozen=True, slots=True)
class StoreView:
    snapshot: ClusterSnapshot
    pending: tuple[Workload, ...]
    quota: QuotaConfig
    next_backoff_s: float | None = None
    """When the next requeued workload's backoff ends (None: none waits on one)."""


class WorkloadCache:
    """Parsed core Workloads by id (specs are immutable, so each is parsed once), and the snapshot's
    allocations as last read, so a cycle reads in full only what changed since the last one."""

    def __init__(self) -> None:
        self._items: dict[str, Workload] = {}
        self._allocations: dict[str, tuple[tuple[str, ...], Allocation]] = {}
        """workload id -> (its active pod ids, the Allocation built from them)."""
        self._allocation_nodes: frozenset[str] = frozenset()
        self._revisions: dict[str, int] = {}
        """workload id -> its spec revision as read, for the few updated while pending."""
        self.pending = KeptPending()
        """The pending queue kept across full passes (loops/pending_queue.py)."""
        self._started: dict[str, Allocation] = {}
        """By workload: the allocations cached since the last `changes()` (not listed then)."""
        self._ended: dict[int, Allocation] = {}
        """By `id()`: the allocations listed at the last `changes()` and dropped since."""
        self._vouched = False
        """Whether `_started` and `_ended` hold every change since the last `changes()`."""
        self._serial = -1
        self.saturated = False
        """Whether the last full read took as many as it may: the next one lets tenants take turns."""

    def take(self, submitted: collections.deque[Workload]) -> None:
        """Adopt the Workloads the API parsed for submissions committed since the last call."""
        taken = []
        while True:
            try:
                workload = submitted.popleft()
            except IndexError:
                break
            self._items[workload.id] = workload
            taken.append(workload)
        if taken:
            self.pending.expect(taken)

    def take_left(self, left: collections.deque[str]) -> None:
        """Drop from the kept queue the pending work the API took out of pending since the last call."""
        while True:
            try:
                workload_id = left.popleft()
            except IndexError:
                return
            self.pending.left(workload_id)

    def requeued(self, workload_id: str) -> None:
        """This process has committed `workload_id`'s return to pending (a stop)."""
        workload = self._items.get(workload_id)
        if workload is not None:  # (else the next full pass finds it in its read)
            self.pending.expect((workload,))

    def changes(self) -> AllocationChanges | None:
        """What the cached allocations (the snapshot's, in workload-id order) gained and lost since
        the last call, numbered one after it; None when the cache cannot vouch for it (the first
        call, after a node change or `drop_allocations`): then the keeper compares in full."""
        started = tuple(self._started[w] for w in sorted(self._started))
        ended = tuple(self._ended.values())
        vouched = self._vouched
        self._started, self._ended, self._vouched = {}, {}, True
        if not vouched:
            self._serial = -1  # the keeper syncs this snapshot in full; the next one follows it
            return None
        self._serial += 1
        return AllocationChanges(self._serial, started, ended)

    def _cache(self, workload_id: str, pod_ids: tuple[str, ...], allocation: Allocation) -> None:
        self._uncache(workload_id)
        self._allocations[workload_id] = (pod_ids, allocation)
        self._started[workload_id] = allocation

    def _uncache(self, workload_id: str) -> None:
        old = self._allocations.pop(workload_id, None)
        if old is not None and self._started.pop(workload_id, None) is None:
            self._ended[id(old[1])] = old[1]
            if len(self._ended) > len(self._allocations) + MAX_CHANGES_SLACK:
                # no cycle took them for long (nothing pending): hand none rather than hold them
                self._started, self._ended, self._vouched = {}, {}, False

    def _unvouch(self) -> None:
        self._allocations.clear()
        self._vouched = False

    def admitted(self, workload: Workload, pod_ids: Sequence[str], placements: Sequence[PodPlacement],
                 start_time_s: float) -> None:
        """Note an allocation this process has just committed (pods `pod_ids`, in rank order), so
        the next snapshot need not read it back: it is used only while exactly these pods are the
        workload's active ones, on the same nodes as the cached allocations."""
        if not all(p.node in self._allocation_nodes for p in placements):
            self.pending.left(workload.id)
            return  # the next read sees it (and says why its placements are filtered)
        slices = tuple(
            PodPlacement(pod=p.pod, node=p.node, slices=tuple(
                Slice(device_index=s.device_index, compute_milli=s.compute_milli, memory_mib=s.memory_mib)
                for s in p.slices), cpu_milli=p.cpu_milli, memory_mib=p.memory_mib)
            for p in placements
        )
        self.pending.left(workload.id)
        self._cache(workload.id, tuple(sorted(pod_ids)), Allocation(
            workload=workload, placements=slices, start_time_s=start_time_s))

    def peek(self, row_id: str) -> Workload | None:
        """The parsed Workload of `row_id`, when this cache holds it."""
        return self._items.get(row_id)

    def forget_if_changed(self, row_id: str, revision: int) -> None:
        """Drop the parsed Workload of `row_id` when its spec's revision is no longer the one it was
        parsed from (the spec of pending work may be updated), and note the revision read."""
        if self._revisions.get(row_id, 0) != revision:
            self._items.pop(row_id, None)
        if revision or row_id in self._revisions:
            self._revisions[row_id] = revision

    def revision(self, row_id: str) -> int:
        """The spec revision of `row_id` as last read (0: never updated)."""
        return self._revisions.get(row_id, 0)

    def known(self, row_id: str, priority: int) -> Workload | None:
        found = self._items.get(row_id)
        return found if found is not None and found.priority == priority else None

    def get(self, row_id: str, spec: dict[str, Any], tenant: str, priority: int, submit_s: float) -> Workload:
        found = self.known(row_id, priority)
        if found is None:
            parsed = WorkloadSpec.model_validate(spec, context=STORED)  # as stored, whatever rules came since
            found = to_workload(row_id, parsed, tenant, priority, submit_s)
            self._items[row_id] = found
        return found

    def allocations(self) -> dict[str, tuple[tuple[str, ...], Allocation]]:
        """The allocations as last read or noted: workload id -> (its active pod ids, sorted; the
        Allocation built from them, whose placements leave out pods on nodes not listed then)."""
        return dict(self._allocations)

    @property
    def allocation_nodes(self) -> frozenset[str]:
        """The nodes the provider listed when the allocations were last read."""
        return self._allocation_nodes

    def drop_allocations(self) -> None:
        """Forget every allocation, so the next `load` reads them all from the store."""
        self._unvouch()

    def keep_only(self, ids: set[str]) -> None:
        for stale in set(self._items) - ids:
            del self._items[stale]
        for stale in set(self._revisions) - ids:
            del self._revisions[stale]


def load(rt: Runtime, cache: WorkloadCache, since_s: float | None = None,
         skip: frozenset[str] = frozenset(), limit: int = MAX_PENDING_PER_CYCLE,
         now_s: float | None = None, also: frozenset[str] = frozenset()) -> StoreView:
    """One read session; the provider's nodes are read first, outside it.

    With `since_s`, only pending work submitted at or after it is read (new arrivals), and of
    that only what is not in `skip` is read in full; at most `limit` pending workloads are read,
    first in the core's order, or, in a full read while more waits than that, each priority in turn
    with the tenants taking turns within it (`_taking_turns`). Specs are read only for workloads the cache
    has not parsed yet, and running work only for workloads whose active pods changed since the
    last call (the ids of every active pod are read each time). With `now_s`, a requeued workload
    whose backoff runs past it is not read (`StoreView.next_backoff_s` says when one ends).
    `also` names pending workloads read with the new arrivals (the head holding a reservation).
    """
    nodes = rt.refresh_nodes()
    CAPACITY.get(nodes)  # summarise a changed pool here, not on a submission's path
    cache.take(rt.submitted)
    cache.take_left(rt.left_pending)
    # held work and work waiting on a dependency are left out here, in the query (services/jobs.py,
    # loops/dependencies.py): the core never sees them
    params: dict[str, Any] = {}
    next_backoff: float | None = None
    with rt.store.read() as session:
        conn = session.connection()  # Core execution: none of the ORM's per-statement work
        if since_s is not None:
            recent = conn.scalars(_RECENT, {"since_s": since_s}).all()
            params["wanted"] = [*(i for i in recent if i not in skip), *also]
        if now_s is not None:
            if since_s is None:
                next_backoff = conn.scalar(_NEXT_BACKOFF, {"now_s": now_s})
            params["now_s"] = now_s
        arrivals, backoff = since_s is not None, now_s is not None
        turns = not arrivals and cache.saturated
        pending_rows = conn.execute(_pending_read(arrivals, backoff, limit, turns), params).all()
        if not arrivals:
            if not turns and len(pending_rows) >= limit:  # more waits than one read takes: read again
                turns = True
                pending_rows = conn.execute(_pending_read(False, backoff, limit, True), params).all()
            cache.saturated = len(pending_rows) >= limit
        limited = [r.id for r in pending_rows if r.array_limit is not None]
        if limited:  # tasks of arrays with a %N limit beyond the room their array has left
            held = throttled(conn, limited)
            pending_rows = [r for r in pending_rows if r.id not in held]
        active_ids = conn.execute(_ACTIVE_IDS).all()
        known_nodes = frozenset(n.name for n in nodes)
        changed = _changed_allocations(cache, active_ids, known_nodes)
        active = conn.execute(_ACTIVE_ROWS, {"changed": changed}).all() if changed else []
        for r in pending_rows:  # its spec was updated while pending (gpupool update)
            cache.forget_if_changed(r.id, r.revision)
        unparsed = {r.id for r in pending_rows if cache.known(r.id, r.priority) is None}
        unparsed.update(r.workload_id for r in active if cache.known(r.workload_id, r.priority) is None)
        specs: dict[str, Any] = {r.id: r.spec for r in conn.execute(
            _SPECS, {"ids": sorted(unparsed)})} if unparsed else {}
        quota = read_quota(conn)
        cordoned = set(conn.scalars(_CORDONED))
    nodes = tuple(replace(n, cordoned=True) if n.name in cordoned and not n.cordoned else n for n in nodes)
    pending = tuple(_workload(cache, r.id, specs, r.tenant, r.priority, r.submit_s) for r in pending_rows)
    allocations = _allocations(active, known_nodes, cache, specs)
    cache.keep_only({w.id for w in pending} | {a.workload.id for a in allocations} | skip)
    return StoreView(
        snapshot=ClusterSnapshot(nodes=nodes, allocations=allocations),
        pending=pending,
        quota=quota,
        next_backoff_s=next_backoff,
    )


def _workload(cache: WorkloadCache, row_id: str, specs: dict[str, Any], tenant: str, priority: int,
              submit_s: float) -> Workload:
    found = cache.known(row_id, priority)
    return found if found is not None else cache.get(row_id, specs[row_id], tenant, priority, submit_s)


def _changed_allocations(cache: WorkloadCache, active_ids: Any, known_nodes: frozenset[str]) -> list[str]:
    """Drop the cached allocations whose active pods (or workload priority) changed, and return the
    workloads to read in full: those, and those new since the last call."""
    if known_nodes != cache._allocation_nodes:  # a node came or went: placements are filtered by node
        cache._unvouch()
        cache._allocation_nodes = known_nodes
    current: dict[str, list[str]] = {}
    priorities: dict[str, int] = {}
    for workload_id, pod_id, priority in active_ids:
        current.setdefault(workload_id, []).append(pod_id)
        priorities[workload_id] = priority
    for workload_id in set(cache._allocations) - set(current):
        cache._uncache(workload_id)
    changed = []
    for workload_id, pod_ids in current.items():
        cached = cache._allocations.get(workload_id)
        if (cached is None or cached[0] != tuple(sorted(pod_ids))
                or cached[1].workload.priority != priorities[workload_id]):
            cache._uncache(workload_id)
            changed.append(workload_id)
    return changed


def _allocations(active: Any, known: frozenset[str], cache: WorkloadCache,
                 specs: dict[str, Any]) -> tuple[Allocation, ...]:
    """The snapshot's allocations: those cached, plus those built from `active` (changed ones)."""
    grouped: dict[str, list[Any]] = {}
    for row in active:
        grouped.setdefault(row.workload_id, []).append(row)
    for workload_id, rows in grouped.items():
        first = rows[0]
        workload = _workload(cache, workload_id, specs, first.tenant, first.priority, first.submit_s)
        placements = tuple(
            PodPlacement(pod=f"r{r.rank}", node=r.node, slices=tuple(Slice(**s) for s in r.slices),
                         cpu_milli=r.cpu_milli, memory_mib=r.memory_mib)
            for r in sorted(rows, key=lambda r: r.rank)
            if r.node in known
        )
        if len(placements) < len(rows):
            log.warning("workload %s holds pods on nodes the provider no longer lists", workload_id)
        allocation = Allocation(workload=workload, placements=placements,
                                start_time_s=first.admitted_s or 0.0)
        cache._cache(workload_id, tuple(sorted(r.id for r in rows)), allocation)
    return tuple(cache._allocations[w][1] for w in sorted(cache._allocations))
