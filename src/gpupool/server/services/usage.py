"""Usage and chargeback for the API: the window's whole UTC days read from the daily rollup, the rest
(its partial first and last days, and pods not rolled up yet: running or just ended) metered from
the pod rows, and the two merged into the rows `metering.raw_usage` would give.

A pod in the rollup is metered here only for its parts outside the whole days; counting distinct
pods, one the rollup counts (it has a part in the whole days) is not counted again.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from sqlalchemy import or_

from gpupool.api.usage import UsageOut
from gpupool.core.metering import DAY_S, PodInterval, UsageKey, UsageRow, aggregate, totals
from gpupool.server.auth import Principal
from gpupool.server.orm import PodRow, RetiredPodRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import usage_rollup
from gpupool.server.services.metering import overlapping, parse_by, raw_usage, row_out, to_intervals, window
from gpupool.server.services.specs import default_priority_class
from gpupool.server.services.tenants import made_s, require_tenant

Merged = dict[tuple[object, ...], tuple[UsageRow, int]]


def usage(rt: Runtime, who: Principal, *, tenant: str | None, since_s: float | None, until_s: float | None,
          by: str) -> UsageOut:
    """Usage and cost in [since_s, until_s) (default: the last 30 days to now), grouped by `by`; a
    tenant token sees only its own tenant's (naming another is Forbidden). The admin naming a tenant
    that does not exist gets NotFound unless the window holds usage under that name (a deleted
    tenant's, which stays)."""
    out = _usage(rt, who, tenant=tenant, since_s=since_s, until_s=until_s, by=by)
    if tenant is not None and who.is_admin and not out.rows:
        with rt.store.read() as session:
            require_tenant(session, tenant, also=", and no usage under that name in the window")
    return out


def _usage(rt: Runtime, who: Principal, *, tenant: str | None, since_s: float | None, until_s: float | None,
           by: str) -> UsageOut:
    scope = who.tenant_for(tenant) if not who.is_admin else tenant
    now = rt.clock()  # before the window's default end, which is then at or after it
    since, until = window(rt, since_s, until_s)
    if scope is not None and not who.is_admin:
        # a tenant's usage starts when it was made: what a deleted tenant of the same name used
        # before (kept in the rollup under that name, for the admin) is another's
        with rt.store.read() as session:
            since = max(since, made_s(session, scope))
    keys = parse_by(by)
    if since >= until:  # made after the window
        book = rt.config.prices.price_book()
        return UsageOut(since_s=until, until_s=until, by=[k.value for k in keys], currency=book.currency,
                        rows=[], total=row_out(totals([]), 0))
    # Every piece the rollup holds ended by now (only ended pods are folded), so for a window that
    # reaches now its last day's rows lie inside the window whole, and are read from the rollup as
    # the days before it are: the pod rows of a tenant deleted today are gone, and its usage of
    # today was read from them (`usage` missed it while an invoice showed it).
    end_day = (math.ceil if until >= now else math.floor)(until / DAY_S) * DAY_S
    first_day = math.ceil(since / DAY_S) * DAY_S
    if end_day <= first_day:  # no whole day
        return raw_usage(rt, who, tenant=tenant, since_s=since, until_s=until, by=by)
    book = rt.config.prices.price_book()
    default_class = default_priority_class(rt.config.priority_classes) or ""
    wanted = usage_rollup.digest(book, default_class)
    with rt.usage_rollup.lock, rt.store.read() as session:
        rolled = usage_rollup.read(session, wanted, keys, first_day, end_day, scope)
        query, retired = overlapping(since, until, scope)  # the pods, and a deleted tenant's kept ones
        if rolled.usable:
            query, retired = (q.where(or_(t.rolled_up.is_(False), t.started_s < first_day,
                                          t.finished_s > end_day))
                              for q, t in ((query, PodRow), (retired, RetiredPodRow)))
        rows = [*session.execute(query).all(), *session.execute(retired).all()]
    intervals: list[PodInterval] = []
    elsewhere: set[str] = set()  # rolled-up pods with a part in the whole days: the rollup counts them
    for row, interval in zip(rows, to_intervals(rt, rows, now=now, default_class=default_class), strict=True):
        if not (rolled.usable and row.rolled_up):
            intervals.append(interval)
            continue
        intervals += _outside(interval, first_day, end_day)
        if interval.start_s < end_day and interval.end_s > first_day:
            elsewhere.add(interval.pod_id)
    raw = aggregate(intervals, book, keys, since, until)
    by_day = UsageKey.DAY in keys
    merged, raw_pods = _merge(raw, rolled.rows, set() if by_day else elsewhere)
    ordered = [merged[k] for k in sorted(merged, key=lambda k: tuple(str(part) for part in k))]
    total = totals([u for u, _ in ordered])  # its pod count is worked out below
    pods = rolled.total_pods + len(raw_pods - elsewhere)
    return UsageOut(since_s=since, until_s=until, by=[k.value for k in keys], currency=book.currency,
                    rows=[row_out(u, n) for u, n in ordered], total=row_out(total, pods))


def _outside(interval: PodInterval, first_day: float, end_day: float) -> list[PodInterval]:
    """The parts of a rolled-up pod's interval before the first whole day and from the end day on."""
    parts = []
    if interval.start_s < first_day:
        parts.append(dataclasses.replace(interval, end_s=min(interval.end_s, first_day)))
    if interval.end_s > end_day:
        parts.append(dataclasses.replace(interval, start_s=max(interval.start_s, end_day)))
    return parts


def _merge(raw: Sequence[UsageRow], rolled: Merged, elsewhere: set[str]) -> tuple[Merged, set[str]]:
    """The rollup's rows plus the raw rows (their pods counted but for those in `elsewhere`); and
    every raw pod."""
    merged: Merged = {key: (dataclasses.replace(row), count) for key, (row, count) in rolled.items()}
    every: set[str] = set()
    for row in raw:
        key = (*row.keys.values(), row.simulated)
        every |= row.pods
        extra = len(row.pods - elsewhere)
        if key not in merged:
            merged[key] = (row, extra)
            continue
        into, count = merged[key]
        into.compute_milli_s += row.compute_milli_s
        into.memory_mib_s += row.memory_mib_s
        into.cost += row.cost
        into.dedicated_cost += row.dedicated_cost
        into.priced = into.priced and row.priced
        merged[key] = (into, count + extra)
    return merged, every
