"""The replay's cost: every run's slices priced as the server bills them, without changing a decision."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from factories import cluster, pod
from gpupool.cli.sim import app
from gpupool.core.model import Workload
from gpupool.core.scheduling.cycle import Policies
from gpupool.prices import PricesConfig
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import ReplayConfig, replay

FIXTURES = Path(__file__).parents[1] / "fixtures" / "replay"
FF = Policies(placement="first-fit", ordering="priority-fifo")
BOOK = PricesConfig.model_validate({"versions": [{"devices": {"V100M32": 3.6},
                                                  "priority_classes": {"best-effort": 0.5}}]}).price_book()


def _job(wid: str, gpus: float, submit: float, duration: float, **kw: Any) -> TraceJob:
    w = Workload(id=wid, pods=(pod(gpus, name="p"),), submit_time_s=submit, **kw)
    return TraceJob(w, submit, duration)


def _decisions(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in ("cost", "wall_s", "cycle_ms_mean")}


def test_preempted_runs_are_each_priced_and_decisions_do_not_change() -> None:
    jobs = (_job("low", 1, 0, 100, priority_class="best-effort", tenant="a", checkpoint_interval_s=40.0),
            _job("high", 1, 50, 10, priority_class="high", tenant="b"))
    config = ReplayConfig(tuple(cluster(1, devices=1)), jobs, replace(FF, preemption=True))
    plain, priced = replay(config), replay(replace(config, prices=BOOK))
    assert "cost" not in plain and _decisions(plain) == _decisions(priced)
    cost = priced["cost"]
    # low ran 0-50, was preempted, and ran again 60-120 from its checkpoint: 110 s at half price
    assert cost["tenants"]["a"]["device_hours"] == pytest.approx(110 / 3600, abs=1e-6)
    assert cost["tenants"]["a"]["pooled_cost"] == pytest.approx(round(3.6 * 0.5 * 110 / 3600, 4))
    assert cost["tenants"]["b"]["pooled_cost"] == pytest.approx(round(3.6 * 10 / 3600, 4))


def test_fractional_slices_cost_their_share_and_exclusive_rounds_up() -> None:
    jobs = (_job("x", 0.5, 0, 3600, tenant="a"), _job("y", 0.25, 0, 3600, tenant="a"))
    result = replay(ReplayConfig(tuple(cluster(1, devices=1)), jobs, FF, prices=BOOK))
    total = result["cost"]["total"]
    assert result["cost"]["currency"] == "USD"
    assert total["device_hours"] == pytest.approx(0.75)
    assert total["exclusive_cost"] == pytest.approx(2 * 3.6)  # each pod on a whole device
    # the slices' memory share is proportional (the default), so the dominant share is the compute
    assert total["pooled_cost"] == pytest.approx(0.75 * 3.6)
    assert total["saving"] == pytest.approx(1.25 * 3.6)


def test_cli_replay_with_prices_adds_cost(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("prices:\n  versions:\n    - devices: {V100M32: 2.0}\n")
    out = tmp_path / "r.json"
    args = ["replay", "--nodes", str(FIXTURES / "openb_tiny_nodes.csv"), "--trace",
            f"openb:{FIXTURES / 'openb_tiny_pods.csv'}", "--policy", "first-fit",
            "--ordering", "priority-fifo", "--no-preemption", "--no-backfill", "--seed", "0",
            "--prices", str(prices), "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    total = written["cost"]["total"]
    assert total["priced"] and 0 < total["pooled_cost"] <= total["exclusive_cost"]
    assert written["config"]["prices"]["versions"][0]["devices"] == {"V100M32": 2.0}
    prices.write_text("prices:\n  versions:\n    - devices: {V100M32: -1}\n")
    bad = CliRunner().invoke(app, args)
    assert bad.exit_code == 2 and "not negative, infinite or nan (V100M32)" in bad.output


def test_a_tenants_cost_sums_its_real_and_simulated_devices() -> None:
    """Usage rows are apart for real and simulated devices: the tenant's figure was the last one of
    them (10 of 20 s), while the total counted both."""
    real, fake = cluster(1, devices=1), cluster(1, devices=1)
    fake = [replace(n, name="s0", devices=tuple(replace(d, simulated=True) for d in n.devices)) for n in fake]
    jobs = (_job("x", 1, 0, 10, tenant="t"), _job("y", 1, 0, 10, tenant="t"))
    cost = replay(ReplayConfig((*real, *fake), jobs, FF, prices=BOOK))["cost"]
    assert cost["tenants"]["t"]["device_hours"] == pytest.approx(cost["total"]["device_hours"])
    assert cost["total"]["device_hours"] == pytest.approx(20 / 3600, abs=1e-6)
