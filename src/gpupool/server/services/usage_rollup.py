"""The daily usage rollup: the metered usage of ended pods summed per UTC day, tenant, queue, priority
class, node, device model, simulated mark and service (table usage_daily_services), so a usage query
over a long window reads a few summed rows instead of every pod.

A pod that ended is folded into the rollup (`fold`, from the control loop: every 30 s while it is
idle, every 5 minutes while work is in flight) and marked `rolled_up` in the same transaction; a
pod's interval never changes once it ended, and a query reads the unmarked ones from the pods. Pieces
are priced when folded, by the same `core.metering.aggregate` the raw path uses; the rollup keeps
the digest of the price book (and default priority class) it was priced with, and is rebuilt from
the pod rows when that changes.

Counting distinct pods over summed rows: a pod sits in one row per day and per device model it
held. Each row counts its pods (`pods`), those already running at the day's start (`carried`),
and those for which the row's model is the pod's first (by name) among its models of the same
simulated mark (`first_model`) or among all (`first`). Summing days [D0, D1), a pod is counted
once at its first day there: sum(count) - sum(carried over days after D0).
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, bindparam, case, delete, func, insert, select, update
from sqlalchemy.orm import Session

from gpupool.core.metering import DAY_S, PodInterval, PriceBook, UsageKey, UsageRow, aggregate
from gpupool.server.db import insert_ignoring
from gpupool.server.orm import (
    Base,
    PodRow,
    RetiredPodRow,
    UsageDailyServiceRow,
    UsageRollupStateRow,
    WorkloadRow,
)
from gpupool.server.runtime import Runtime
from gpupool.server.services.metering import interval_rows, retired_rows, to_intervals

_PODS = Base.metadata.tables["pods"]
_RETIRED = Base.metadata.tables["retired_pods"]
FOLD_EVERY_S = 30.0
FOLD_BUSY_EVERY_S = 300.0
FOLD_BATCH = 5_000
"""Pods folded in one transaction at most (the rest at the next steps)."""
_ALL_KEYS = (UsageKey.TENANT, UsageKey.QUEUE, UsageKey.PRIORITY_CLASS, UsageKey.NODE, UsageKey.MODEL,
             UsageKey.DAY, UsageKey.SERVICE)
LAYOUT = "usage_daily_services"
"""Part of the digest: a rollup the last release made (in usage_daily, by another digest) is
rebuilt into usage_daily_services once, as after a change of prices."""
_COUNTS = ("pods", "pods_carried", "pods_first_model", "pods_carried_first_model", "pods_first",
           "pods_carried_first")
_SUMS = ("compute_milli_s", "memory_mib_s", "cost", "dedicated_cost", "unpriced")


def digest(book: PriceBook, default_class: str) -> str:
    """What the rolled-up costs depend on besides the pods (another digest means rebuild), in a
    canonical form: the same prices give the same digest whatever order they were loaded in."""
    versions = [[v.effective_from_s, sorted(v.device_prices.items()), v.fallback_price,
                 sorted(v.class_multipliers.items()), [[t.start_s, t.end_s, t.multiplier] for t in v.tiers],
                 v.share.value, v.compute_weight] for v in book.versions]
    text = json.dumps([LAYOUT, book.currency, default_class, versions], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class UsageRollup:
    """Keeps usage_daily_services up to date; `lock` is held by a reader combining the rollup with the pods
    it does not hold, so a fold cannot mark pods between its two reads."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._last_fold = -math.inf
        self._backlog = False

    def maybe_fold(self, rt: Runtime, busy: bool = False) -> int:
        """fold() when due: every FOLD_EVERY_S (monotonic time) while the loop is idle, every
        FOLD_BUSY_EVERY_S while work is in flight (a usage query reads what is not folded yet from
        the pods, so folding can wait for a quiet moment); the pods folded."""
        if self._backlog:  # the last fold left pods for the next: go on now, or soon while busy
            every = FOLD_EVERY_S if busy else 0.0
        else:
            every = FOLD_BUSY_EVERY_S if busy else FOLD_EVERY_S
        if time.monotonic() - self._last_fold < every:
            return 0
        self._last_fold = time.monotonic()
        return self.fold(rt)

    def fold(self, rt: Runtime, tenant: str | None = None) -> int:
        """Add the pods that ended and are not rolled up yet to the rollup (and mark them), rebuilding
        it first when the price book changed; returns how many pods were folded (those that never
        started are marked too, with nothing to add), FOLD_BATCH at most. `tenant`: only its pods."""
        from gpupool.server.services.specs import default_priority_class

        book = rt.config.prices.price_book()
        default_class = default_priority_class(rt.config.priority_classes) or ""
        wanted = digest(book, default_class)
        with self.lock, rt.store.write() as session:
            state = _locked_state(session, wanted)
            conn = session.connection()
            if state.prices_sha256 != wanted:  # rebuilt from the pods, deleted tenants' kept ones too
                session.execute(delete(UsageDailyServiceRow))
                for table in (_PODS, _RETIRED):
                    conn.execute(update(table).where(table.c.rolled_up.is_(True)).values(rolled_up=False))
                state.prices_sha256 = wanted
            ended = select(PodRow.id).where(PodRow.rolled_up.is_(False), PodRow.finished_s.is_not(None))
            if tenant is not None:
                theirs = select(WorkloadRow.id).where(WorkloadRow.tenant == tenant)
                ended = ended.where(PodRow.workload_id.in_(theirs))
            ids = list(session.scalars(ended.limit(FOLD_BATCH)))
            retired: list[str] = []
            if tenant is None and len(ids) < FOLD_BATCH:  # a deleted tenant's, after a change of prices
                retired = list(session.scalars(select(RetiredPodRow.id).where(
                    RetiredPodRow.rolled_up.is_(False)).limit(FOLD_BATCH - len(ids))))
            if not ids and not retired:
                if tenant is None:  # (a tenant's fold says nothing of the others' backlog)
                    self._backlog = False
                return 0
            rows = [*session.execute(interval_rows().where(PodRow.id.in_(ids))).all(),
                    *session.execute(retired_rows().where(RetiredPodRow.id.in_(retired))).all()]
            intervals = to_intervals(rt, rows, now=rt.clock(), default_class=default_class)
            _add(session, pieces(intervals, book))
            marked = sum(conn.execute(update(table).where(
                table.c.id.in_(chosen), table.c.rolled_up.is_(False)).values(rolled_up=True)).rowcount
                for table, chosen in ((_PODS, ids), (_RETIRED, retired)) if chosen)
            ids += retired
            if marked != len(ids):  # another fold marked some meanwhile (the state row's lock forbids it)
                raise RuntimeError(f"usage rollup: {len(ids) - marked} of {len(ids)} pods were folded "
                                   "by another server at the same time; nothing of this fold was kept")
        if tenant is None:
            self._backlog = len(ids) == FOLD_BATCH
        return len(ids)


def _locked_state(session: Session, wanted: str) -> UsageRollupStateRow:
    """The rollup's one state row, locked until the transaction ends: several servers share a store
    (the leader's loop folds, any server folds before it deletes a tenant), and a fold that reads the
    pods not rolled up must not run beside another that would add the same pods again. Made first where
    there is none yet (priced as `wanted`: nothing was folded), by whichever server comes first."""
    conn = session.connection()
    conn.execute(insert_ignoring(conn, UsageRollupStateRow.__table__).values(id=1, prices_sha256=wanted))
    state = session.get(UsageRollupStateRow, 1, with_for_update=True, populate_existing=True)
    assert state is not None  # made above, and never deleted
    return state


@dataclass(slots=True)
class Piece:
    """One usage_daily_services row's worth of usage, to add to the stored row with the same key."""

    key: tuple[float, str, str, str, str, str, bool, str]
    sums: tuple[float, float, float, float, int]
    counts: tuple[int, int, int, int, int, int]


def pieces(intervals: Sequence[PodInterval], book: PriceBook) -> list[Piece]:
    """The rollup rows of `intervals` (closed pods), with their counts, priced by `book`."""
    by_pod = {i.pod_id: i for i in intervals}
    out = []
    for row in aggregate(intervals, book, _ALL_KEYS):
        keys = row.keys
        day_s = _day_start(next(by_pod[p] for p in row.pods).start_s, keys[UsageKey.DAY])
        counts = [0] * 6
        for pod_id in row.pods:
            interval = by_pod[pod_id]
            carried = interval.start_s < day_s
            models = sorted(s.model for s in interval.slices if s.simulated == row.simulated)
            pairs = sorted((s.simulated, s.model) for s in interval.slices)
            first_model = models[0] == keys[UsageKey.MODEL]
            first = pairs[0] == (row.simulated, keys[UsageKey.MODEL])
            for index, counted in enumerate((True, first_model, first)):
                if counted:
                    counts[2 * index] += 1
                    counts[2 * index + 1] += carried
        out.append(Piece(
            (day_s, keys[UsageKey.TENANT], keys[UsageKey.QUEUE], keys[UsageKey.PRIORITY_CLASS],
             keys[UsageKey.NODE], keys[UsageKey.MODEL], row.simulated, keys[UsageKey.SERVICE]),
            (row.compute_milli_s, row.memory_mib_s, row.cost, row.dedicated_cost, 0 if row.priced else 1),
            (counts[0], counts[1], counts[2], counts[3], counts[4], counts[5])))
    return out


def _day_start(any_time_s: float, day: str) -> float:
    """The epoch second of `day`'s midnight (UTC), found near a time known to be on or before it."""
    from gpupool.core.metering import day_of

    start = math.floor(any_time_s / DAY_S) * DAY_S
    while day_of(start) != day:
        start += DAY_S
    return start


_DAILY = Base.metadata.tables["usage_daily_services"]
_KEYS = ("day_s", "tenant", "queue", "priority_class", "node", "model", "simulated", "service")
_UPDATE = (update(_DAILY)
           .where(*(_DAILY.c[k] == bindparam(f"k_{k}") for k in _KEYS))
           .values({name: _DAILY.c[name] + bindparam(f"v_{name}") for name in (*_SUMS, *_COUNTS)}))


def _add(session: Session, new: Iterable[Piece]) -> None:
    """Add each piece to its stored row (one statement for the new rows, one for the others)."""
    by_key = {p.key: p for p in new}
    if not by_key:
        return
    conn = session.connection()
    days = sorted({k[0] for k in by_key})
    existing = {tuple(r) for r in conn.execute(select(*(_DAILY.c[k] for k in _KEYS))
                                               .where(_DAILY.c.day_s.in_(days)))}
    inserts, updates = [], []
    for key, piece in by_key.items():
        values = dict(zip((*_SUMS, *_COUNTS), (*piece.sums, *piece.counts), strict=True))
        if key in existing:
            updates.append({**{f"k_{k}": v for k, v in zip(_KEYS, key, strict=True)},
                            **{f"v_{k}": v for k, v in values.items()}})
        else:
            inserts.append({**dict(zip(_KEYS, key, strict=True)), **values})
    if inserts:
        conn.execute(insert(_DAILY), inserts)
    if updates:
        conn.execute(_UPDATE, updates)


@dataclass(slots=True)
class RolledUp:
    """What the rollup holds of a window's whole days: usage rows (their `pods` set empty) with the
    distinct pods of each counted, and the count for the total; `usable` False when the rollup was
    priced with another book (then nothing is read from it, and no pod counts as rolled up)."""

    rows: dict[tuple[object, ...], tuple[UsageRow, int]]
    total_pods: int
    usable: bool


def read(session: Session, wanted: str, by: Sequence[UsageKey], first_day_s: float, end_day_s: float,
         tenant: str | None) -> RolledUp:
    """The rollup's usage of the days [first_day_s, end_day_s), grouped by `by` and the simulated
    mark; nothing (and no watermark) when the rollup was priced with another book."""
    # shared-locked until the reader's transaction ends: a fold on another server (which locks it for
    # update) then lands wholly before the reader's reads or wholly after them, never between its read
    # of the rollup and its read of the pods not rolled up (a pod counted in neither, or in both)
    state = session.get(UsageRollupStateRow, 1, with_for_update={"read": True})
    if state is None or state.prices_sha256 != wanted:
        return RolledUp({}, 0, False)
    t = UsageDailyServiceRow
    columns = {UsageKey.TENANT: t.tenant, UsageKey.QUEUE: t.queue, UsageKey.MODEL: t.model,
               UsageKey.PRIORITY_CLASS: t.priority_class, UsageKey.NODE: t.node, UsageKey.DAY: t.day_s,
               UsageKey.SERVICE: t.service}
    group = [columns[k] for k in by] + [t.simulated]
    suffix = "" if UsageKey.MODEL in by else "_first_model"
    count = _count(suffix, by_day=UsageKey.DAY in by, first_day_s=first_day_s)
    where = [t.day_s >= first_day_s, t.day_s < end_day_s]
    if tenant is not None:
        where.append(t.tenant == tenant)
    sums = [func.sum(getattr(t, name)) for name in _SUMS]
    rows: dict[tuple[object, ...], tuple[UsageRow, int]] = {}
    for record in session.execute(select(*group, *sums, count).where(*where).group_by(*group)):
        values = list(record)
        keys = {k.value: _key_text(k, v) for k, v in zip(by, values, strict=False)}
        simulated = bool(values[len(by)])
        compute, memory, cost, dedicated, unpriced, pods = values[len(by) + 1:]
        usage = UsageRow(keys, simulated, float(compute), float(memory), float(cost), float(dedicated),
                         priced=int(unpriced) == 0)
        rows[(*keys.values(), simulated)] = (usage, int(pods))
    total = session.execute(select(_count("_first", by_day=False, first_day_s=first_day_s)).where(*where))
    return RolledUp(rows, int(total.scalar() or 0), True)


def _count(suffix: str, *, by_day: bool, first_day_s: float) -> ColumnElement[Any]:
    counted = getattr(UsageDailyServiceRow, "pods" + suffix)
    if by_day:
        return func.sum(counted)
    carried = getattr(UsageDailyServiceRow, "pods_carried" + suffix)
    return func.sum(counted) - func.sum(case((UsageDailyServiceRow.day_s > first_day_s, carried), else_=0))


def _key_text(key: UsageKey, value: Any) -> str:
    from gpupool.core.metering import day_of

    return day_of(float(value)) if key is UsageKey.DAY else str(value)

