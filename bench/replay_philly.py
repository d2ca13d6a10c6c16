"""Benchmark: Philly replay: a Slurm-like baseline (strict FIFO + first-fit) against admission policies.

Part 1 replays a two-week window of the Philly trace on a cluster small enough for queues to form
and compares strict FIFO + first-fit (no backfill, no preemption) with the other orderings with
preemption and EASY backfill on: mean JCT, p99 queueing delay, utilisation (mean allocation over
the replay, and over the window's arrivals), per-tenant fairness (Jain's index of share / fair
share). Part 2 replays the whole trace (82k jobs) with preemption and backfill and reports the
wall time (target: under 60 s on 2 cores).

    python bench/replay_philly.py [--cluster 64x8xV100M32] [--window 2017-10-01:2017-10-15] [--skip-full]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpupool.cli.sim_replay import run_replay
from gpupool.errors import GpupoolError
from gpupool.sim.datadir import require_data_dir

BASELINE = ("fifo", "first-fit", False, False)
CANDIDATES = (
    ("priority-fifo", "first-fit", True, True),
    ("drf", "first-fit", True, True),
    ("fifo", "first-fit", True, True),
    ("las", "first-fit", True, True),
    ("drf", "best-fit", True, True),
)


def _row(name: str, result: dict[str, Any]) -> dict[str, Any]:
    return {
        "configuration": name,
        "jct_mean_s": result["jct_s"]["mean"],
        "queue_delay_p99_s": result["queue_delay_s"]["p99"],
        "queue_delay_mean_s": result["queue_delay_s"]["mean"],
        "alloc_pct_mean": result["gpu_alloc_pct_mean"],
        "alloc_pct_arrivals": result.get("gpu_alloc_pct_mean_arrivals", result["gpu_alloc_pct_mean"]),
        "fairness_jain": result["fairness_jain"],
        "preemptions": result["preemptions"],
        "lost_gpu_hours": result["lost_gpu_hours"],
        "estimator_history_mean_abs_rel_error": result["estimator"]["history"]["mean_abs_rel_error"],
        "jobs": result["jobs"],
        "wall_s": result["wall_s"],
        "per_tenant": result["per_tenant"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="64x8xV100M32")
    parser.add_argument("--window", default="2017-10-01:2017-10-15")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--configs", default="all", help="'all' or a count of candidates to run")
    parser.add_argument("--skip-full", action="store_true", help="Skip the whole-trace speed run.")
    parser.add_argument("--json", type=Path, default=Path("bench/results/replay_philly.json"))
    args = parser.parse_args()
    console = Console()
    try:
        trace = f"philly:{require_data_dir() / 'philly' / 'philly-sia.csv'}"
    except GpupoolError as exc:
        console.print(f"Error: {exc.message}")
        return 2
    candidates = CANDIDATES if args.configs == "all" else CANDIDATES[: int(args.configs)]
    rows = []
    for ordering, policy, preemption, backfill in (BASELINE, *candidates):
        name = f"{ordering} + {policy}" + (" + preemption + backfill" if preemption else "")
        result = run_replay(
            None, args.cluster, trace, args.window, ordering, policy, preemption, backfill, False, args.seed
        )
        rows.append(_row(name, result))
        console.print(f"  {name}: {result['wall_s']:.1f} s")
    table = Table(title=f"Philly {args.window} on {args.cluster} (seed {args.seed})")
    for column in (
        "configuration",
        "mean JCT h",
        "p99 queue h",
        "mean queue h",
        "alloc % (window)",
        "Jain",
        "preempt",
        "lost GPU-h",
        "wall s",
    ):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for r in rows:
        table.add_row(
            r["configuration"],
            f"{r['jct_mean_s'] / 3600:.2f}",
            f"{r['queue_delay_p99_s'] / 3600:.2f}",
            f"{r['queue_delay_mean_s'] / 3600:.2f}",
            f"{r['alloc_pct_arrivals']:.1f}",
            f"{r['fairness_jain']:.3f}",
            str(r["preemptions"]),
            f"{r['lost_gpu_hours']:.0f}",
            f"{r['wall_s']:.0f}",
        )
    console.print(table)
    full = None
    if not args.skip_full:
        best = min(rows[1:] or rows, key=lambda r: r["jct_mean_s"])
        ordering, policy = best["configuration"].split(" + ")[:2]
        result = run_replay(None, args.cluster, trace, None, ordering, policy, True, True, False, args.seed)
        full = _row(f"whole trace: {ordering} + {policy} + preemption + backfill", result)
        console.print(
            f"Whole trace ({full['jobs']} jobs, {ordering} + {policy} + preemption + backfill): "
            f"{full['wall_s']:.1f} s wall (target < 60 s)"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "cluster": args.cluster,
                "window": args.window,
                "seed": args.seed,
                "rows": rows,
                "full_trace": full,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
