"""Benchmark: an upper bound on device allocation at 100 % arrived demand in the fill protocol.

Every pod asking for more than half a device needs a device of its own, and the rest of that
device can only hold pods no larger than the hole. Whatever the placement policy, the capacity
left in those holes after the best possible filling is lost (a big pod that fails instead loses
more than its hole). The filling is bounded from above by letting small pods split across holes
and ignoring cpu, memory and models, which only make real packings worse, so the printed figure
is a true upper bound on allocation. This prints, per seed,
the pods arrived by 100 % of capacity, the hole capacity, what small pods could fill, and the
resulting bound on allocation %.

A second, tighter reference ignores only cpu, memory and models: the cutting-stock LP (the same
one `fgd-plan` solves, see core/scheduling/policies/_patterns.py) gives the fewest devices that
can hold every fractional pod arrived by 100 %, unsplit; rounded up, it says what allocation
an offline packing that places every pod reaches ("LP, all placed"). It is not a strict bound on
the fill protocol, where a pod that fails leaves no hole, but no online policy is expected to
beat it; first-fit decreasing, an offline heuristic, is printed beside it.

    .venv/bin/python bench/fill_bound.py [--workload default] [--seeds 42-51] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import Counter
from pathlib import Path
from statistics import mean

from rich.console import Console
from rich.table import Table

from gpupool.core.model import PodRequest
from gpupool.core.scheduling.policies._patterns import plan_patterns
from gpupool.core.state import ClusterState
from gpupool.core.units import MILLI
from gpupool.errors import GpupoolError
from gpupool.sim.datadir import require_data_dir
from gpupool.sim.fill import inflate, parse_seeds
from gpupool.sim.traces.openb import load_openb_nodes, load_openb_pods


def arrived_by_capacity(pods: list[PodRequest], capacity: int, seed: int) -> list[PodRequest]:
    """The fill protocol's sequence for `seed`, cut where arrived demand reaches capacity."""
    rng = random.Random(seed)
    sequence = inflate(pods, capacity, rng)
    rng.shuffle(sequence)
    out, arrived = [], 0
    for pod in sequence:
        arrived += pod.total_device_milli
        if arrived > capacity:
            break
        out.append(pod)
    return out


def bound(arrived: list[PodRequest], capacity: int) -> dict[str, float]:
    """Hole capacity, best filling by small pods, and the allocation % that remains possible."""
    big = [p.device_milli for p in arrived if p.is_fractional and p.device_milli * 2 > MILLI]
    small = [p.device_milli for p in arrived if p.is_fractional and p.device_milli * 2 <= MILLI]
    holes = sorted(MILLI - b for b in big)
    hole_total = sum(holes)
    # Fractional relaxation (pods may be split across holes): a hole of size h accepts only pods
    # no larger than h, so eligibility is nested and filling the smallest holes first with any
    # eligible volume is optimal. Its fill is an upper bound on what any real packing fills.
    small.sort()
    filled = available = j = 0
    for hole in holes:
        while j < len(small) and small[j] <= hole:
            available += small[j]
            j += 1
        take = min(hole, available)
        filled += take
        available -= take
    lost = hole_total - filled
    fractions = [p.device_milli for p in arrived if p.is_fractional]
    volume = sum(fractions)
    plan = plan_patterns(Counter(fractions))
    lp_devices = math.ceil(plan.devices_lp - 1e-9) if plan else 0
    ffd_devices = first_fit_decreasing(fractions)
    return {
        "pods": len(arrived),
        "big_fraction_pods": len(big),
        "hole_devices": hole_total / MILLI,
        "fillable_devices": filled / MILLI,
        "lost_pct": 100.0 * lost / capacity,
        "bound_pct": 100.0 - 100.0 * lost / capacity,
        "lp_devices": lp_devices,
        "lp_all_placed_pct": 100.0 - 100.0 * (lp_devices * MILLI - volume) / capacity,
        "ffd_devices": ffd_devices,
        "ffd_all_placed_pct": 100.0 - 100.0 * (ffd_devices * MILLI - volume) / capacity,
    }


def first_fit_decreasing(sizes: list[int]) -> int:
    """Devices first-fit decreasing opens for the slices (offline: it sees them all, sorted)."""
    loads: list[int] = []
    for size in sorted(sizes, reverse=True):
        for i, load in enumerate(loads):
            if load + size <= MILLI:
                loads[i] += size
                break
        else:
            loads.append(size)
    return len(loads)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="default")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--json", type=Path, default=Path("bench/results/fill_bound.json"))
    args = parser.parse_args()
    console = Console()
    try:
        data = require_data_dir()
        seeds = parse_seeds(args.seeds)
        nodes = load_openb_nodes(data / "openb" / "openb_node_list_gpu_node.csv")
        pods = load_openb_pods(data / "openb" / f"openb_pod_list_{args.workload}.csv")
    except (GpupoolError, OSError) as exc:
        console.print(f"Error: {getattr(exc, 'message', exc)}")
        return 2
    capacity = ClusterState(nodes).total_device_milli
    rows = {seed: bound(arrived_by_capacity(pods, capacity, seed), capacity) for seed in seeds}
    table = Table(title=f"Upper bound on allocation at 100 % arrived demand ({args.workload})")
    columns = ("seed", "pods", ">0.5 fraction pods", "hole devices", "fillable", "lost %", "bound %",
               "LP devices", "LP, all placed %", "FFD devices", "FFD, all placed %")
    for col in columns:
        table.add_column(col, justify="right")
    for seed, r in rows.items():
        table.add_row(
            str(seed),
            str(r["pods"]),
            str(r["big_fraction_pods"]),
            f"{r['hole_devices']:.1f}",
            f"{r['fillable_devices']:.1f}",
            f"{r['lost_pct']:.2f}",
            f"{r['bound_pct']:.2f}",
            str(r["lp_devices"]),
            f"{r['lp_all_placed_pct']:.2f}",
            str(r["ffd_devices"]),
            f"{r['ffd_all_placed_pct']:.2f}",
        )
    avg = mean(r["bound_pct"] for r in rows.values())
    lp = mean(r["lp_all_placed_pct"] for r in rows.values())
    ffd = mean(r["ffd_all_placed_pct"] for r in rows.values())
    table.add_row("mean", "", "", "", "", "", f"{avg:.2f}", "", f"{lp:.2f}", "", f"{ffd:.2f}")
    console.print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    doc = {"workload": args.workload, "mean_bound_pct": avg, "mean_lp_all_placed_pct": lp,
           "mean_ffd_all_placed_pct": ffd, "seeds": rows}
    args.json.write_text(json.dumps(doc, indent=2))
    console.print(f"JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
