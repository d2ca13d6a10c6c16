"""Benchmark: placement policies over a federation of three pools on the Philly trace, seeds side by side.

For each seed the same jobs (priorities and data sets drawn from the seed) are replayed over the
federation of bench/configs/federation.yaml once per variant: home, cheapest, fastest, balanced,
data-local, and balanced with the east member failing for a day. Each variant's figures are the
mean over seeds with the half-width of a 95 % interval (t distribution); `balanced` is compared
with `home` seed by seed (paired ratios). Target (issue 42): balanced at least 20 % cheaper than
home with mean JCT at most 5 % worse, or at least 30 % lower mean JCT at equal cost (cost ratio <= 1).

    python bench/federation_replay.py [--seeds 1,2,3] [--window 2017-10-02:2017-10-04]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpupool.cli.sim_federate import DEFAULT_VARIANTS, build_setup, parse_variants
from gpupool.errors import GpupoolError
from gpupool.sim.datadir import require_data_dir
from gpupool.sim.federation import run_variants

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("total_cost", "egress_cost", "data_moved_gb", "jct_mean_s", "jct_p95_s", "queue_mean_s",
        "remote_share", "moved_by_failure", "moved_by_reoffer", "failure_lost_gpu_hours")


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % interval (t distribution over seeds)."""
    from scipy.stats import t

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, float(t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))


def summarise(runs: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per variant: each key's mean and 95 % half-width over seeds; balanced vs home, paired."""
    variants = [r["variant"] for r in next(iter(runs.values()))]
    out: dict[str, Any] = {}
    for i, name in enumerate(variants):
        entry: dict[str, Any] = {}
        for key in KEYS:
            entry[key], entry[key + "_ci95"] = interval([float(rows[i][key]) for rows in runs.values()])
        utils: dict[str, float] = {}
        for member in runs[next(iter(runs))][i]["members"]:
            utils[member] = statistics.fmean(rows[i]["members"][member]["utilisation_pct"]
                                             for rows in runs.values())
        entry["utilisation_pct"] = utils
        out[name] = entry
    if "home" in variants and "balanced" in variants:
        h, b = variants.index("home"), variants.index("balanced")
        cost = [rows[b]["total_cost"] / rows[h]["total_cost"] for rows in runs.values()]
        jct = [rows[b]["jct_mean_s"] / rows[h]["jct_mean_s"] for rows in runs.values()]
        (c, c_ci), (j, j_ci) = interval(cost), interval(jct)
        met_cost = c + c_ci <= 0.80 and j + j_ci <= 1.05
        met_jct = j + j_ci <= 0.70 and c + c_ci <= 1.0
        out["balanced_vs_home"] = {"cost_ratio": c, "cost_ratio_ci95": c_ci, "jct_ratio": j,
                                   "jct_ratio_ci95": j_ci, "target_met": met_cost or met_jct,
                                   "target_met_by": "cost" if met_cost else "jct" if met_jct else None}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--federation", type=Path, default=ROOT / "bench" / "configs" / "federation.yaml")
    parser.add_argument("--window", default="2017-10-02:2017-10-04")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--reoffer-every-s", type=float, default=None,
                        help="override the file's simulation.reoffer_every_s (0: no re-offer)")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "federation_replay.json")
    args = parser.parse_args()
    console = Console(width=160)
    try:
        trace = f"philly:{require_data_dir() / 'philly' / 'philly-sia.csv'}"
        variants = parse_variants(args.variants)
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        runs: dict[int, list[dict[str, Any]]] = {}
        started = time.perf_counter()
        for seed in seeds:
            setup = build_setup(args.federation, trace, args.window, seed, variants=variants)
            if args.reoffer_every_s is not None:
                setup.spec = setup.spec.model_copy(update={"reoffer_every_s": args.reoffer_every_s})
            runs[seed] = run_variants(setup, variants)
            console.print(f"  seed {seed}: {len(setup.jobs)} jobs, {time.perf_counter() - started:.0f} s")
    except GpupoolError as exc:
        console.print(f"Error: {exc.message}")
        return 2
    summary = summarise(runs)
    table = Table(title=f"federated Philly {args.window}, seeds {args.seeds} (mean ± 95 % half-width)")
    for col in ("variant", "cost", "egress", "data TB", "JCT mean h", "JCT p95 h", "queue h", "remote %",
                "moved by failure", "re-offered", "util % per member"):
        table.add_column(col, justify="right")
    for v in variants:
        e = summary[v.name]
        table.add_row(v.name, f"{e['total_cost']:.0f}±{e['total_cost_ci95']:.0f}", f"{e['egress_cost']:.0f}",
                      f"{e['data_moved_gb'] / 1000:.1f}",
                      f"{e['jct_mean_s'] / 3600:.2f}±{e['jct_mean_s_ci95'] / 3600:.2f}",
                      f"{e['jct_p95_s'] / 3600:.1f}", f"{e['queue_mean_s'] / 3600:.2f}",
                      f"{100 * e['remote_share']:.0f}", f"{e['moved_by_failure']:.0f}",
                      f"{e['moved_by_reoffer']:.0f}",
                      " ".join(f"{m}:{u:.0f}" for m, u in e["utilisation_pct"].items()))
    console.print(table)
    if "balanced_vs_home" in summary:
        r = summary["balanced_vs_home"]
        console.print(f"balanced / home: cost {r['cost_ratio']:.3f}±{r['cost_ratio_ci95']:.3f}, mean JCT "
                      f"{r['jct_ratio']:.3f}±{r['jct_ratio_ci95']:.3f}; target met: {r['target_met']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    result = {"window": args.window, "seeds": seeds, "federation": args.federation.name, "summary": summary,
              "reoffer_every_s": args.reoffer_every_s,
              "runs": runs}
    args.json.write_text(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
