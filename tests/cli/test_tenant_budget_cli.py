"""`gpupool tenant set --budget ...` and `tenant ls` against a live server: the budget's terms set and
shown, the spend this period and its share, refusals in one sentence."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from factories import node
from gpupool.cli.lazy import app
from gpupool.client import Client
from gpupool.config import parse_config
from gpupool.server.orm import PodRow, WorkloadRow
from live import LiveServer, cli_env, live_server
from server.fakes import ManualProvider

runner = CliRunner()
PRICES = """
prices:
  versions:
    - effective_from: 2000-01-01
      devices: {H100: 10.0}
"""


@pytest.fixture
def srv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    provider = ManualProvider([node("n0", devices=4, model="H100")])
    with live_server(tmp_path, provider, config=parse_config(PRICES),
                     before_serving=cli_env(monkeypatch, COLUMNS="250")) as server:
        with Client(server.url, server.admin_token) as pool:
            pool.create_tenant("team-a")
        yield server


def gp(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def _running_pod(server: LiveServer, hours: float) -> None:
    """A whole H100 held by team-a for the last `hours` (still running)."""
    start = server.rt.clock() - hours * 3600
    with server.rt.store.write() as session:
        session.add(WorkloadRow(id="w1", name="w1", tenant="team-a", queue="default", status="running",
                                priority=0, device_milli=1000, spec={"command": ["true"]}, attempt=1,
                                submit_s=start))
        session.flush()
        session.add(PodRow(id="w1-a1-r0", workload_id="w1", attempt=1, name="r0", rank=0, status="running",
                           node="n0", slices=[{"device_index": 0, "compute_milli": 1000, "memory_mib": 1024}],
                           cpu_milli=0, memory_mib=0, created_s=start, started_s=start, finished_s=None))


def test_set_a_budget_and_see_it_spent(srv: LiveServer) -> None:
    code, out, err = gp("tenant", "set", "team-a", "--budget", "5000", "--budget-period", "day",
                        "--budget-warn", "0.5", "--overdraft")
    assert code == 0, err
    assert "budget 5000 per day, warn at 50%, overdraft allowed" in out
    _running_pod(srv, hours=0.5)  # 0.5 h of a 10/h device: 5 spent, or all of today so far if less
    srv.rt.budgets.invalidate()
    code, out, err = gp("tenant", "ls", "-o", "json")
    assert code == 0, err
    [team] = [t for t in json.loads(out) if t["name"] == "team-a"]
    day_s = srv.rt.clock() - team["period_start_s"]
    assert team["spent"] == pytest.approx(10.0 * min(1800.0, day_s) / 3600, rel=1e-3)
    assert (team["budget"], team["budget_period"], team["budget_warn"], team["overdraft"]) == (
        5000.0, "day", 0.5, True)
    assert team["budget_exhausted"] is False
    code, out, _ = gp("tenant", "ls")
    assert code == 0 and "SPENT" in out and "BUDGET" in out
    code, out, err = gp("tenant", "set", "team-a", "--budget", "1", "--no-overdraft")
    assert code == 0, err
    srv.rt.budgets.invalidate()
    code, out, _ = gp("tenant", "ls")
    assert code == 0 and "exhausted" in out
    code, out, _ = gp("tenant", "set", "team-a", "--no-budget")
    assert code == 0 and out.rstrip().endswith("budget -")


@pytest.mark.parametrize(("args", "words"), [
    (["--budget", "5", "--no-budget"], "Give --budget AMOUNT or --no-budget, not both."),
    (["--budget", "-1"], "--budget"),
    (["--budget-warn", "1.5"], "--budget-warn"),
    (["--budget-period", "year"], "--budget-period"),
])
def test_bad_budget_options_are_refused_in_a_sentence(srv: LiveServer, args: list[str], words: str) -> None:
    code, out, err = gp("tenant", "set", "team-a", *args)
    assert code == 2 and out == "" and words in err and "Traceback" not in err


def test_the_spend_is_shown_in_the_price_books_currency(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A yen has no minor unit: the spend showed as 500.00 in a JPY pool, where usage shows 500."""
    config = parse_config(PRICES.replace("prices:\n", "prices:\n  currency: JPY\n").replace("10.0", "1000"))
    provider = ManualProvider([node("n0", devices=4, model="H100")])
    with live_server(tmp_path, provider, config=config,
                     before_serving=cli_env(monkeypatch, COLUMNS="250")) as server:
        with Client(server.url, server.admin_token) as pool:
            pool.create_tenant("team-a")
        assert gp("tenant", "set", "team-a", "--budget", "100000", "--budget-period", "month")[0] == 0
        _running_pod(server, hours=0.5)
        server.rt.budgets.invalidate()
        code, out, err = gp("tenant", "ls", "-o", "json")
        [team] = [t for t in json.loads(out) if t["name"] == "team-a"]
        month_s = server.rt.clock() - team["period_start_s"]  # the month may have begun under an hour ago
        assert team["currency"] == "JPY" and team["spent"] == pytest.approx(1000 * min(1800, month_s) / 3600,
                                                                           rel=1e-3)
        code, out, err = gp("tenant", "ls")
        assert code == 0, err
        [line] = [line for line in out.splitlines() if line.startswith("team-a")]
        shown = re.search(r" (\S+) \(\d+%\)", line)  # the pod runs on: read again, the spend grew a little
        assert shown is not None and "." not in shown[1], line  # 500, as usage shows yen, not 500.00
        assert team["spent"] - 1 <= int(shown[1]) <= team["spent"] + 10, line
