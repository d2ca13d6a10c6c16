"""Budget periods in UTC and the spend ledger: ended intervals folded once, open ones priced to now, a
new period starting again at 0."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpupool.core.budgets import Budget, BudgetPeriod, SpendLedger, exhausted, period_end, period_start
from gpupool.core.metering import HeldSlice, PodInterval, PriceBook, PriceVersion


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(("period", "when", "start", "end"), [
    (BudgetPeriod.DAY, "2026-12-14T13:05", "2026-12-14", "2026-12-15"),
    (BudgetPeriod.WEEK, "2026-12-20T23:59", "2026-12-14", "2026-12-21"),  # Monday to Monday
    (BudgetPeriod.WEEK, "2026-12-14T00:00", "2026-12-14", "2026-12-21"),
    (BudgetPeriod.MONTH, "2026-12-31T23:00", "2026-12-01", "2027-01-01"),
    (BudgetPeriod.MONTH, "2028-02-29T12:00", "2028-02-01", "2028-03-01"),
])
def test_periods_are_utc_days_weeks_from_monday_and_months(period: BudgetPeriod, when: str, start: str,
                                                           end: str) -> None:
    assert period_start(period, at(when)) == at(start)
    assert period_end(period, at(when)) == at(end)


BOOK = PriceBook((PriceVersion(0.0, {"h100": 3600.0}),))
"""A whole H100 costs 1 a second."""


def _interval(tenant: str, start: float, end: float, milli: int = 1000) -> PodInterval:
    return PodInterval(f"{tenant}-{start}", tenant, "default", "normal", "n0", start, end,
                       (HeldSlice("H100", milli, 0),))


def test_the_ledger_keeps_ended_intervals_and_prices_open_ones_to_now() -> None:
    day = at("2026-12-14")
    budget = Budget(100.0, BudgetPeriod.DAY)
    ledger = SpendLedger(BOOK)
    budgets = {"a": budget}
    assert ledger.spent(budgets, [], day + 10) == {"a": 0.0}
    ledger.fold(_interval("a", day - 50, day + 20), budget)  # only its 20 s of today count
    ledger.fold(_interval("a", day + 30, day + 60, milli=500), budget)
    running = _interval("a", day + 40, day + 200)
    spent = ledger.spent(budgets, [running], day + 200)
    assert spent == {"a": pytest.approx(20 + 15 + 160)}
    assert exhausted(budgets, spent) == frozenset({"a"})
    assert exhausted({"a": Budget(100.0, overdraft=True)}, spent) == frozenset()
    # the next day: the kept total starts again; the open run counts from midnight
    tomorrow = day + 86_400
    assert ledger.spent(budgets, [_interval("a", day + 40, tomorrow + 5)], tomorrow + 5) == {"a": 5.0}
    assert ledger.spent({}, [], tomorrow + 6) == {} and not ledger.periods
