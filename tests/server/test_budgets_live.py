"""Budgets on the live loop (fake provider, virtual clock): a tenant's spend crosses its warn fraction
(one warning), then its budget (its new work waits with `budget_exhausted`, its running work and the
other tenants' go on), and a new period, a raised budget or overdraft lets its work start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import delete, select

from gpupool.api.reasons import describe
from gpupool.api.tenants import TenantCreate, TenantOut, TenantUpdate
from gpupool.core.budgets import BudgetPeriod, period_end
from gpupool.server.metrics_budgets import BudgetCollector
from gpupool.server.orm import AuditRow, PodRow, TenantRow, WorkloadRow
from gpupool.server.services import tenants, usage
from gpupool.server.services.budgets import WARNING_ACTION
from server.test_live_scheduler import ADMIN, Pool

CONFIG = """
prices:
  versions:
    - effective_from: 2000-01-01
      devices: {H100: 3600.0}
"""
"""One H100 costs 1 a second, so a whole device's spend is its seconds held."""


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    made = Pool(tmp_path, config=CONFIG)
    tenants.create_tenant(made.rt, ADMIN, TenantCreate.model_validate({"name": "team-a"}))
    tenants.update_tenant(made.rt, ADMIN, "team-a", TenantUpdate(budget=100.0, budget_period="day"))
    yield made
    made.close()


def _warnings(pool: Pool) -> list[str]:
    with pool.rt.store.read() as session:
        return list(session.scalars(select(AuditRow.detail).where(AuditRow.action == WARNING_ACTION)))


def _team_a(pool: Pool) -> TenantOut:
    [out] = [t for t in tenants.list_tenants(pool.rt, ADMIN) if t.name == "team-a"]
    return out


def _gauges(pool: Pool) -> dict[tuple[str, str], float]:
    registry = CollectorRegistry()
    registry.register(BudgetCollector(pool.rt))
    text = generate_latest(registry).decode()
    families = text_string_to_metric_families(text)
    return {(s.name, s.labels["tenant"]): s.value for f in families for s in f.samples}


def _bill(pool: Pool, since_s: float | None) -> float:
    """What `gpupool usage` bills team-a from `since_s` to now."""
    return usage.usage(pool.rt, ADMIN, tenant="team-a", since_s=since_s, until_s=pool.now,
                       by="tenant").total.cost


def test_spend_warns_then_holds_new_work_until_the_next_period(pool: Pool) -> None:
    first = pool.submit(1, tenant="team-a")
    pool.step()
    assert pool.status(first) == "running"
    pool.step(79.0)
    assert _warnings(pool) == [] and _team_a(pool).spent == pytest.approx(79.0)
    pool.step(6.0)  # 85 of 100: warned once
    [warning] = _warnings(pool)
    assert "spent 85.00 of its budget of 100 USD per day" in warning
    assert _gauges(pool)[("gpupool_tenant_budget_spent_ratio", "team-a")] == pytest.approx(0.85)
    pool.step(6.0)
    assert len(_warnings(pool)) == 1, "once per period"
    pool.step(20.0)  # 111 of 100: spent
    waiting = pool.submit(1, tenant="team-a")
    other = pool.submit(1)  # the default tenant has no budget
    pool.step()
    row = pool.row(waiting)
    assert (row.status, row.reason) == ("pending", "budget_exhausted")
    assert "team-a" in row.message
    assert describe(row.reason).text == "Its tenant spent its budget for this period; running work continues."
    assert pool.status(first) == "running", "running work continues"
    assert pool.status(other) == "running"
    shown = _team_a(pool)
    assert shown.budget_exhausted is True and shown.spent_ratio == pytest.approx(1.11)
    assert shown.spent == pytest.approx(_bill(pool, shown.period_start_s))
    assert _gauges(pool)[("gpupool_tenant_budget_exhausted", "team-a")] == 1.0
    pool.step(600.0)
    assert pool.status(waiting) == "pending" and pool.status(first) == "running"
    # a new day: the spend starts again from the running pod's share of the new period
    pool.step(period_end(BudgetPeriod.DAY, pool.now) - pool.now + 10.0)
    pool.step()
    assert pool.status(waiting) == "running"
    assert _team_a(pool).budget_exhausted is False
    shown = _team_a(pool)
    assert shown.spent == pytest.approx(_bill(pool, shown.period_start_s)) and (shown.spent or 0.0) < 100.0


def test_overdraft_or_a_raised_budget_lets_its_work_start_now(pool: Pool) -> None:
    first = pool.submit(1, tenant="team-a")
    pool.step()
    pool.step(150.0)
    waiting = pool.submit(0.5, tenant="team-a")
    pool.step()
    assert pool.row(waiting).reason == "budget_exhausted"
    tenants.update_tenant(pool.rt, ADMIN, "team-a", TenantUpdate(overdraft=True))
    pool.step()
    assert pool.status(waiting) == "running" and pool.status(first) == "running"
    shown = _team_a(pool)
    assert (shown.overdraft, shown.budget_exhausted) == (True, False)
    assert (shown.spent_ratio or 0.0) > 1.0, "overdrawn, and shown as such"
    with pool.rt.store.read() as session:
        audit = list(session.scalars(select(AuditRow.detail).where(AuditRow.action == "tenant.update")))
    assert "overdraft=true" in audit[-1]


def test_a_budget_removed_stops_the_metering(pool: Pool) -> None:
    tenants.update_tenant(pool.rt, ADMIN, "team-a", TenantUpdate(budget=None))
    shown = _team_a(pool)
    assert shown.budget is None and shown.spent is None
    assert pool.rt.budgets.spent(pool.rt) == {}


def _pod(pool: Pool, pod_id: str, device: int, start: float, end: float | None) -> None:
    """A finished (or, with `end` None, running) whole-device pod of team-a, written to the store."""
    with pool.rt.store.write() as session:
        session.add(WorkloadRow(id=pod_id, name=pod_id, tenant="team-a", queue="default", status="succeeded",
                                priority=0, device_milli=1000, spec={"command": ["true"]}, attempt=1,
                                submit_s=start))
        session.flush()
        session.add(PodRow(id=f"{pod_id}-a1-r0", workload_id=pod_id, attempt=1, name="r0", rank=0,
                           status="succeeded" if end else "running", node=pool.rt.nodes()[0].name,
                           slices=[{"device_index": device, "compute_milli": 1000, "memory_mib": 1024}],
                           cpu_milli=0, memory_mib=0, created_s=start, started_s=start, finished_s=end))


def test_the_kept_totals_fold_ended_pods_once_and_agree_with_the_bill(pool: Pool) -> None:
    """As time passes the ended pods are folded into kept totals (after a minute), yet the spend is
    always the bill since the period's start; a period change starts it again."""
    tenants.update_tenant(pool.rt, ADMIN, "team-a", TenantUpdate(budget=1e9))
    day = period_end(BudgetPeriod.DAY, pool.now)  # tomorrow: the clock only moves on
    _pod(pool, "old", 0, day - 500.0, day + 30.0)  # began the day before
    _pod(pool, "ended", 1, day + 100.0, day + 400.0)
    _pod(pool, "open", 0, day + 200.0, None)
    for offset in (410.0, 450.0, 520.0, 1_000.0, 5_000.0, 86_400.0 + 50.0):
        pool.now = day + offset
        pool.rt.budgets.invalidate()
        spend = pool.rt.budgets.spent(pool.rt)["team-a"]
        assert spend.spent == pytest.approx(_bill(pool, spend.period_start_s)), offset
    assert spend.spent == pytest.approx(50.0), "the new day: only the open pod's 50 s"


def test_a_budget_removed_and_set_again_or_a_tenant_made_again_counts_each_pod_once(pool: Pool) -> None:
    """With no budget left the tracker forgot its watermarks but kept its totals, so a budget set again
    folded the period's pods a second time (600 spent for a bill of 300); and a tenant deleted and
    made again under a budgeted name, by another server between two looks of this one's, took the
    deleted one's spend."""
    tenants.update_tenant(pool.rt, ADMIN, "team-a", TenantUpdate(budget=1e9))
    day = period_end(BudgetPeriod.DAY, pool.now)
    _pod(pool, "ran", 0, day + 100.0, day + 400.0)
    pool.now = day + 1_000.0
    spent = lambda: pool.rt.budgets.spent(pool.rt)["team-a"].spent  # noqa: E731
    pool.rt.budgets.invalidate()
    assert spent() == pytest.approx(300.0)
    tenants.update_tenant(pool.rt, ADMIN, "team-a", TenantUpdate(budget=None))  # the only budget
    pool.rt.budgets.invalidate()
    assert pool.rt.budgets.spent(pool.rt) == {}
    tenants.update_tenant(pool.rt, ADMIN, "team-a", TenantUpdate(budget=1e9))
    pool.rt.budgets.invalidate()
    assert spent() == pytest.approx(300.0) == pytest.approx(_bill(pool, day))
    with pool.rt.store.write() as session:  # another server deletes team-a and makes it again
        session.execute(delete(PodRow).where(PodRow.workload_id == "ran"))
        session.execute(delete(WorkloadRow).where(WorkloadRow.id == "ran"))
        session.execute(delete(TenantRow).where(TenantRow.name == "team-a"))
        session.flush()
        session.add(TenantRow(name="team-a", created_s=pool.now + 10.0, budget=1e9, budget_period="day"))
    pool.now += 20.0
    pool.rt.budgets.invalidate()
    assert spent() == 0.0, "someone else's spend"


def _close(pool: Pool, pod_id: str, end: float) -> None:
    with pool.rt.store.write() as session:
        row = session.get(PodRow, f"{pod_id}-a1-r0")
        assert row is not None
        row.status, row.finished_s = "stopped", end


def test_a_pod_closed_late_with_an_end_long_past_counts_what_it_held(pool: Pool) -> None:
    """A pod the tracker saw open may be closed later at an end already behind its watermark (a
    takeover's or a restart's recovery closes a stopping pod when the provider says it ended): the
    spend is then its real usage, neither the time up to now nor nothing."""
    tenants.update_tenant(pool.rt, ADMIN, "team-a", TenantUpdate(budget=1e9))
    day = period_end(BudgetPeriod.DAY, pool.now)
    _pod(pool, "late", 0, day + 100.0, None)
    for offset, spent in ((1_000.0, 900.0), (2_000.0, 1_900.0)):
        pool.now = day + offset
        pool.rt.budgets.invalidate()
        assert pool.rt.budgets.spent(pool.rt)["team-a"].spent == pytest.approx(spent)
    _close(pool, "late", day + 900.0)  # ended long before the watermark (a minute before the last refresh)
    for offset in (2_005.0, 2_010.0):  # the late close is folded once, and stays so
        pool.now = day + offset
        pool.rt.budgets.invalidate()
        spend = pool.rt.budgets.spent(pool.rt)["team-a"]
        assert spend.spent == pytest.approx(800.0), offset
        assert spend.spent == pytest.approx(_bill(pool, spend.period_start_s))


def test_a_pod_closed_late_in_the_previous_period_adds_nothing_to_this_one(pool: Pool) -> None:
    """Read open across midnight, then closed late at an end the day before: it has no part in this
    day's spend, and folding it leaves this day's kept total as it was."""
    tenants.update_tenant(pool.rt, ADMIN, "team-a", TenantUpdate(budget=1e9))
    day = period_end(BudgetPeriod.DAY, pool.now)
    _pod(pool, "ended", 1, day + 10.0, day + 20.0)
    _pod(pool, "late", 0, day - 500.0, None)
    pool.now = day + 1_000.0
    assert pool.rt.budgets.spent(pool.rt)["team-a"].spent == pytest.approx(10.0 + 1_000.0)
    _close(pool, "late", day - 100.0)  # it ended the day before
    pool.now = day + 1_010.0
    pool.rt.budgets.invalidate()
    spend = pool.rt.budgets.spent(pool.rt)["team-a"]
    assert spend.spent == pytest.approx(10.0)
    assert spend.spent == pytest.approx(_bill(pool, spend.period_start_s))
