"""Benchmark: inference services and batch on one pool against a static split (issue 39, item 6).

Replays the Alibaba 2025 inference trace (31 days; each app's live GPU instances are its replica
demand, as a 1/8 scale model: `--service-thin`) and Philly batch (from 2017-10-01, each job taken
0.2 times on average) on nodes of 8 A100-80GB: the static split's inference pool (the fewest nodes
that hold the services' peak) plus 8 nodes (`--batch-nodes`), in four variants per seed, in one run:
static split, colocated, headroom, fractional (sim/colocation.py). Prints per variant the mean over
seeds with a 95 % interval (t distribution) and the ratios against the static split of the same
seed; writes the JSON and a plot of GPU allocation over time (first seed).

    .venv/bin/python bench/colocation.py [--seeds 1,2,3] [--days 31] [--batch-nodes 8] [--workers 2] \\
        [--json bench/results/colocation.json] [--plot docs/img/colocation.png] \\
        [--variants static,colocated,headroom] [--placement best-fit] [--azure-service code|conv] \\
        [--pack on|off] [--unpacked colocated]
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpupool.cli.sim_colocate import DEFAULT_BATCH_START, DEFAULT_CLUSTER, build_setup
from gpupool.sim.colocation import VARIANTS, interval, parse_variants, run_variant

UNPACKED = "/unpacked"
"""The label suffix of a variant run without `serving.pack_replicas` (`--pack both`)."""


def one(args: argparse.Namespace, seed: int, variant: str, pack: bool = True) -> dict[str, Any]:
    setup = build_setup(None, None, args.cluster, args.batch_scale, DEFAULT_BATCH_START, seed,
                        args.headroom, args.cold_start, args.grace, args.assume_share, args.days,
                        args.service_thin, args.batch_nodes or None, args.placement, args.azure_service,
                        None, args.target, pack)
    result = run_variant(setup, variant)
    result["seed"] = seed
    result["pack"] = pack
    if not pack and variant != "static" and args.pack == "on":
        result["variant"] = variant + UNPACKED
    result["wide_jobs_left_out"] = setup.wide_jobs_left_out
    return result


METRICS = (
    ("on time %", lambda r: r["service_on_time_pct"], "{:.3f}"),
    ("ready p99 s", lambda r: r["time_to_ready_s"]["p99"], "{:.0f}"),
    ("batch GPU-h", lambda r: r["batch_gpu_hours_window"], "{:.0f}"),
    ("JCT mean h", lambda r: r["batch_jct_s"]["mean"] / 3600, "{:.2f}"),
    ("JCT p95 h", lambda r: r["batch_jct_s"]["p95"] / 3600, "{:.2f}"),
    ("unfinished", lambda r: r["batch_unfinished"], "{:.0f}"),
    ("unfinished 8-GPU", lambda r: r["batch_unfinished_by_gpus"].get("8", 0), "{:.0f}"),
    ("unfinished GPU-h", lambda r: r["batch_unfinished_gpu_hours"], "{:.0f}"),
    ("JCT mean h, unfinished to the end",
     lambda r: r["batch_jct_with_unfinished_s"]["mean"] / 3600, "{:.2f}"),
    ("preemptions", lambda r: r["preemptions"], "{:.0f}"),
    ("consolidations", lambda r: r.get("consolidations", 0), "{:.0f}"),
    ("lost GPU-h", lambda r: r["lost_batch_gpu_hours"], "{:.1f}"),
    ("$ / batch GPU-h", lambda r: r["cost"]["per_batch_gpu_hour"], "{:.3f}"),
)


def cell(values: list[float], fmt: str) -> str:
    ci = interval(values)
    return f"{fmt.format(ci['mean'])} [{fmt.format(ci['lo'])}, {fmt.format(ci['hi'])}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--days", type=float, default=None, help="only the first DAYS (default: all 31)")
    parser.add_argument("--cluster", default=DEFAULT_CLUSTER)
    parser.add_argument("--batch-scale", type=float, default=0.2)
    parser.add_argument("--service-thin", type=int, default=8)
    parser.add_argument("--batch-nodes", type=int, default=8,
                        help="pool = the static inference pool + this many nodes (0: --cluster as given)")
    parser.add_argument("--headroom", type=int, default=8)
    parser.add_argument("--cold-start", type=float, default=30.0)
    parser.add_argument("--grace", type=float, default=30.0)
    parser.add_argument("--assume-share", type=float, default=None)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated, static first for the ratios (fractional equals headroom on "
                        "this trace: every instance asks for one device)")
    parser.add_argument("--placement", default=None, help="scheduling.placement (default: the pool's)")
    parser.add_argument("--azure-service", default=None, choices=("code", "conv"),
                        help="sensitivity: one more service from the Azure LLM hour through the autoscaler, "
                        "the hour repeated over the window (an assumption)")
    parser.add_argument("--requests-only", action="store_true",
                        help="only the request-level part: the Azure LLM hour through the autoscaler")
    parser.add_argument("--pack", default="on", choices=("on", "off"),
                        help="serving.pack_replicas (replicas onto nodes in use, the emptiest node's replica "
                        "removed first) for every variant")
    parser.add_argument("--unpacked", default="",
                        help="comma-separated co-located variants also run without serving.pack_replicas in "
                        "the same run (labelled VARIANT/unpacked): the side-by-side baseline of packing")
    parser.add_argument("--target", type=float, default=4.0, help="target requests in flight a replica")
    parser.add_argument("--json", type=Path, default=Path("bench/results/colocation.json"))
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    requests = request_level(args)
    if args.requests_only:
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    started = time.perf_counter()
    variants = parse_variants(args.variants)
    if "static" not in variants:
        parser.error("--variants needs static: the ratios are against it")
    unpacked = parse_variants(args.unpacked) if args.unpacked else ()
    if "static" in unpacked or (args.pack == "off" and unpacked):
        parser.error("--unpacked names co-located variants, beside --pack on")
    # seed by seed, each seed's unpacked runs beside its own; every finished run is appended to
    # PARTIAL at once, so a run cut short still leaves what it measured
    tasks = [t for seed in seeds for t in [*((seed, v, args.pack == "on") for v in variants),
                                           *((seed, v, False) for v in unpacked)]]
    partial = args.json.with_suffix(".partial.jsonl")
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_text("")
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = [pool.submit(one, args, seed, v, p) for seed, v, p in tasks]
        for f in as_completed(futures):
            with partial.open("a") as out:
                out.write(json.dumps({k: v for k, v in f.result().items() if k != "timeline"}) + "\n")
        results = [f.result() for f in futures]
    variants = (*variants, *(v + UNPACKED for v in unpacked))
    wall = time.perf_counter() - started
    by: dict[str, dict[int, dict[str, Any]]] = {v: {} for v in variants}
    for r in results:
        by[r["variant"]][r["seed"]] = r

    console = Console(width=200)
    table = Table(title=f"colocation, seeds {args.seeds}: mean [95 % interval]")
    table.add_column("variant")
    for name, _, _ in METRICS:
        table.add_column(name, justify="right")
    summary: dict[str, Any] = {}
    for v in variants:
        runs = [by[v][s] for s in seeds]
        table.add_row(v, *[cell([get(r) for r in runs], fmt) for _, get, fmt in METRICS])
        summary[v] = {name: interval([get(r) for r in runs]) for name, get, _ in METRICS}
    console.print(table)

    ratios = Table(title="against the static split of the same seed: mean [95 % interval]")
    for col in ("variant", "batch GPU-h ratio", "JCT mean speedup", "JCT p95 speedup",
                "JCT mean speedup, unfinished to the end"):
        ratios.add_column(col, justify="right")
    vs: dict[str, Any] = {}
    for v in variants[1:]:
        gpu = [by[v][s]["batch_gpu_hours_window"] / by["static"][s]["batch_gpu_hours_window"] for s in seeds]
        jct = [by["static"][s]["batch_jct_s"]["mean"] / by[v][s]["batch_jct_s"]["mean"] for s in seeds]
        p95 = [by["static"][s]["batch_jct_s"]["p95"] / by[v][s]["batch_jct_s"]["p95"] for s in seeds]
        low = [by["static"][s]["batch_jct_with_unfinished_s"]["mean"]
               / by[v][s]["batch_jct_with_unfinished_s"]["mean"] for s in seeds]
        ratios.add_row(v, cell(gpu, "{:.3f}"), cell(jct, "{:.2f}"), cell(p95, "{:.2f}"), cell(low, "{:.2f}"))
        vs[v] = {"batch_gpu_hours_ratio": interval(gpu), "jct_mean_speedup": interval(jct),
                 "jct_p95_speedup": interval(p95), "jct_mean_speedup_with_unfinished": interval(low)}
    console.print(ratios)
    console.print(f"wall {wall:.0f} s for {len(tasks)} replays ({args.workers} worker(s))")

    args.json.parent.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    args.json.write_text(json.dumps({"config": config,
                                     "summary": summary, "vs_static": vs, "wall_s": wall,
                                     "requests": requests,
                                     "runs": results}, indent=2, default=str) + "\n")
    console.print(f"wrote {args.json}")
    if args.plot is not None:
        plot(by, seeds[0], args.plot)
        console.print(f"wrote {args.plot}")


def request_level(args: argparse.Namespace) -> dict[str, Any]:
    """Each Azure LLM 2023 service's requests through the autoscaler: the replica demand they make."""
    from gpupool.core.autoscale import AutoscalePolicy
    from gpupool.sim.datadir import require_data_dir
    from gpupool.sim.request_demand import load_requests, replica_demand

    root = require_data_dir() / "azure-llm-2023"
    policy = AutoscalePolicy(target_per_replica=args.target, min_replicas=0, max_replicas=64)
    table = Table(title=f"Azure LLM 2023 hour through the autoscaler (target {args.target:g} in flight, "
                  f"cold start {args.cold_start:g} s)")
    for col in ("service", "requests", "in flight max", "replicas max", "replicas mean", "scale events"):
        table.add_column(col, justify="right")
    out: dict[str, Any] = {}
    for name in ("code", "conv"):
        result = replica_demand(load_requests(root / f"AzureLLMInferenceTrace_{name}.csv"), policy,
                                cold_start_s=args.cold_start)
        out[name] = result
        table.add_row(name, str(result["requests"]), f"{result['in_flight_max']:.0f}",
                      str(result["replicas_max"]), f"{result['replicas_mean']:.2f}",
                      str(result["scale_events"]))
    Console(width=200).print(table)
    return out


def plot(by: dict[str, dict[int, dict[str, Any]]], seed: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(by), 1, figsize=(9, 8), sharex=True)
    for ax, v in zip(axes, by, strict=True):
        points = by[v][seed]["timeline"]
        hours = [p[0] / 3600 for p in points]
        ax.stackplot(hours, [p[1] for p in points], [p[2] for p in points], labels=["services", "batch"],
                     step="post", alpha=0.8)
        ax.axhline(by[v][seed]["devices"], color="black", linewidth=0.8)
        ax.set_ylim(max(0.0, min(p[1] for p in points) - 60), by[v][seed]["devices"] + 5)
        ax.set_ylabel(f"{v}\nGPUs")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    axes[-1].set_xlabel("hours since the services' trace start (the y axis starts below the services' least)")
    fig.suptitle(f"GPU allocation over time (seed {seed})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
