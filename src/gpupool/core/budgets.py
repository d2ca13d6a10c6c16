"""Tenant budgets, pure: budget periods (UTC), the spend of a period and which tenants exhausted theirs.

A tenant's spend is the cost (`core.metering`, at the price book in force) of its pods' held slices
since its period's start. `SpendLedger` keeps that cheaply for a caller that meters as time passes
(the server from its pod rows, the replay from its runs): intervals that ended are folded into kept
totals once, and only the open ones are priced afresh. The core's admission then gets the exhausted
tenants as data (`Policies.exhausted_tenants`).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpupool.core.metering import DAY_S, PodInterval, PriceBook, aggregate

_NO_KEYS: tuple[()] = ()


class BudgetPeriod(StrEnum):
    MONTH = "month"
    WEEK = "week"
    DAY = "day"


@dataclass(frozen=True, slots=True)
class Budget:
    """What a tenant may spend per period; with `overdraft` it is never exhausted (it is only warned)."""

    amount: float
    period: BudgetPeriod = BudgetPeriod.MONTH
    warn_fraction: float = 0.8
    overdraft: bool = False


def period_start(period: BudgetPeriod, time_s: float) -> float:
    """The start of the period (UTC: midnight, Monday midnight, the 1st's midnight) that holds `time_s`."""
    day = math.floor(time_s / DAY_S)
    if period is BudgetPeriod.DAY:
        return day * DAY_S
    if period is BudgetPeriod.WEEK:
        return (day - (day + 3) % 7) * DAY_S  # 1970-01-01 was a Thursday
    date = dt.datetime.fromtimestamp(day * DAY_S, dt.UTC)
    return date.replace(day=1).timestamp()


def period_end(period: BudgetPeriod, time_s: float) -> float:
    """When the period that holds `time_s` ends (the next one starts)."""
    start = period_start(period, time_s)
    if period is BudgetPeriod.DAY:
        return start + DAY_S
    if period is BudgetPeriod.WEEK:
        return start + 7 * DAY_S
    return period_start(period, start + 32 * DAY_S)


def interval_cost(interval: PodInterval, book: PriceBook, since_s: float, until_s: float) -> float:
    """The cost of the interval's part in [since_s, until_s)."""
    return sum(row.cost for row in aggregate((interval,), book, _NO_KEYS, since_s, until_s))


def exhausted(budgets: Mapping[str, Budget], spent: Mapping[str, float]) -> frozenset[str]:
    """The tenants (without overdraft) whose spend reached their budget."""
    return frozenset(t for t, b in budgets.items() if not b.overdraft and spent.get(t, 0.0) >= b.amount)


@dataclass(slots=True)
class _Period:
    start_s: float
    folded: float = 0.0


@dataclass(slots=True)
class SpendLedger:
    """Each budgeted tenant's spend in its current period: `fold` ended intervals once (in the order they
    end), `spent` adds the open ones priced to now. A tenant's kept total starts again at 0 when its
    period changes: an interval that ended before then has no part in the new period."""

    book: PriceBook
    periods: dict[str, _Period] = field(default_factory=dict)

    def period(self, tenant: str, budget: Budget, now_s: float) -> float:
        """The start of the tenant's period at `now_s` (its kept total starts again at 0 when the period
        moved on or the budget's period changed)."""
        start = period_start(budget.period, now_s)
        kept = self.periods.get(tenant)
        if kept is None or kept.start_s != start:
            self.periods[tenant] = _Period(start)
        return start

    def fold(self, interval: PodInterval, budget: Budget) -> None:
        """An interval that ended: its part in the tenant's period at its end joins the kept total."""
        start = self.period(interval.tenant, budget, interval.end_s)
        if interval.end_s > start:
            self.periods[interval.tenant].folded += interval_cost(interval, self.book, start, interval.end_s)

    def spent(self, budgets: Mapping[str, Budget], open_intervals: Iterable[PodInterval],
              now_s: float) -> dict[str, float]:
        """Every budgeted tenant's spend this period: its kept total plus its open intervals up to now."""
        for tenant, budget in budgets.items():
            self.period(tenant, budget, now_s)
        for tenant in [t for t in self.periods if t not in budgets]:
            del self.periods[tenant]
        spent = {t: self.periods[t].folded for t in budgets}
        for interval in open_intervals:
            kept = self.periods.get(interval.tenant)
            if kept is not None:
                spent[interval.tenant] += interval_cost(interval, self.book, kept.start_s, now_s)
        return spent
