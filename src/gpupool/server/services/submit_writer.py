"""Group commit for submissions: one writer thread stores those of concurrent requests in one transaction.

A request validates its spec on the event loop, hands the rows to the writer and awaits the
outcome; the writer takes every submission waiting at that moment (up to MAX_BATCH), checks their
queues and quotas with one query and their tenants' pending counts against max_pending with
another (under a row lock on the tenants, so several server processes cannot overshoot together),
inserts the workloads and their `submitted` events with two multi-row statements and commits once.
A request is answered only after the commit that holds it, so an acknowledged submission survives
a kill -9 (SQLite WAL with synchronous=NORMAL loses nothing on a process crash; PostgreSQL commits
are durable). The event loop never waits on the store or on
its write lock, so one slow transaction of the scheduler no longer stalls every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BindParameter, Connection, bindparam, case, func, insert, select

from gpupool.core.model import Workload, WorkloadStatus
from gpupool.core.units import MILLI
from gpupool.errors import (
    GpupoolError,
    NotFound,
    QuotaExceeded,
    StoreUnavailable,
    TooManyPending,
    did_you_mean,
)
from gpupool.server.orm import Base, QueueRow, TenantRow, WorkloadRow
from gpupool.server.runtime import Runtime

log = logging.getLogger("gpupool.submit")

MAX_BATCH = 512
_INSERT_WORKLOAD = insert(Base.metadata.tables["workloads"])
_INSERT_EVENT = insert(Base.metadata.tables["events"])


@dataclass(slots=True)
class Submission:
    """What one request stores as pending, all or nothing: one workload (or every task of an
    array), their `submitted` events, and who waits for the outcome."""

    id: str
    """The id the request is answered with: the workload's, or the array's."""
    tenant: str
    queue: str
    device_milli: int
    """What each of its workloads asks for (the tasks of an array ask alike)."""
    workloads: list[dict[str, Any]]
    events: list[dict[str, Any]]
    parsed: list[Workload]
    """The core Workloads of `workloads` (handed to the scheduler once committed)."""
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future[None] | None = None
    error: BaseException | None = None
    also: Callable[[Connection], None] | None = None
    """Rows that belong with it, written in its transaction once it is accepted (a service's replica)."""


def _check(item: Submission, quotas: dict[tuple[str, str], int | None]) -> BaseException | None:
    """Why this submission cannot be stored (unknown queue, over its quota), or None."""
    key = (item.tenant, item.queue)
    if key not in quotas:
        names = sorted(q for t, q in quotas if t == item.tenant)
        if not names:  # every tenant has its default queue: none means no such tenant
            return NotFound(f"No tenant {item.tenant!r}; list the tenants with `gpupool tenant ls`.",
                            tenant=item.tenant, queue=item.queue)
        return NotFound(
            f"Tenant {item.tenant!r} has no queue {item.queue!r}.{did_you_mean(item.queue, names)} "
            f"Known queues: {', '.join(names)}.",
            tenant=item.tenant, queue=item.queue,
        )
    limit = quotas[key]
    if limit is not None and item.device_milli > limit:
        return QuotaExceeded(
            f"The workload asks for {item.device_milli / MILLI:g} GPUs but queue "
            f"{item.tenant}/{item.queue} may hold at most {limit / MILLI:g}; "
            "ask for less or raise the quota.",
            requested_gpus=item.device_milli / MILLI, quota_gpus=limit / MILLI,
        )
    return None


_TENANTS: BindParameter[list[str]] = bindparam("tenants", expanding=True)
_OWN_CAP = case((QueueRow.cohort == "", QueueRow.quota_device_milli), else_=None)
"""A queue's quota is refused at submit only outside a cohort: inside one it may borrow, and the
core refuses (for good, with the reason) what the queue with its borrowing could never hold."""
_PENDING = (select(WorkloadRow.tenant, func.count().label("n"))
            .where(WorkloadRow.tenant.in_(_TENANTS), WorkloadRow.status == WorkloadStatus.PENDING.value)
            .group_by(WorkloadRow.tenant).subquery())
_QUEUES_AND_ROOM = (
    select(QueueRow.tenant, QueueRow.name, _OWN_CAP, TenantRow.max_pending,
           func.coalesce(_PENDING.c.n, 0))
    .join(TenantRow, TenantRow.name == QueueRow.tenant)
    .outerjoin(_PENDING, _PENDING.c.tenant == QueueRow.tenant)
    .where(QueueRow.tenant.in_(_TENANTS)))
"""Every queue of the batch's tenants with its quota, and its tenant's max_pending and pending count."""


_PG_LOCK = "SELECT name FROM tenants WHERE name = ANY(%(tenants)s) ORDER BY name FOR UPDATE"
"""Lock the batch's tenants in name order (concurrent writers queue, never deadlock)."""
_PG_ROOM = (
    "SELECT q.tenant, q.name, CASE WHEN q.cohort = '' THEN q.quota_device_milli END, t.max_pending, "
    "coalesce(p.n, 0) "
    "FROM queues q JOIN tenants t ON t.name = q.tenant "
    "LEFT JOIN (SELECT tenant, count(*) AS n FROM workloads WHERE tenant = ANY(%(tenants)s) "
    "AND status = %(pending)s GROUP BY tenant) p ON p.tenant = q.tenant "
    "WHERE q.tenant = ANY(%(tenants)s)"
)
"""_QUEUES_AND_ROOM as psycopg text: SQLAlchemy cannot run inside a psycopg pipeline (it reads a
result's description before the pipeline syncs), so the PostgreSQL path writes the read out."""


def _pg_locked_queues_and_room(conn: Connection, tenants: list[str]) -> list[Any]:
    """PostgreSQL: the lock and the read sent together in one psycopg pipeline (one round trip
    instead of two; the server still runs the read after the lock is granted, with a snapshot of
    its own, so the count holds every submission committed before the lock)."""
    raw: Any = conn.connection.driver_connection
    with raw.cursor() as lock, raw.cursor() as read:
        with raw.pipeline():
            lock.execute(_PG_LOCK, {"tenants": tenants})
            read.execute(_PG_ROOM, {"tenants": tenants, "pending": WorkloadStatus.PENDING.value})
        return list(read.fetchall())


def _queues_and_room(conn: Connection, tenants: list[str]
                     ) -> tuple[dict[tuple[str, str], int | None], dict[str, tuple[int, int]]]:
    """Quotas by (tenant, queue) and each tenant's (pending now, max_pending), in one query.

    On PostgreSQL the tenants' rows are locked first, in a statement of their own, so that the
    count (read by the next statement, with a fresh snapshot) already holds every submission a
    concurrent writer committed before us; SQLite's write transaction is exclusive anyway."""
    if conn.dialect.name == "postgresql":  # the only other store Settings accepts
        rows = _pg_locked_queues_and_room(conn, tenants)
    else:
        rows = list(conn.execute(_QUEUES_AND_ROOM, {"tenants": tenants}))
    quotas: dict[tuple[str, str], int | None] = {}
    room: dict[str, tuple[int, int]] = {}
    for tenant, queue_name, quota, max_pending, pending in rows:
        quotas[(tenant, queue_name)] = quota
        room[tenant] = (int(pending), int(max_pending))
    return quotas, room


def pending_room(conn: Connection, tenant: str) -> tuple[int, int] | None:
    """(pending now, max_pending) of `tenant`, counted as a submission counts it: after its row is
    locked (PostgreSQL), so a concurrent writer's count waits for this transaction. None for a
    tenant with no queue (so none it could submit to)."""
    return _queues_and_room(conn, [tenant])[1].get(tenant)


def max_pending_fix(tenant: str) -> str:
    """What a tenant at its max_pending may do, as every refusal of it says."""
    return ("wait until some start or cancel some, or ask the admin "
            f"(gpupool tenant set {tenant} --max-pending N)")


def _too_many(tenant: str, limit: int, pending: int, count: int) -> TooManyPending:
    fix = max_pending_fix(tenant)
    if count == 1:
        return TooManyPending(f"Tenant {tenant} already has {limit} pending workloads, its limit; {fix}.",
                              tenant=tenant, max_pending=limit)
    return TooManyPending(
        f"This array's {count} tasks would take tenant {tenant} to {pending + count} pending workloads, "
        f"above its limit of {limit}, so none was submitted; submit fewer tasks, {fix}.",
        tenant=tenant, max_pending=limit, pending=pending, tasks=count)


class SubmitWriter:
    """The one thread that writes submissions; started on first use, stopped with the app."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._queue: queue.SimpleQueue[Submission | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.batches = 0
        """Transactions committed so far (for tests and benchmarks)."""

    async def store(self, item: Submission) -> None:
        """Store `item` and return once it is committed; raises why it was refused."""
        item.loop = asyncio.get_running_loop()
        item.future = item.loop.create_future()
        self._put(item)
        await item.future

    def _put(self, item: Submission) -> None:
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="gpupool-submit-writer",
                                                    daemon=True)
                    self._thread.start()
        self._queue.put(item)

    def stop(self) -> None:
        """Store what is queued, then end the thread. Idempotent."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stopping = False
            while len(batch) < MAX_BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stopping = True
                    break
                batch.append(more)
            self._commit(batch)
            if stopping:
                return

    def _commit(self, batch: Sequence[Submission]) -> None:
        commit(self.rt, batch)
        self.batches += 1
        for item in batch:
            _settle(item)


def commit(rt: Runtime, batch: Sequence[Submission]) -> int:
    """Store what may be stored of `batch` in one transaction; each refused or failed item gets its
    `error`. Returns how many were stored (and wakes the scheduler when any were)."""
    accepted: list[Submission] = []
    try:
        with rt.store.write() as session:
            conn = session.connection()  # Core statements: none of the ORM's per-statement work
            tenants = sorted({item.tenant for item in batch})
            quotas, room = _queues_and_room(conn, tenants)
            for item in batch:
                item.error = _check(item, quotas)
                if item.error is None:
                    pending, limit = room.get(item.tenant, (0, 0))
                    count = len(item.workloads)
                    if pending + count > limit:  # an array is all or nothing
                        item.error = _too_many(item.tenant, limit, pending, count)
                    else:
                        room[item.tenant] = (pending + count, limit)
                        accepted.append(item)
            if accepted:
                conn.execute(_INSERT_WORKLOAD, [row for item in accepted for row in item.workloads])
                conn.execute(_INSERT_EVENT, [event for item in accepted for event in item.events])
                for item in accepted:
                    if item.also is not None:
                        item.also(conn)
    except Exception as exc:  # the store's own error: nothing of this batch was stored
        # the store logs its own failures, once each; a refusal raised in the transaction is no failure
        if not isinstance(exc, (StoreUnavailable, GpupoolError)):
            log.warning("storing %d submission(s) failed: %s", len(batch), exc)
        for item in batch:  # also those not yet checked when it failed: none may be acknowledged
            if item.error is None:
                item.error = exc
        return 0
    if accepted:
        rt.submitted.extend(workload for item in accepted for workload in item.parsed)
        if any(item.workloads[0].get("waiting_on") for item in accepted):
            rt.dependencies_changed.set()  # committed: the loop's dependency pass finds these rows
        rt.wake.set()
    return len(accepted)


def _settle(item: Submission) -> None:
    if item.loop is None or item.future is None:
        return
    with contextlib.suppress(RuntimeError):  # a closed event loop: nobody is left to answer
        item.loop.call_soon_threadsafe(_resolve, item.future, item.error)


def _resolve(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
