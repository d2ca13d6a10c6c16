"""Benchmark: reservations that hold still, against the reckoning before, on one Philly window.

Replays a window of the Philly trace with the pool's defaults (drf, fgd-strand, preemption,
backfill) five times in one run, each arm switching the three changes of issue 35 item 5 on or off
(`core/scheduling/backfill.py`'s `history_by`, `cycle.py`'s `preempt_beside_reservation` and
`beside_reserved`): all before, each alone, all after. The replay is deterministic, so the arms
differ only by those switches. Prints queueing delay (mean, p99), JCT, allocation, preemptions and
the count and total of reservation slides (a head's reserved start moving later between cycles),
and how many (and how far) of them came in cycles where work that may preempt took room the head
counted on (the rest follow corrections of overrunning estimates), with the ratio of each arm to
the "before" arm, and writes JSON.

    python bench/reservations.py [--cluster 16x8xV100M32] [--window 2017-10-01:2017-10-04]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpupool.cli.sim_replay import run_replay
from gpupool.core.scheduling import backfill, cycle
from gpupool.errors import GpupoolError
from gpupool.sim.datadir import require_data_dir

ARMS: tuple[tuple[str, str, bool, bool], ...] = (
    # name, history_by, preempt_beside_reservation, beside_reserved
    ("before", "tenant", False, False),
    ("estimates by kind", "shape", False, False),
    ("preempt beside", "tenant", True, False),
    ("small beside", "tenant", False, True),
    ("after (all three)", "shape", True, True),
)


def _arm(trace: str, args: argparse.Namespace, history_by: str, preempt: bool, beside: bool
         ) -> dict[str, Any]:
    saved = (backfill.history_by, cycle.preempt_beside_reservation, cycle.beside_reserved)
    backfill.history_by = history_by  # type: ignore[assignment]
    cycle.preempt_beside_reservation = preempt
    cycle.beside_reserved = beside
    try:
        return run_replay(None, args.cluster, trace, args.window, None, None, None, None, False, args.seed)
    finally:
        backfill.history_by, cycle.preempt_beside_reservation, cycle.beside_reserved = saved


def _row(name: str, result: dict[str, Any]) -> dict[str, Any]:
    return {
        "arm": name,
        "queue_delay_mean_s": result["queue_delay_s"]["mean"],
        "queue_delay_p99_s": result["queue_delay_s"]["p99"],
        "jct_mean_s": result["jct_s"]["mean"],
        "alloc_pct_arrivals": result.get("gpu_alloc_pct_mean_arrivals", result["gpu_alloc_pct_mean"]),
        "preemptions": result["preemptions"],
        "reservation_slides": result["reservations"]["slides"],
        "reservation_slid_h": result["reservations"]["slid_s"] / 3600.0,
        "preempt_slides": result["reservations"]["preempt_slides"],
        "preempt_slid_h": result["reservations"]["preempt_slid_s"] / 3600.0,
        "history_mean_abs_rel_error": result["estimator"]["history"]["mean_abs_rel_error"],
        "history_estimated": result["estimator"]["history"]["estimated"],
        "jobs": result["jobs"],
        "wall_s": result["wall_s"],
    }


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base else "-"


def _hours(row: dict[str, Any], base: dict[str, Any], key: str) -> str:
    return f"{row[key] / 3600:.2f} ({_ratio(row[key], base[key])})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="16x8xV100M32")
    parser.add_argument("--window", default="2017-10-01:2017-10-04")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=Path("bench/results/reservations.json"))
    args = parser.parse_args()
    console = Console(width=150)
    try:
        trace = f"philly:{require_data_dir() / 'philly' / 'philly-sia.csv'}"
    except GpupoolError as exc:
        console.print(f"Error: {exc.message}")
        return 2
    rows = []
    for name, history_by, preempt, beside in ARMS:
        rows.append(_row(name, _arm(trace, args, history_by, preempt, beside)))
        console.print(f"  {name}: {rows[-1]['wall_s']:.1f} s")
    base = rows[0]
    table = Table(title=f"Philly {args.window} on {args.cluster}, pool defaults (seed {args.seed}); "
                        "(x) = ratio to 'before'")
    for column in ("arm", "mean queue h", "p99 queue h", "mean JCT h", "alloc %", "preempt", "slides",
                   "slid h", "of which preempt (n / h)", "wall s"):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for r in rows:
        table.add_row(
            r["arm"],
            _hours(r, base, "queue_delay_mean_s"),
            _hours(r, base, "queue_delay_p99_s"),
            _hours(r, base, "jct_mean_s"),
            f"{r['alloc_pct_arrivals']:.1f}",
            str(r["preemptions"]),
            f"{r['reservation_slides']} ({_ratio(r['reservation_slides'], base['reservation_slides'])})",
            f"{r['reservation_slid_h']:.0f}",
            f"{r['preempt_slides']} / {r['preempt_slid_h']:.0f}",
            f"{r['wall_s']:.0f}",
        )
    console.print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"cluster": args.cluster, "window": args.window, "seed": args.seed,
                                     "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
