"""Budgets in the replay: spend metered as the replay runs, the exhausted set handed to the core, budget
waits counted per tenant, and the work let go at the next period."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from factories import cluster, pod
from gpupool.cli.sim import app
from gpupool.core.budgets import Budget, BudgetPeriod
from gpupool.core.model import Workload
from gpupool.core.scheduling.cycle import Policies
from gpupool.errors import InvalidInput
from gpupool.prices import PricesConfig
from gpupool.sim.budgets import load_budgets
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import ReplayConfig, replay

FIXTURES = Path(__file__).parents[1] / "fixtures" / "replay"
BOOK = PricesConfig.model_validate({"versions": [{"devices": {"V100M32": 3.6}}]}).price_book()
"""A whole V100M32 costs 0.001 a second."""
DAY = 86_400.0


def _job(wid: str, gpus: float, submit: float, duration: float, tenant: str) -> TraceJob:
    return TraceJob(Workload(id=wid, pods=(pod(gpus, name="p"),), submit_time_s=submit, tenant=tenant),
                    submit, duration)


JOBS = (_job("a1", 1, 0, 200, "a"), _job("a2", 1, 150, 10, "a"), _job("b1", 1, 150, 10, "b"))
CONFIG = ReplayConfig(tuple(cluster(1, devices=4)), JOBS, Policies(placement="first-fit"), prices=BOOK)


def _decisions(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in ("budgets", "wall_s", "cycle_ms_mean", "cycles")}


def test_a_spent_tenant_waits_for_the_next_period_and_the_others_do_not() -> None:
    """a1 spends a's 0.1 by t=100 and runs on to 200; a2 (t=150) waits until the next day; b1 runs."""
    result = replay(replace(CONFIG, budgets={"a": Budget(0.1, BudgetPeriod.DAY)}))
    a = result["budgets"]["tenants"]["a"]
    assert (a["workloads_held"], a["periods_exhausted"], a["periods_warned"]) == (1, 1, 1)
    assert a["budget_waits"] >= 1 and result["budgets"]["budget_waits"] == a["budget_waits"]
    assert result["finished"] == 3 and result["unfinished"] == 0
    assert result["makespan_s"] == pytest.approx(DAY + 10)  # a2 ran on the next day, at its start
    assert result["per_tenant"]["b"]["mean_queue_delay_s"] == 0.0
    assert result["cost"]["tenants"]["a"]["pooled_cost"] == pytest.approx(0.21)  # a1 ran to its end


def test_overdraft_or_a_large_budget_changes_no_decision() -> None:
    plain = replay(CONFIG)
    assert "budgets" not in plain
    for budget in (Budget(0.1, BudgetPeriod.DAY, overdraft=True), Budget(1000.0)):
        result = replay(replace(CONFIG, budgets={"a": budget}))
        assert _decisions(result) == _decisions(plain)
        assert result["budgets"]["tenants"]["a"]["budget_waits"] == 0


def test_budgets_file(tmp_path: Path) -> None:
    path = tmp_path / "budgets.yaml"
    path.write_text("period: week\nwarn: 0.5\ntenants:\n  a: 100\n"
                    "  b: {amount: 5, period: day, overdraft: true}\n")
    assert load_budgets(path) == {"a": Budget(100.0, BudgetPeriod.WEEK, 0.5),
                                  "b": Budget(5.0, BudgetPeriod.DAY, 0.5, overdraft=True)}
    path.write_text("tenants:\n  a: -1\n")
    with pytest.raises(InvalidInput, match=r"invalid at tenants\.a"):
        load_budgets(path)


def test_cli_replay_with_budgets_counts_the_waits(tmp_path: Path) -> None:
    prices, budgets, out = tmp_path / "prices.yaml", tmp_path / "budgets.yaml", tmp_path / "r.json"
    prices.write_text("prices:\n  versions:\n    - devices: {V100M32: 2.0}\n")
    budgets.write_text("period: day\ntenants:\n  default: 0.01\n")
    args = ["replay", "--nodes", str(FIXTURES / "openb_tiny_nodes.csv"), "--trace",
            f"openb:{FIXTURES / 'openb_tiny_pods.csv'}", "--policy", "first-fit",
            "--ordering", "priority-fifo", "--no-preemption", "--no-backfill", "--seed", "0",
            "--budgets", str(budgets), "--json", str(out)]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2 and "--budgets needs a price book" in refused.output
    result = CliRunner().invoke(app, [*args, "--prices", str(prices)])
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    tenants = written["budgets"]["tenants"]
    assert set(tenants) == {"default"} and tenants["default"]["budget"] == 0.01
    assert written["config"]["budgets"] == {"default": {"amount": 0.01, "period": "day", "warn": 0.8,
                                                        "overdraft": False}}
