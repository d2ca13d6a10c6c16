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
