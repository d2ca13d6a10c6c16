"""One full pass with a tenant's many gangs of distinct shapes waiting: the core cycle's CPU time.

    .venv/bin/python bench/gang_shapes.py [--nodes 1000] [--pending 1000] [--gangs 500,2000]
        [--config default] [--json OUT.json]

The pool of bench/cycle_latency.py (`--nodes` x 8 V100, filled by a first cycle) with its
`--pending` ordinary workloads waiting, and beside them one tenant's gangs of two 5-GPU pods, each
of another memory request (1 MiB apart, so no two share a shape), none of which fits the full pool
now but each of which fits the empty pool. Before each gang's first consideration the cycle asks
whether it could ever fit (`cycle.py` `_never_fits`, cached per shape); the anchor is the same
number of gangs of one shape. Each figure is the median of `--repeat` fresh cycles (`run_cycle`,
the configuration's policies), in the process's CPU time. Compare commits with
bench/side_by_side.py --metric distinct_<N>_ms.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cycle_latency
from gpupool.config import load_config
from gpupool.core.model import PodRequest, Workload
from gpupool.core.scheduling.cycle import run_cycle


def _gang(i: int, distinct: bool) -> Workload:
    memory = 16_384 + (i if distinct else 0)
    pods = tuple(PodRequest(f"p{k}", cpu_milli=4000, memory_mib=memory, num_devices=5, device_milli=1000)
                 for k in range(2))
    return Workload(id=f"gang{i}", pods=pods, tenant="many-shapes", submit_time_s=50.0 + i / 1000,
                    runtime_estimate_s=3600.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="nodes of 8 devices")
    parser.add_argument("--pending", type=int, default=1000, help="ordinary workloads waiting beside them")
    parser.add_argument("--gangs", default="500,2000", help="comma-separated counts of gangs to time")
    parser.add_argument("--repeat", type=int, default=3, help="cycles timed per figure (median)")
    parser.add_argument("--config", default="default", help="a configuration file, or `default`")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    policies = load_config(None if args.config == "default" else args.config).policies()
    snapshot, ordinary = cycle_latency.build(args.nodes, args.pending, seed=1)
    results: dict[str, object] = {"nodes": args.nodes, "pending": args.pending, "config": args.config}
    table = Table(title=f"one full pass, {args.nodes:,} nodes, {args.pending:,} ordinary workloads waiting, "
                        f"CPU ms (median of {args.repeat})")
    for column in ("gangs", "of one shape", "of distinct shapes", "distinct / one"):
        table.add_column(column, justify="right")
    for count in (int(c) for c in args.gangs.split(",")):
        figures = {}
        for distinct in (False, True):
            pending = [_gang(i, distinct) for i in range(count)] + ordinary
            times = []
            for _ in range(args.repeat):
                start = time.process_time()
                run_cycle(snapshot, pending, policies, 200.0, random.Random(1))
                times.append(1000 * (time.process_time() - start))
            figures[distinct] = statistics.median(times)
        results[f"same_{count}_ms"] = figures[False]
        results[f"distinct_{count}_ms"] = figures[True]
        table.add_row(f"{count:,}", f"{figures[False]:.1f}", f"{figures[True]:.1f}",
                      f"{figures[True] / figures[False]:.2f}")
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
