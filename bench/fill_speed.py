"""Benchmark: wall time of one `fill` run of the OpenB default trace per placement policy.

The anchor is the FGD paper's Go simulator, which needs about 10 minutes per run on 2 vCPUs (as the
shared data README reports; it cannot run here). Target: fgd under 10 s.

    python bench/fill_speed.py [--policies fgd,best-fit] [--seed 42] [--json bench/results/fill_speed.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpupool.core.scheduling.policies.base import policy_names
from gpupool.errors import GpupoolError
from gpupool.sim.datadir import require_data_dir
from gpupool.sim.fill import fill
from gpupool.sim.traces.openb import load_openb_nodes, load_openb_pods

GO_SIMULATOR_S = 600.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default=",".join(policy_names()))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", type=Path, default=Path("bench/results/fill_speed.json"))
    args = parser.parse_args()
    console = Console()
    try:
        data = require_data_dir()
    except GpupoolError as exc:
        console.print(f"Error: {exc.message}")
        return 2
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in policy_names()]
    if unknown:
        console.print(f"Error: unknown policies {unknown}; choose from {', '.join(policy_names())}.")
        return 2
    nodes = load_openb_nodes(data / "openb" / "openb_node_list_gpu_node.csv")
    pods = load_openb_pods(data / "openb" / "openb_pod_list_default.csv")
    table = Table(title=f"One fill run of openb_pod_list_default (seed {args.seed}), this machine")
    for column in ("policy", "wall s", "pods", "placed", "alloc % @100", "vs Go simulator (~600 s)"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    rows = []
    for policy in policies:
        result = fill(nodes, pods, policy, args.seed)
        rows.append(
            {
                "policy": policy,
                "wall_s": round(result.wall_s, 2),
                "pods": result.pods,
                "placed": result.placed,
                "alloc_100": result.at(100),
            }
        )
        table.add_row(
            policy,
            f"{result.wall_s:.2f}",
            str(result.pods),
            str(result.placed),
            f"{result.at(100):.2f}",
            f"{GO_SIMULATOR_S / result.wall_s:.0f}x faster",
        )
    console.print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"seed": args.seed, "runs": rows}, indent=1) + "\n")
    console.print(f"JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
