"""Benchmark: how far priority reaches: `preemption.scope: queue` against `scope: pool` on Philly.

A two-week window of the Philly trace is replayed with the pool's default configuration (what
`gpupool up` runs) and every tenant's work in a queue of its own without a quota, as the server
keeps each tenant's `default` queue; a seeded share of the jobs (default 5 %) is of class
`critical`, the rest keep their high/normal/best-effort draw. Under `scope: queue` a job may stop
only its own tenant's lower-priority work; under `scope: pool`, lower-class work of any tenant
(every class reaches that far, not only critical). The table gives the critical jobs' queueing
delay (p50/p95/p99, seconds) and what the reach costs the rest: their mean queueing delay and mean
JCT, all preemptions and the GPU-hours they lost; the JSON has every class's figures.

    python bench/priority_reach.py [--cluster 64x8xV100M32] [--window 2017-10-01:2017-10-15]
        [--critical-share 0.05] [--seed 1] [--json bench/results/priority_reach.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpupool.cli.sim_replay import run_replay
from gpupool.config import PoolConfig
from gpupool.errors import GpupoolError
from gpupool.sim.datadir import require_data_dir
from gpupool.sim.jobs import in_window, parse_window, philly_jobs

SCOPES = ("queue", "pool")


def _config(scope: str, tenants: list[str]) -> PoolConfig:
    """The default configuration with `scope`, one queue per tenant (no quota, no cohort)."""
    return PoolConfig.model_validate({"preemption": {"scope": scope},
                                      "queues": [{"tenant": t} for t in tenants]})


def _rest(by_class: dict[str, Any]) -> dict[str, float]:
    """Queueing delay p95 and mean JCT of the non-critical jobs (weighted by their counts)."""
    others = {c: v for c, v in by_class.items() if c != "critical"}
    started = sum(v["started"] for v in others.values()) or 1
    finished = sum(v["finished"] for v in others.values()) or 1
    return {
        "queue_delay_mean_s": sum(v["queue_delay_s"]["mean"] * v["started"] for v in others.values())
        / started,
        "jct_mean_s": sum(v["jct_s"]["mean"] * v["finished"] for v in others.values()) / finished,
        "lost_gpu_hours": sum(v["lost_gpu_hours"] for v in others.values()),
        "preempted": sum(v["preempted"] for v in others.values()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="64x8xV100M32")
    parser.add_argument("--window", default="2017-10-01:2017-10-15")
    parser.add_argument("--critical-share", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scopes", default=",".join(SCOPES), help="comma-separated: queue, pool")
    parser.add_argument("--json", type=Path, default=Path("bench/results/priority_reach.json"))
    args = parser.parse_args()
    console = Console(width=150)
    try:
        path = require_data_dir() / "philly" / "philly-sia.csv"
        per_node = int(args.cluster.split("x")[1])
        jobs = in_window(philly_jobs(path, per_node, args.seed), parse_window(args.window))
    except (GpupoolError, IndexError, ValueError) as exc:
        console.print(f"Error: {getattr(exc, 'message', exc)}")
        return 2
    tenants = sorted({j.workload.tenant for j in jobs})
    rows = []
    for scope in args.scopes.split(","):
        config = _config(scope.strip(), tenants)
        policies = config.policies()
        result = run_replay(None, args.cluster, f"philly:{path}", args.window, policies.ordering,
                            policies.placement, True, True, False, args.seed, config=config,
                            critical_share=args.critical_share)
        by_class = result["by_priority_class"]
        critical = by_class.get("critical", {"started": 0, "queue_delay_s": {"p50": 0, "p95": 0, "p99": 0}})
        rows.append({"scope": scope, "critical": critical, "rest": _rest(by_class), "by_class": by_class,
                     "preemptions": result["preemptions"], "lost_gpu_hours": result["lost_gpu_hours"],
                     "jct_mean_s": result["jct_s"]["mean"], "alloc_pct_arrivals":
                     result.get("gpu_alloc_pct_mean_arrivals"), "jobs": result["jobs"],
                     "wall_s": result["wall_s"], "config": config.model_dump(mode="json")["preemption"]})
        console.print(f"  scope {scope}: {result['wall_s']:.1f} s")
    table = Table(title=f"Priority reach: Philly {args.window} on {args.cluster}, {args.critical_share:.0%} "
                        f"critical (seed {args.seed}, {len(tenants)} tenant queues)")
    for column in ("scope", "critical jobs", "critical queue p50 / p95 / p99 s", "rest mean queue h",
                   "rest mean JCT h", "preemptions", "lost GPU-h", "alloc %"):
        table.add_column(column, justify="left" if column == "scope" else "right")
    for r in rows:
        c = r["critical"]["queue_delay_s"]
        table.add_row(r["scope"], str(r["critical"]["started"]),
                      f"{c['p50']:.0f} / {c['p95']:.0f} / {c['p99']:.0f}",
                      f"{r['rest']['queue_delay_mean_s'] / 3600:.2f}",
                      f"{r['rest']['jct_mean_s'] / 3600:.2f}",
                      str(r["preemptions"]), f"{r['lost_gpu_hours']:.0f}", f"{r['alloc_pct_arrivals']:.1f}")
    console.print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"cluster": args.cluster, "window": args.window, "seed": args.seed,
                                     "critical_share": args.critical_share, "tenants": tenants,
                                     "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
