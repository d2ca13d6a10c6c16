"""Benchmark: latency of one scheduling cycle (`run_cycle`) on a 1,000-node / 8,000-device snapshot.

The snapshot is a pool filled to the brim with running work (OpenB-like shapes: fractional slices,
whole devices, 2- and 8-device gangs) and 1,000 pending workloads of the same mix. Target: median
under 50 ms. Each configuration is timed over --repeat cycles on a fresh copy of the inputs.

    python bench/cycle_latency.py [--repeat 15] [--policies fgd-strand,first-fit] [--gc server|default]
        [--json OUT.json]

The first placement policy is the project's default (`Policies()`); the load average of the
machine is recorded beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpupool import gc_tuning
from gpupool.core.model import ClusterSnapshot, Device, Node, PodRequest, Workload
from gpupool.core.quota import QuotaConfig, devices_milli
from gpupool.core.scheduling.cycle import Policies, run_cycle
from gpupool.core.scheduling.policies.base import DEFAULT_POLICY, policy_names

SHAPES = ((1, 250), (1, 500), (1, 1000), (2, 1000), (8, 1000))
WEIGHTS = (25, 25, 35, 10, 5)
TENANTS = [f"team-{i}" for i in range(8)]


def _nodes(count: int) -> list[Node]:
    return [
        Node(
            name=f"n{i:04d}",
            cpu_milli=96_000,
            memory_mib=786_432,
            devices=tuple(Device(f"n{i}-d{d}", "V100M32", d, 32_768) for d in range(8)),
        )
        for i in range(count)
    ]


def _workload(i: int, rng: random.Random, submit_s: float) -> Workload:
    num, milli = rng.choices(SHAPES, WEIGHTS)[0]
    pod = PodRequest("p0", cpu_milli=4000 * num, memory_mib=16_384 * num, num_devices=num, device_milli=milli)
    return Workload(
        id=f"w{i}",
        pods=(pod,),
        tenant=rng.choice(TENANTS),
        priority_class=rng.choice(("high", "normal", "normal", "best-effort")),
        submit_time_s=submit_s,
        runtime_estimate_s=rng.uniform(600, 36_000),
    )


def build(nodes: int, pending: int, seed: int) -> tuple[ClusterSnapshot, list[Workload]]:
    """The pool filled by a first cycle (more work than fits), plus `pending` waiting workloads.

    A queue of 1,000 exists only when the pool is (nearly) full, so that is the state measured.
    """
    rng = random.Random(seed)
    snapshot = ClusterSnapshot(tuple(_nodes(nodes)))
    filler = [_workload(i, rng, 0.0) for i in range(nodes * 8)]
    first = run_cycle(snapshot, filler, Policies(placement="first-fit"), 0.0, random.Random(seed))
    by_id = {w.id: w for w in filler}
    from gpupool.core.model import Allocation

    allocations = tuple(Allocation(by_id[a.workload_id], a.placements, 0.0) for a in first.admitted)
    waiting = [_workload(100_000 + i, rng, 100.0 + i) for i in range(pending)]
    return ClusterSnapshot(snapshot.nodes, allocations), waiting


def time_cycles(
    snapshot: ClusterSnapshot, pending: list[Workload], policies: Policies, repeat: int
) -> list[float]:
    out = []
    for k in range(repeat):
        start = time.perf_counter()
        run_cycle(snapshot, pending, policies, 3600.0, random.Random(k))
        out.append(1000.0 * (time.perf_counter() - start))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policies", default=f"{DEFAULT_POLICY},first-fit")
    parser.add_argument("--json", type=Path, default=Path("bench/results/cycle_latency.json"))
    parser.add_argument(
        "--gc",
        choices=("server", "default"),
        default="server",
        help="server: the garbage-collector settings `gpupool up` runs with (gpupool/gc_tuning.py); "
        "default: CPython's own.",
    )
    args = parser.parse_args()
    console = Console()
    placements = [p for p in args.policies.split(",") if p]
    unknown = [p for p in placements if p not in policy_names()]
    if unknown:
        console.print(
            f"Error: unknown placement policies {unknown}; choose from {', '.join(policy_names())}."
        )
        return 2
    snapshot, pending = build(args.nodes, args.pending, args.seed)
    if args.gc == "server":
        gc_tuning.tune()
    quota = QuotaConfig.per_tenant(
        {t: {"device_milli": devices_milli(args.nodes * 8 / len(TENANTS))} for t in TENANTS}
    )
    configs = []
    for placement in placements:
        configs += [
            (f"{placement}, priority-fifo", Policies(placement=placement)),
            (
                f"{placement}, drf + quota + preemption + backfill",
                Policies(placement=placement, ordering="drf", quota=quota, preemption=True, backfill=True),
            ),
        ]
    table = Table(
        title=f"One cycle: {args.nodes} nodes / {args.nodes * 8} devices, "
        f"{len(snapshot.allocations)} running, {len(pending)} pending (target: median < 50 ms), "
        f"{args.gc} GC settings"
    )
    for column in ("configuration", "median ms", "p90 ms", "min ms"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    rows = []
    for name, policies in configs:
        ms = sorted(time_cycles(snapshot, pending, policies, args.repeat))
        row = {
            "configuration": name,
            "median_ms": statistics.median(ms),
            "p90_ms": ms[int(0.9 * (len(ms) - 1))],
            "min_ms": ms[0],
        }
        rows.append(row)
        table.add_row(name, f"{row['median_ms']:.1f}", f"{row['p90_ms']:.1f}", f"{row['min_ms']:.1f}")
    console.print(table)
    load = os.getloadavg()
    console.print(f"Load average (1, 5, 15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "nodes": args.nodes,
                "pending": len(pending),
                "running": len(snapshot.allocations),
                "rows": rows,
                "load_average": list(load),
                "gc": args.gc,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
