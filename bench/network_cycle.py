"""Benchmark: a live cycle's latency with the fabric in the view, network-aware beside fgd-strand.

A 1,000-node / 8,000-device pool is mapped onto a 3-level fat tree (k=16: 1,024 hosts, 8 per leaf,
64 per pod), filled by a first cycle with a mix of fractional slices, whole devices and multi-node
gangs (2 and 4 nodes of 8 devices), and --pending workloads of the same mix wait (10,000 by
default). Then a scheduler's loop runs on a kept view: before each cycle --churn running workloads
finish and as many arrive. Each row times the same loop (same seed, same arrivals), the rows
taking turns cycle by cycle:

* fgd-strand, no fabric: the placement before this work (the baseline);
* fgd-strand, fabric: the default policy with the fabric bound (gangs preferred=leaf);
* network-aware, fabric: the network-aware policy.

The table gives the median and p90 cycle in ms (wall) and the median in CPU ms (process time: steadier
on a busy machine), each with its ratio to the first row; the collector runs with the server's
settings (gpupool/gc_tuning.py). `--rows baseline` alone runs on commits from before the fabric
was in the view, so bench/side_by_side.py can compare the no-fabric path before and after:

    python bench/side_by_side.py --ref REF --metric cpu_median_ms -- bench/network_cycle.py --rows baseline

    python bench/network_cycle.py [--nodes 1000] [--pending 10000] [--repeat 7] [--churn 10]
        [--rows baseline,strand-fabric,network-aware] [--json bench/results/network_cycle.json]
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
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.model import ClusterSnapshot, Device, Node, PodRequest, Workload
from gpupool.core.scheduling.cycle import Policies, cycle_on
from gpupool.core.scheduling.view import ClusterView

SHAPES = ((1, 1, 250), (1, 1, 500), (1, 1, 1000), (1, 2, 1000), (1, 8, 1000), (2, 8, 1000), (4, 8, 1000))
"""(pods, devices per pod, milli per device)."""
WEIGHTS = (25, 25, 30, 10, 4, 4, 2)


def nodes_of(count: int) -> list[Node]:
    return [Node(f"n{i:04d}", 96_000, 786_432,
                 tuple(Device(f"n{i}-d{d}", "V100M32", d, 32_768) for d in range(8))) for i in range(count)]


def workload(i: int, rng: random.Random, submit_s: float) -> Workload:
    pods, num, milli = rng.choices(SHAPES, WEIGHTS)[0]
    return Workload(
        id=f"w{i}",
        pods=tuple(PodRequest(f"p{k}", 4000 * num, 16_384 * num, num, milli) for k in range(pods)),
        submit_time_s=submit_s,
        runtime_estimate_s=rng.uniform(600, 36_000),
    )


class Loop:
    """One configuration's scheduler loop, stepped one cycle at a time (rows take turns)."""

    def __init__(self, nodes: list[Node], policy: str, fabric: bool, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.view = ClusterView.from_snapshot(ClusterSnapshot(tuple(nodes)))
        if fabric:  # imported here: `--rows baseline` runs on commits without it (bench/side_by_side.py)
            from gpupool.core.scheduling.topology import FabricView

            self.view.set_topology(FabricView.from_fabric(fat_tree(16, levels=3), nodes))
        self.policies = Policies(placement=policy)
        filler = [workload(i, self.rng, 0.0) for i in range(len(nodes) * 8)]
        cycle_on(self.view, filler, self.policies, 0.0, random.Random(args.seed))
        pending = (workload(100_000 + i, self.rng, 100.0 + i) for i in range(args.pending))
        self.waiting = {w.id: w for w in pending}
        self.serial, self.now, self.k = 200_000, 3600.0, 0
        self.times: list[float] = []
        self.cpu: list[float] = []

    def step(self) -> None:
        view, rng, args = self.view, self.rng, self.args
        for wid in rng.sample(sorted(view.running), min(args.churn, len(view.running))):
            view.remove(wid)
        for _ in range(args.churn):
            w = workload(self.serial, rng, self.now)
            self.serial += 1
            self.waiting[w.id] = w
        tick, cpu = time.perf_counter(), time.process_time()
        result = cycle_on(view, list(self.waiting.values()), self.policies, self.now, random.Random(self.k))
        if self.k >= args.warmup:
            self.times.append(1000.0 * (time.perf_counter() - tick))
            self.cpu.append(1000.0 * (time.process_time() - cpu))
        for admission in result.admitted:
            del self.waiting[admission.workload_id]
        self.now += 10.0
        self.k += 1

    def summary(self) -> dict[str, float]:
        times = sorted(self.times)
        topology = getattr(self.view, "topology", None)
        return {"median_ms": statistics.median(times), "p90_ms": times[int(0.9 * (len(times) - 1))],
                "cpu_median_ms": statistics.median(self.cpu),
                "running": len(self.view.running), "gangs_on_fabric": len(topology.gangs) if topology else 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--churn", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rows", default="baseline,strand-fabric,network-aware",
                        help="which rows, in order: baseline, strand-fabric, network-aware")
    parser.add_argument("--json", type=Path, default=Path("bench/results/network_cycle.json"))
    args = parser.parse_args()
    nodes = nodes_of(args.nodes)
    every = {"baseline": ("fgd-strand, no fabric", "fgd-strand", False),
             "strand-fabric": ("fgd-strand, fabric", "fgd-strand", True),
             "network-aware": ("network-aware, fabric", "network-aware", True)}
    rows = [every[key] for key in args.rows.split(",")]
    loops = {label: Loop(nodes, policy, fabric, args) for label, policy, fabric in rows}
    gc_tuning.tune()  # the server's collector settings, once the long-lived heaps are built
    for _ in range(args.warmup + args.repeat):
        for each in loops.values():  # the rows take turns, so the machine's noise hits them alike
            each.step()
    results = {label: each.summary() for label, each in loops.items()}
    first = results[rows[0][0]]
    table = Table(title=f"cycle latency, {args.nodes} nodes, {args.pending} pending (kept view)")
    columns = ("configuration", "median ms", "p90 ms", "x first", "cpu median ms", "x first (cpu)",
               "gangs on fabric")
    for column in columns:
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for label, row in results.items():
        row["ratio"] = row["median_ms"] / first["median_ms"]
        row["cpu_ratio"] = row["cpu_median_ms"] / first["cpu_median_ms"]
        table.add_row(label, f"{row['median_ms']:.1f}", f"{row['p90_ms']:.1f}", f"{row['ratio']:.2f}",
                      f"{row['cpu_median_ms']:.1f}", f"{row['cpu_ratio']:.2f}", str(row["gangs_on_fabric"]))
    Console().print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    document = {"args": {k: str(v) for k, v in vars(args).items()}, "loadavg": os.getloadavg(),
                "results": results, "median_ms": first["median_ms"], "cpu_median_ms": first["cpu_median_ms"]}
    args.json.write_text(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
