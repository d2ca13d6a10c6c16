"""Tenant budgets live: each budgeted tenant's spend this period from the pod rows, the exhausted set
the scheduler admits with, and the warning at the warn fraction (once per period per tenant).

Cheap by construction: at most one refresh every REFRESH_S of the server's clock, none at all while
no tenant has a budget, and incremental like the /metrics usage counters: pods that ended before a
watermark (a minute ago) are folded into kept totals once (read through the index on
`pods.finished_s`); only pods still open or ended since are priced afresh.

A pod may be closed late, at an end already behind the watermark: recovery (after a restart, or a
takeover in a follower's running process, whose tracker has refreshed all along) closes a stopping
pod at the time the provider says it ended. So the tracker remembers the pods it read open, and
reads again by id those no longer open: each is folded once at its recorded end, whatever that end,
and the spend then drops to what the pod really held (the figure `gpupool usage` bills), never to
nothing. Its part before the period's start is not in the spend, as for any pod.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, or_, select

from gpupool.api.tenants import TenantUpdate
from gpupool.core.budgets import Budget, BudgetPeriod, SpendLedger, exhausted
from gpupool.core.metering import PodInterval, PriceBook
from gpupool.money import money
from gpupool.server.orm import AuditRow, PodRow, TenantRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.metering import device_map, held

log = logging.getLogger(__name__)

REFRESH_S = 5.0
"""The scheduler sees a budget spent at most this long after it was (plus a pod's settle time)."""
SETTLE_S = 60.0
"""A pod that ended this long ago is in the kept totals (its row committed long since)."""
WARNING_ACTION = "tenant.budget_warning"
ACTOR = "gpupool"
"""The audit log's actor for what the server does on its own."""


@dataclass(frozen=True, slots=True)
class TenantSpend:
    budget: Budget
    period_start_s: float
    spent: float

    @property
    def ratio(self) -> float:
        return self.spent / self.budget.amount if self.budget.amount > 0 else 1.0


@dataclass(slots=True)
class BudgetTracker:
    """One server process's view of every budgeted tenant's spend (see the module docstring)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    book: PriceBook | None = None
    ledger: SpendLedger | None = None
    made: dict[str, float] = field(default_factory=dict)
    """When each budgeted tenant was made, as last read: a tenant deleted and made again starts anew."""
    watermark_s: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per tenant: (its period's start, a time): its pods that ended in between are in the kept total."""
    spend: dict[str, TenantSpend] = field(default_factory=dict)
    open_ids: frozenset[str] = frozenset()
    """The pods read open at the last refresh: any of them closed since is read again by id, however
    far back its end (see the module docstring)."""
    exhausted: frozenset[str] = frozenset()
    warned: set[tuple[str, float]] = field(default_factory=set)
    next_refresh_s: float = float("-inf")

    def invalidate(self) -> None:
        """A budget changed: the next call refreshes whatever the time."""
        with self.lock:
            self.next_refresh_s = float("-inf")

    def exhausted_tenants(self, rt: Runtime) -> frozenset[str]:
        """The tenants whose new work waits (refreshed when due)."""
        self.refresh(rt)
        return self.exhausted

    def spent(self, rt: Runtime) -> dict[str, TenantSpend]:
        """Every budgeted tenant's budget and spend this period (refreshed when due)."""
        self.refresh(rt)
        return dict(self.spend)

    def refresh(self, rt: Runtime) -> None:
        now = rt.clock()
        with self.lock:
            if now < self.next_refresh_s:
                return
            self.next_refresh_s = now + REFRESH_S
            budgets, made = _budgets(rt)
            before = self.exhausted
            if not budgets:  # the kept totals too: a budget set again folds its period from its start
                self.spend, self.exhausted, self.watermark_s = {}, frozenset(), {}
                self.ledger, self.made, self.open_ids = None, {}, frozenset()
            else:
                for tenant in [t for t in budgets if self.made.get(t, made[t]) != made[t]]:
                    self.watermark_s.pop(tenant, None)  # deleted and made again: another tenant's totals
                    if self.ledger is not None:
                        self.ledger.periods.pop(tenant, None)
                self.made = made
                self._meter(rt, budgets, now)
        if before - self.exhausted:
            rt.capacity_may_have_changed()  # a new period, a raised budget: its work may start now
        if budgets:
            self._warn(rt, now)

    def _meter(self, rt: Runtime, budgets: dict[str, Budget], now: float) -> None:
        book = rt.config.prices.price_book() if self.book is None else self.book
        if self.ledger is None:
            self.book, self.ledger = book, SpendLedger(book)
        ledger = self.ledger
        starts = {t: ledger.period(t, b, now) for t, b in budgets.items()}
        marks = {}
        for tenant, start in starts.items():
            kept = self.watermark_s.get(tenant)
            marks[tenant] = kept[1] if kept is not None and kept[0] == start else start  # new: none folded
        mark = now - SETTLE_S
        still, ended = _pod_rows(rt, list(budgets), min(marks.values()), mark, now, self.open_ids)
        intervals = _Intervals(rt)
        for row in sorted(ended, key=lambda r: r.finished_s):
            # after the tenant's watermark, or seen open last time and closed late behind it (its part
            # in this period only: one that ended before the period began has none)
            late = row.id in self.open_ids and row.finished_s > starts[row.tenant]
            if row.finished_s > marks[row.tenant] or late:
                ledger.fold(intervals.of(row, row.finished_s), budgets[row.tenant])
        closed = {row.id for row in ended}
        self.watermark_s = {t: (starts[t], max(marks[t], mark)) for t in budgets}
        self.open_ids = frozenset(row.id for row in still if row.id not in closed)
        open_now = [intervals.of(row, now if row.finished_s is None else min(row.finished_s, now))
                    for row in still if row.id not in closed]
        spent = ledger.spent(budgets, open_now, now)
        self.spend = {t: TenantSpend(b, starts[t], spent[t]) for t, b in budgets.items()}
        self.exhausted = exhausted(budgets, spent)

    def _warn(self, rt: Runtime, now: float) -> None:
        """Record a `tenant.budget_warning` in the audit log when a tenant's spend first reaches its warn
        fraction in a period (the log is read back after a restart, so it is said once)."""
        due = [(t, s) for t, s in self.spend.items()
               if s.ratio >= s.budget.warn_fraction and (t, s.period_start_s) not in self.warned]
        if not due:
            return
        with rt.store.write() as session:
            for tenant, s in due:
                self.warned.add((tenant, s.period_start_s))
                # the tenant's row locked first: another server's tracker warning at the same time
                # waits, then finds this warning said (each process keeps its own `warned`)
                if session.get(TenantRow, tenant, with_for_update=True) is None:
                    continue  # deleted meanwhile
                said = session.scalars(select(AuditRow.id).where(
                    AuditRow.action == WARNING_ACTION, AuditRow.target == tenant,
                    AuditRow.at_s >= s.period_start_s)).first()
                if said is not None:
                    continue
                currency = self.book.currency if self.book else ""
                detail = (f"spent {money(s.spent, currency)} of its budget of {s.budget.amount:g} {currency} "
                          f"per {s.budget.period.value} ({s.ratio:.0%})")
                log.warning("tenant %s %s", tenant, detail)
                session.add(AuditRow(at_s=now, actor=ACTOR, token_id="", action=WARNING_ACTION,
                                     target=tenant[:255], detail=detail[:1024], remote="", count=1))


def apply_update(row: TenantRow, body: TenantUpdate) -> bool:
    """Set the budget fields `body` gives on the tenant's row; whether any was given."""
    given = body.model_fields_set & {"budget", "budget_period", "budget_warn", "overdraft"}
    if "budget" in given:
        row.budget = body.budget
    if body.budget_period is not None:
        row.budget_period = body.budget_period
    if body.budget_warn is not None:
        row.budget_warn = body.budget_warn
    if body.overdraft is not None:
        row.budget_overdraft = body.overdraft
    return bool(given)


def describe(row: TenantRow) -> str:
    """The budget fields as the audit log records them."""
    amount = "-" if row.budget is None else f"{row.budget:g}"
    return (f"budget={amount} budget_period={row.budget_period} budget_warn={row.budget_warn:g} "
            f"overdraft={str(bool(row.budget_overdraft)).lower()}")


def fields_out(row: TenantRow, spend: TenantSpend | None, is_exhausted: bool,
               currency: str) -> dict[str, Any]:
    """The budget fields of a tenant's `TenantOut` (the spend only while it has a budget)."""
    out: dict[str, Any] = {"budget": row.budget, "budget_period": row.budget_period,
                           "budget_warn": row.budget_warn, "overdraft": bool(row.budget_overdraft)}
    if row.budget is not None:
        out["currency"] = currency
    if row.budget is not None and spend is not None:
        out.update(spent=round(spend.spent, 6), spent_ratio=round(spend.ratio, 6),
                   period_start_s=spend.period_start_s, budget_exhausted=is_exhausted)
    return out


_BUDGETS = select(TenantRow.name, TenantRow.budget, TenantRow.budget_period, TenantRow.budget_warn,
                  TenantRow.budget_overdraft, TenantRow.created_s).where(TenantRow.budget.is_not(None))
"""Built once, as the two below: the loop reads them every few seconds."""
_POD_ROWS = (select(PodRow.id, PodRow.node, PodRow.slices, PodRow.models, PodRow.started_s, PodRow.finished_s,
                    WorkloadRow.tenant, WorkloadRow.queue, WorkloadRow.spec)
             .join(WorkloadRow, WorkloadRow.id == PodRow.workload_id)
             .where(PodRow.started_s.is_not(None), PodRow.started_s < bindparam("now"),
                    WorkloadRow.tenant.in_(bindparam("tenants", expanding=True))))
_ENDED_ROWS = _POD_ROWS.where(PodRow.finished_s > bindparam("watermark"),
                              PodRow.finished_s <= bindparam("mark"))
_OPEN_ROWS = _POD_ROWS.where(or_(PodRow.finished_s.is_(None), PodRow.finished_s > bindparam("mark")))
_CLOSED_ROWS = _POD_ROWS.where(PodRow.id.in_(bindparam("ids", expanding=True)),
                               PodRow.finished_s <= bindparam("watermark"))
"""Pods read open last time and closed since behind the watermark (those after it are _ENDED_ROWS)."""
IDS_PER_QUERY = 500


def _budgets(rt: Runtime) -> tuple[dict[str, Budget], dict[str, float]]:
    """Every budgeted tenant's budget, and when each was made (a name made again is another tenant)."""
    with rt.store.read() as session:
        rows = session.execute(_BUDGETS).all()
    return ({name: Budget(float(amount or 0.0), BudgetPeriod(period), warn, bool(overdraft))
             for name, amount, period, warn, overdraft, _ in rows},
            {row[0]: float(row[-1]) for row in rows})


def _pod_rows(rt: Runtime, tenants: list[str], watermark: float, mark: float, now: float,
              were_open: frozenset[str]) -> tuple[Sequence[Any], list[Any]]:
    """The budgeted tenants' pods open or ended after `mark`; and those that ended in (watermark,
    mark] or, of `were_open` no longer open, at any time up to the watermark.

    The open ones are read first, so a pod closed between the reads is never missed: it is in both
    (the caller takes the later reading), or read open now and read again by id next time."""
    params = {"now": now, "tenants": tenants, "watermark": watermark, "mark": mark}
    with rt.store.read() as session:
        still = session.execute(_OPEN_ROWS, params).all()
        ended = list(session.execute(_ENDED_ROWS, params).all())
        closed = sorted(were_open - {row.id for row in still})
        for at in range(0, len(closed), IDS_PER_QUERY):
            ended += session.execute(_CLOSED_ROWS, {**params, "ids": closed[at:at + IDS_PER_QUERY]}).all()
    return still, ended


class _Intervals:
    """Pod rows as metering intervals (the same reading as `services.metering.intervals`)."""

    def __init__(self, rt: Runtime) -> None:
        from gpupool.server.services.specs import default_priority_class

        self.devices = device_map(rt.nodes())
        self.default_class = default_priority_class(rt.config.priority_classes) or ""

    def of(self, row: Any, end_s: float) -> PodInterval:
        return PodInterval(row.id, row.tenant, row.queue,
                           str(row.spec.get("priority_class") or self.default_class), row.node,
                           row.started_s, max(end_s, row.started_s),
                           held(row.node, row.slices, self.devices, row.models))
