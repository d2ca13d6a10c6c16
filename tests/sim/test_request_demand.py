"""Replica demand from requests through the autoscaler (sim/request_demand.py) on synthetic traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.core.autoscale import AutoscalePolicy
from gpupool.errors import TraceError
from gpupool.sim.request_demand import load_requests, replica_demand


def trace(tmp_path: Path, rows: list[tuple[float, int, int]]) -> Path:
    path = tmp_path / "azure.csv"
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for at, ctx, gen in rows:
        minute, second = divmod(at, 60)
        lines.append(f"2023-11-16 18:{15 + int(minute):02d}:{second:010.7f},{ctx},{gen}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_load_step_scales_out_and_idleness_scales_to_zero(tmp_path: Path) -> None:
    # 20 s of quiet single requests, then 40 requests a second for 60 s, then nothing
    rows = [(float(t), 100, 10) for t in range(0, 20, 5)]
    rows += [(20.0 + i / 40, 100, 100) for i in range(40 * 60)]
    requests = load_requests(trace(tmp_path, rows))
    assert requests[0].at_s == 0.0 and len(requests) == len(rows)
    assert requests[5].at_s == pytest.approx(20.025)
    policy = AutoscalePolicy(target_per_replica=4, min_replicas=0, max_replicas=64)
    result = replica_demand(requests, policy, cold_start_s=10.0, prefill_s_per_token=0.0,
                            decode_s_per_token=0.01)  # each step request is in flight 1 s: 40 at once
    timeline = result["timeline"]
    before = max(t[1] for t in timeline if t[0] < 20)
    during = max(t[1] for t in timeline if 20 <= t[0] <= 80)
    assert before == 1 and during == 10  # 40 in flight / 4 a replica
    assert timeline[-1][1] == 0  # back to zero once idle past the grace period
    assert result["scale_events"] >= 3 and "panic window" in " ".join(result["first_events"])


def test_missing_columns_are_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.97,10\n")
    with pytest.raises(TraceError, match=r"lacks column\(s\) GeneratedTokens"):
        load_requests(path)


def test_the_autoscalers_steps_become_replicas_repeated_over_the_window() -> None:
    from gpupool.sim.request_demand import repeated_instances

    steps = [(0.0, 0), (10.0, 3), (40.0, 1), (70.0, 0)]
    got = repeated_instances(steps, period_s=100.0, until_s=250.0, app="azure-code")
    # each period: three replicas from 10 s, the two newest end at 40 s, the oldest at 70 s; the
    # third period is cut at 250 s, before its scale-down
    spans = [(i.start_s, i.end_s) for i in got]
    assert spans == [(10.0, 40.0), (10.0, 40.0), (10.0, 70.0), (110.0, 140.0), (110.0, 140.0),
                     (110.0, 170.0), (210.0, 240.0), (210.0, 240.0), (210.0, 250.0)]
    assert len({i.line for i in got}) == len(got) and all(i.app == "azure-code" and i.created_in_trace
                                                          for i in got)

    def live(t: float) -> int:
        return sum(i.start_s <= t < i.end_s for i in got)

    assert [live(t) for t in (5.0, 10.0, 39.0, 40.0, 69.0, 70.0, 115.0)] == [0, 3, 3, 1, 1, 0, 3]


def test_a_service_from_requests_joins_the_colocation_replay(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from gpupool.cli.sim import app

    fixtures = Path(__file__).parents[1] / "fixtures"
    rows = [(20.0 + i / 40, 100, 100) for i in range(40 * 60)]  # 40 a second for a minute: 10 replicas
    out = tmp_path / "c.json"
    args = ["colocate", "--services", str(fixtures / "colocation" / "alibaba_tiny.csv"),
            "--batch", str(fixtures / "replay" / "philly_tiny.csv"), "--service-thin", "1",
            "--cluster", "8x8xA100-80GB", "--variants", "static,colocated", "--json", str(out)]
    result = CliRunner().invoke(app, [*args, "--azure-service", "code", "--azure-file",
                                      str(trace(tmp_path, rows))])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())["variants"]
    base = CliRunner().invoke(app, args)
    assert base.exit_code == 0, base.output
    alone = json.loads(out.read_text())["variants"]
    assert data["colocated"]["replicas"] > alone["colocated"]["replicas"]
    peak, peak_alone = (d["colocated"]["service_demand_peak_gpus"] for d in (data, alone))
    assert peak >= peak_alone + 10
    bad = CliRunner().invoke(app, [*args, "--azure-service", "cod"])
    assert bad.exit_code == 2 and "Did you mean 'code'" in bad.output and "Traceback" not in bad.output
