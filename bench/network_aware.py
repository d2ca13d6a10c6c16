"""Benchmark: network-aware placement on the Philly trace with a communication model, beside the baselines.

Every run replays a Philly window on N nodes of 8 GPUs mapped onto a 3-level fat tree from the
generator (`--ports`-port switches, leaf oversubscription 1:1 / 2:1 / 4:1), with the
communication model of sim/comm.py as the truth (seeded classes, the share of communication-heavy
jobs set per scenario), load scaled by compressing arrival times, and optionally k leaf-spine links
failed for a period. Policies run side by side on the same jobs and seeds:

  best-fit, fgd          today's placement: no fabric known (pod by pod)
  fgd-strand             the project's default policy, fabric known, default preferred=leaf
  strict-leaf            fabric known, every gang required inside the narrowest domain that can
                         ever hold it (leaf, else spine group), unlimited wait (Kueue required)
  slurm-switches         best-fit, fabric known, preferred=leaf waiting up to 300 s (--switches=1@300)
  network-aware          the network-aware policy (fabric known, default preferred=leaf), told each
                         job's own communication ratio (EstimateMode.EXACT); pods placed as best-fit
                         (its pods=auto on whole-device work)
  network-aware-fgd-pods the same with pods=fgd-strand (the policy's pod placement before pods=auto)
  network-aware-noisy    the same, each job's ratio wrong by +/-50 % (EstimateMode.NOISY, a seeded
                         coin per job)
  network-aware-hops     the same, knowing hop counts only (EstimateMode.HOPS_ONLY): every gang
                         weighed with one assumption, the classes' mean ratio
  network-aware-telemetry  network-aware seeing link load measured every minute (the truth's pool
                         utilisation as telemetry, as the server's telemetry route gives it)
  network-aware-migrate  the same, and a gang whose bottleneck pool stays above 0.9 utilisation for
                         300 s is checkpoint-requeued (migrate_on_congestion); -migrate-30 at 0.3
  network-aware-loss     network-aware waiting for a leaf up to what spreading would cost the gang
                         (topology_wait_cap: loss), never less than 300 s
  network-aware-queue    the same with that loss counted for the queue behind the gang too
                         (topology_wait_cap: queue)
  network-aware-leaf     network-aware with fullest_leaf: best-fit's ties among nodes go to the leaf
                         with the least free share (small work fills leaves already in use)
  network-aware-nowait   network-aware that never waits for locality (max wait 0: a leaf if one is
                         free now, else spread at once)
  oracle                 fgd with no communication cost at all (the bound)
  oracle-best-fit        best-fit with no communication cost at all (the bound for best-fit packing)

The other policies are told nothing per job (hop counts only); the truth (each job's class) is the
same for every policy of a scenario and seed.

Metrics per run: JCT and queueing delay by gang size, multi-node gangs' JCT, queueing delay and
the part of it spent waiting for locality (wait-or-spread), GPU allocation (mean from first to last
arrival), effective allocation (less what communication cost), cross-leaf/spine bytes, link
utilisation, gangs across failed links. Seeds give 95 % intervals (t distribution). For the two
target scenarios (or those --detail names) it also prints, and writes to the JSON's "detail", every
gang-size bucket's (1, 2-8, 9-32, >32 GPUs) JCT mean/p50/p95/p99, queueing delay and locality wait,
and the fabric's figures: makespan, cross-leaf/spine bytes, link utilisation max/p99, gangs per
bottleneck, hops. The grid is the product of the options; --jobs runs it in parallel.

    .venv/bin/python bench/network_aware.py --oversub 1,2 --heavy 0,60 --load 1.0 --seeds 1-3 --jobs 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.model import Fabric, Link
from gpupool.core.scheduling.congestion import MigrateRule
from gpupool.core.scheduling.cycle import Policies
from gpupool.core.scheduling.locality import WaitCap
from gpupool.core.scheduling.moves import MoveRule
from gpupool.core.topology_spec import Tier, TopologySpec
from gpupool.providers.nodespec import nodes_from_spec
from gpupool.sim.comm import EstimateMode, Origin, assign_classes, default_comm_model, packed_nodes
from gpupool.sim.comm_net import CommSetup, LinkFailure
from gpupool.sim.congestion import CongestionRule
from gpupool.sim.datadir import require_data_dir
from gpupool.sim.jobs import TraceJob, in_window, parse_window, philly_jobs
from gpupool.sim.replay import Replay, ReplayConfig

REPO = Path(__file__).resolve().parents[1]
console = Console()
GPUS_PER_NODE = 8
FAIL_AT = 0.25
"""Links fail a quarter of the way into the window ..."""
FAIL_FOR_S = 7 * 86400.0
"""... for a week."""


PREFERRED_LEAF = TopologySpec(preferred=Tier.LEAF)
NOISE = 0.5
"""network-aware-noisy: each job's ratio is the truth's times 1 +/- this."""


@dataclass(frozen=True)
class Variant:
    name: str
    placement: str
    fabric: bool = True
    topology: TopologySpec | None = PREFERRED_LEAF
    max_wait_s: float = 300.0
    wait_cap: WaitCap = WaitCap.FIXED
    """How long a gang may wait for locality in all (topology_wait_cap)."""
    strict: bool = False
    comm: bool = True
    options: tuple[tuple[str, Any], ...] = ()
    estimate: EstimateMode = EstimateMode.HOPS_ONLY
    """What the scheduler is told of each job's communication ratio."""
    congestion: CongestionRule | None = None
    """Link load sampled from the truth into the scheduler's view every minute (sim/congestion.py)."""
    migrate: MigrateRule | None = None
    """The cycle moves gangs off congestion (`Policies.migrate`, the configuration's
    fabric.migrate_on_congestion)."""
    moves: MoveRule | None = None
    """Spread gangs moved into one leaf, single-node work moved to make room (core/scheduling/moves.py)."""


VARIANTS = {
    "best-fit": Variant("best-fit", "best-fit", fabric=False, topology=None),
    "fgd": Variant("fgd", "fgd", fabric=False, topology=None),
    "fgd-strand": Variant("fgd-strand", "fgd-strand"),
    "strict-leaf": Variant("strict-leaf", "fgd-strand", topology=None, strict=True),
    "slurm-switches": Variant("slurm-switches", "best-fit", max_wait_s=300.0),
    "network-aware": Variant("network-aware", "network-aware", estimate=EstimateMode.EXACT),
    "network-aware-noisy": Variant("network-aware-noisy", "network-aware", estimate=EstimateMode.NOISY),
    "network-aware-hops": Variant("network-aware-hops", "network-aware", estimate=EstimateMode.HOPS_ONLY),
    "network-aware-fgd-pods": Variant("network-aware-fgd-pods", "network-aware", estimate=EstimateMode.EXACT,
                                      options=(("pods", "fgd-strand"),)),
    "network-aware-loss": Variant("network-aware-loss", "network-aware", estimate=EstimateMode.EXACT,
                                  wait_cap=WaitCap.LOSS),
    "network-aware-queue": Variant("network-aware-queue", "network-aware", estimate=EstimateMode.EXACT,
                                   wait_cap=WaitCap.QUEUE),
    "network-aware-leaf": Variant("network-aware-leaf", "network-aware", estimate=EstimateMode.EXACT,
                                  options=(("fullest_leaf", True),)),
    "network-aware-nowait": Variant("network-aware-nowait", "network-aware", estimate=EstimateMode.EXACT,
                                    max_wait_s=0.0),
    "network-aware-move": Variant("network-aware-move", "network-aware", estimate=EstimateMode.EXACT,
                                  moves=MoveRule()),
    "network-aware-move-hops": Variant("network-aware-move-hops", "network-aware",
                                       estimate=EstimateMode.HOPS_ONLY, moves=MoveRule()),
    "network-aware-move-noisy": Variant("network-aware-move-noisy", "network-aware",
                                        estimate=EstimateMode.NOISY, moves=MoveRule()),
    "oracle": Variant("oracle", "fgd", fabric=False, topology=None, comm=False),
    "oracle-best-fit": Variant("oracle-best-fit", "best-fit", fabric=False, topology=None, comm=False),
    "network-aware-telemetry": Variant("network-aware-telemetry", "network-aware",
                                       estimate=EstimateMode.EXACT, congestion=CongestionRule()),
    "network-aware-migrate": Variant("network-aware-migrate", "network-aware",
                                     estimate=EstimateMode.EXACT, congestion=CongestionRule(),
                                     migrate=MigrateRule()),
    "network-aware-migrate-30": Variant("network-aware-migrate-30", "network-aware",
                                        estimate=EstimateMode.EXACT,
                                        congestion=CongestionRule(), migrate=MigrateRule(threshold=0.3)),
}
DEFAULT_POLICIES = "best-fit,fgd,fgd-strand,strict-leaf,slurm-switches,network-aware,oracle"


@dataclass(frozen=True)
class Scenario:
    oversub: float
    load: float
    heavy_pct: int
    failed_links: int
    seed: int


# ---------------------------------------------------------------------------------- building


@cache
def _philly(path: str, seed: int, window: str | None) -> tuple[TraceJob, ...]:
    jobs = philly_jobs(path, GPUS_PER_NODE, seed)
    return tuple(in_window(jobs, parse_window(window) if window else None))


def scaled(jobs: Sequence[TraceJob], load: float) -> list[TraceJob]:
    """Arrivals compressed (load > 1) or stretched around the first one; sizes and durations kept."""
    if not jobs or load == 1.0:
        return list(jobs)
    start = jobs[0].submit_s
    out = []
    for job in jobs:
        at = start + (job.submit_s - start) / load
        out.append(replace(job, submit_s=at, workload=replace(job.workload, submit_time_s=at)))
    return out


def fabric_for(nodes: int, oversub: float, ports: int) -> Fabric:
    """The smallest 3-level fat tree of `ports`-port switches (whole pods) with a host per node."""
    probe = fat_tree(ports, 3, oversubscription=oversub, pods=1)
    per_pod = len(probe.cas)
    pods = -(-nodes // per_pod)
    if pods > ports:
        raise SystemExit(f"{nodes} nodes need {pods} pods of {per_pod} hosts; use larger --ports.")
    return fat_tree(ports, 3, oversubscription=oversub, pods=pods)


def leaf_uplinks(fabric: Fabric, k: int, rng: random.Random) -> list[Link]:
    levels = fabric.levels
    links = [lk for lk in fabric.links if fabric.is_switch(lk.a) and fabric.is_switch(lk.b)
             and sorted((levels[lk.a], levels[lk.b])) == [0, 1]]
    return rng.sample(links, min(k, len(links)))


def strict_topology(jobs: Sequence[TraceJob], leaf_nodes: int, pod_nodes: int) -> list[TraceJob]:
    """Each gang required inside the narrowest domain that could ever hold it."""
    out = []
    for job in jobs:
        pods = job.workload.pods
        nodes = packed_nodes([p.num_devices for p in pods], GPUS_PER_NODE)
        if len(pods) < 2:
            out.append(job)
            continue
        tier = Tier.LEAF if nodes <= leaf_nodes else Tier.SPINE if nodes <= pod_nodes else None
        spec = TopologySpec(required=tier) if tier else TopologySpec()
        out.append(replace(job, workload=replace(job.workload, topology=spec)))
    return out


def run_one(task: dict[str, Any]) -> dict[str, Any]:
    """One replay: a scenario under one policy variant (runs in a worker process)."""
    from gpupool.core.scheduling.topology import FabricView

    scenario: Scenario = task["scenario"]
    variant: Variant = VARIANTS[task["variant"]]
    nodes = nodes_from_spec(f"{task['nodes']}x{GPUS_PER_NODE}xV100M32")
    fabric = fabric_for(len(nodes), scenario.oversub, task["ports"])
    jobs = scaled(_philly(task["trace"], scenario.seed, task["window"]), scenario.load)
    model = default_comm_model().with_comm_heavy(scenario.heavy_pct / 100.0)
    model = model.model_copy(update={"origin": Origin(task["origin"])})
    profiles = assign_classes(
        ((j.workload.id, packed_nodes([p.num_devices for p in j.workload.pods], GPUS_PER_NODE), True)
         for j in jobs), model, scenario.seed, variant.estimate, NOISE)
    view_probe = FabricView.from_fabric(fabric, nodes)
    leaf_nodes = int(max(len(d) for d in view_probe.domains(Tier.LEAF)))
    pod_nodes = int(max(len(d) for d in view_probe.domains(Tier.SPINE)))
    if variant.strict:
        jobs = strict_topology(jobs, leaf_nodes, pod_nodes)
    cuts: tuple[LinkFailure, ...] = ()
    if scenario.failed_links and jobs:
        span = jobs[-1].submit_s - jobs[0].submit_s
        at = jobs[0].submit_s + FAIL_AT * span
        rng = random.Random(f"links-{scenario.seed}")
        cuts = tuple(LinkFailure(at, lk.key, FAIL_FOR_S)
                     for lk in leaf_uplinks(fabric, scenario.failed_links, rng))
    options = dict(variant.options)
    if variant.placement == "network-aware":
        options.update(_scheduler_comm(model, fabric))
    policies = Policies(placement=variant.placement, placement_options=options, ordering="priority-fifo",
                        backfill=task["backfill"], topology_default=variant.topology,
                        max_locality_wait_s=variant.max_wait_s if variant.topology else math.inf,
                        locality_wait_cap=variant.wait_cap, moves=variant.moves, migrate=variant.migrate)
    config = ReplayConfig(tuple(nodes), tuple(jobs), policies, seed=scenario.seed,
                          comm=CommSetup(fabric, model, profiles) if variant.comm else None,
                          link_failures=cuts, timeline_points=50, congestion=variant.congestion)
    replay = Replay(config)
    if variant.fabric:
        replay.view.set_topology(FabricView.from_fabric(fabric, nodes))
    result = replay.run()
    result.pop("gpu_alloc_pct_timeline", None)
    result.pop("per_tenant", None)
    return {"scenario": scenario.__dict__, "variant": variant.name, "origin": task["origin"],
            "leaf_nodes": leaf_nodes, "pod_nodes": pod_nodes, "result": result, **_headline(result)}


def _scheduler_comm(model: Any, fabric: Fabric) -> dict[str, float]:
    """The network-aware policy's assumption for a job whose ratio it is not told: a 1000 MB
    all-reduce whose ratio to the compute step is the classes' mean ratio (share-weighted)."""
    ref_gbps = max(link.data_rate_gbps for _, _, link in fabric.ca_leaf.values())
    mean_ratio = sum(c.share * c.comm_ratio for c in model.classes.values())
    net_s = 2.0 * 1000e6 * 8 / (ref_gbps * 1e9)
    return {"message_mb": 1000.0, "step_compute_s": net_s / mean_ratio}


def _headline(result: dict[str, Any]) -> dict[str, float]:
    gangs = result.get("multi_pod_gangs", {})
    comm = result.get("comm", {})
    alloc = result.get("gpu_alloc_pct_mean_arrivals", result["gpu_alloc_pct_mean"])
    return {
        "jct_mean_s": result["jct_s"]["mean"],
        "gang_jct_mean_s": gangs.get("jct_s", {}).get("mean", 0.0),
        "gang_queue_p95_s": gangs.get("queue_delay_s", {}).get("p95", 0.0),
        "gang_locality_wait_mean_s": gangs.get("locality_wait_s", {}).get("mean", 0.0),
        "alloc_pct": alloc,
        "effective_alloc_pct": alloc - comm.get("lost_alloc_pct", 0.0),
        **({"idle_waiting_pct": idle["pct"]} if (idle := result.get("idle_while_waiting")) else {}),
        "in_one_leaf": comm.get("placed_in_one_leaf", 0) / max(comm.get("fit_one_leaf", 0), 1),
        "hops_mean": comm.get("hops_mean", 0.0),
        "across_failed": result.get("gangs_across_failed_links", 0),
        "congestion_moves": result.get("congestion_moves", 0),
        "moved_gangs": result.get("moves", {}).get("gangs", 0),
        "moved_others": result.get("moves", {}).get("others", 0),
        "move_cost_gpu_h": result.get("moves", {}).get("cost_gpu_hours", 0.0),
        "congestion_lost_gpu_h": result.get("congestion_lost_gpu_h", 0.0),
        "wall_s": result["wall_s"],
    }


# ---------------------------------------------------------------------------------- summary


def interval(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % interval (t distribution over seeds)."""
    from scipy.stats import t

    mean = statistics.fmean(values)
    n = len(values)
    if n < 2:
        return mean, 0.0
    return mean, float(t.ppf(0.975, n - 1)) * statistics.stdev(values) / math.sqrt(n)


KEYS = ("gang_jct_mean_s", "gang_queue_p95_s", "gang_locality_wait_mean_s", "jct_mean_s", "alloc_pct",
        "effective_alloc_pct", "idle_waiting_pct", "in_one_leaf", "hops_mean", "across_failed")
OPTIONAL = frozenset({"idle_waiting_pct"})
"""Keys that runs measured before they existed lack: averaged over the runs that have them."""


GROUP_KEY = ("oversub", "load", "heavy_pct", "failed_links", "origin", "variant")
"""What a summary row is per: a scenario without its seed, the trace's origin and the policy."""


def _groups(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """The runs by GROUP_KEY (rows without an origin count as packed)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        s = row["scenario"]
        key = (s["oversub"], s["load"], s["heavy_pct"], s["failed_links"], row.get("origin", "packed"),
               row["variant"])
        groups.setdefault(key, []).append(row)
    return groups


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (scenario without seed, variant): means and 95 % half-widths over seeds, and the
    ratio to the better of best-fit and fgd per seed."""
    groups = _groups(rows)
    out = []
    for key, members in sorted(groups.items()):
        entry: dict[str, Any] = dict(zip(GROUP_KEY, key, strict=True))
        entry["seeds"] = len(members)
        for name in KEYS:
            if name in OPTIONAL:
                present = [m[name] for m in members if name in m]
                if present:
                    entry[name], entry[name + "_ci95"] = interval(present)
                continue
            entry[name], entry[name + "_ci95"] = interval([m.get(name, 0.0) for m in members])
        ratios: dict[str, list[float]] = {"gang_jct_mean_s": [], "gang_queue_p95_s": [], "jct_mean_s": []}
        deltas = []
        idle_deltas = []  # runs from before the idle-while-waiting figure lack it
        for m in members:
            base = _baseline(groups, key, m["scenario"]["seed"])
            if base is None:
                continue
            for name, values in ratios.items():
                if base[name] > 0:
                    values.append(m[name] / base[name])
            deltas.append(m["alloc_pct"] - base["alloc_pct"])
            if "idle_waiting_pct" in m and "idle_waiting_pct" in base:
                idle_deltas.append(m["idle_waiting_pct"] - base["idle_waiting_pct"])
        for name, values in ratios.items():
            if values:
                entry[name + "_vs_best"], entry[name + "_vs_best_ci95"] = interval(values)
        if deltas:
            entry["alloc_pts_vs_best"], entry["alloc_pts_vs_best_ci95"] = interval(deltas)
        if idle_deltas:
            entry["idle_pts_vs_best"], entry["idle_pts_vs_best_ci95"] = interval(idle_deltas)
        out.append(entry)
    return out


SIZES = ("1", "2-8", "9-32", ">32")
"""The replay's `by_gang_size` buckets: GPUs per workload."""
TARGETS = ((2.0, 1.0, 60, 0), (1.0, 1.0, 0, 0))
"""The issue's two target scenarios (oversub, load, heavy %, failed links): the default of --detail."""
DETAIL_FABRIC = {
    "makespan_h": lambda r: r.get("makespan_s", 0.0) / 3600,
    "cross_leaf_tb": lambda r: r.get("cross_leaf_bytes", 0.0) / 1e12,
    "cross_spine_tb": lambda r: r.get("cross_spine_bytes", 0.0) / 1e12,
    "link_util_max": lambda r: r.get("link_util_max", 0.0),
    "link_util_p99": lambda r: r.get("link_util_p99", 0.0),
    "gangs_per_bottleneck_mean": lambda r: r.get("comm", {}).get("gangs_per_bottleneck_mean", 0.0),
    "gangs_per_bottleneck_max": lambda r: r.get("comm", {}).get("gangs_per_bottleneck_max", 0.0),
    "hops_mean": lambda r: r.get("comm", {}).get("hops_mean", 0.0),
    "comm_lost_gpu_h": lambda r: r.get("comm", {}).get("lost_gpu_hours", 0.0),
}
"""Per-run fabric figures of the detail, read from a run's replay result."""


def detail(rows: list[dict[str, Any]], scenarios: Sequence[tuple[float, float, int, int]] = TARGETS
           ) -> list[dict[str, Any]]:
    """The metrics the main table leaves out, for the chosen scenarios: per (scenario, variant) the
    means over seeds of every gang-size bucket's count, JCT (mean, p50, p95, p99), queueing delay
    (mean, p95) and locality wait (mean), and of the fabric figures (makespan, cross-leaf and
    cross-spine bytes, link utilisation max / p99, gangs per bottleneck, hops, GPU-hours lost to
    communication). Read from each run's replay result, so it works on any results JSON."""
    wanted = set(scenarios)  # 2 == 2.0 and they hash alike: integers match the runs' floats
    out = []
    for key, members in sorted(_groups(rows).items()):
        if key[:4] not in wanted:
            continue
        entry: dict[str, Any] = {**dict(zip(GROUP_KEY, key, strict=True)), "seeds": len(members)}
        results = [m.get("result", {}) for m in members]
        for name, read in DETAIL_FABRIC.items():
            entry[name] = statistics.fmean(read(r) for r in results)
        by_size: dict[str, dict[str, float]] = {}
        for size in SIZES:
            cells = [r.get("by_gang_size", {}).get(size, {}) for r in results]
            figures: dict[str, float] = {"count": statistics.fmean(c.get("count", 0) for c in cells)}
            for metric, stats in (("jct_s", ("mean", "p50", "p95", "p99")),
                                  ("queue_delay_s", ("mean", "p95")), ("locality_wait_s", ("mean",))):
                for stat in stats:
                    figures[f"{metric}_{stat}"] = statistics.fmean(c.get(metric, {}).get(stat, 0.0)
                                                                   for c in cells)
            by_size[size] = figures
        entry["by_gang_size"] = by_size
        out.append(entry)
    return out


def _baseline(groups: dict[tuple[Any, ...], list[dict[str, Any]]], key: tuple[Any, ...],
              seed: int) -> dict[str, Any] | None:
    """The better (lower multi-node gang JCT) of best-fit and fgd on the same scenario and seed."""
    found = []
    for name in ("best-fit", "fgd"):
        for m in groups.get((*key[:5], name), []):
            if m["scenario"]["seed"] == seed:
                found.append(m)
    return min(found, key=lambda m: m["gang_jct_mean_s"]) if found else None


def plot(summary: list[dict[str, Any]], out_dir: Path, stem: str) -> list[Path]:
    """One PNG per oversubscription level: multi-node gangs' mean JCT and p95 queueing delay per
    policy, one group of bars per scenario, 95 % intervals as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for oversub in sorted({e["oversub"] for e in summary}):
        rows = [e for e in summary if e["oversub"] == oversub]
        scenarios = sorted({(e["load"], e["heavy_pct"], e["failed_links"], e["origin"]) for e in rows})
        variants = list(dict.fromkeys(e["variant"] for e in rows))
        wide = max(12.0, 1.6 * len(scenarios))
        fig, axes = plt.subplots(2, 1, figsize=(wide, 8), dpi=100)
        width = 0.8 / max(len(variants), 1)
        for ax, metric, label in ((axes[0], "gang_jct_mean_s", "multi-node gangs: mean JCT (h)"),
                                  (axes[1], "gang_queue_p95_s", "multi-node gangs: p95 queueing delay (h)")):
            for i, variant in enumerate(variants):
                xs, ys, errs = [], [], []
                for j, sc in enumerate(scenarios):
                    match = [e for e in rows if e["variant"] == variant
                             and (e["load"], e["heavy_pct"], e["failed_links"], e["origin"]) == sc]
                    if match:
                        xs.append(j + i * width)
                        ys.append(match[0][metric] / 3600)
                        errs.append(match[0][metric + "_ci95"] / 3600)
                ax.bar(xs, ys, width, yerr=errs, label=variant, capsize=2)
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(scenarios))])
            ax.set_xticklabels([f"load {lo:g}\n{h} % heavy" + (f"\n{k} links down" if k else "")
                                + ("" if o == "packed" else f"\nran {o}") for lo, h, k, o in scenarios],
                               fontsize=8)
            ax.set_ylabel(label)
            ax.grid(True, axis="y", alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"Philly replay on a {oversub:g}:1 fat tree (95 % intervals over seeds)", fontsize=10)
        fig.tight_layout()
        path = out_dir / f"{stem}-{oversub:g}to1.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------- main


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _scenarios(text: str) -> list[tuple[float, float, int, int]]:
    """'oversub:load:heavy:links' items, ';'-joined (an empty text is none)."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        fields = item.split(":")
        try:
            if len(fields) != 4:
                raise ValueError
            out.append((float(fields[0]), float(fields[1]), int(fields[2]), int(fields[3])))
        except ValueError:
            raise ValueError(f"scenario {item!r} is not oversub:load:heavy:links (four numbers, e.g. "
                             f"2:1.0:60:0; heavy and links whole numbers)") from None
    return out


def _seeds(text: str) -> list[int]:
    """'1-5' or '1,3': raises ValueError (a sentence) for anything else, a reversed range included."""
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-"))
            if lo > hi:
                raise ValueError
            return list(range(lo, hi + 1))
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--seeds takes a range such as 1-5 or a list such as 1,3, got {text!r}.") from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", default="2017-10-01:2017-12-01", help="'all' for the whole trace")
    parser.add_argument("--nodes", type=int, default=64, help="nodes of 8 GPUs")
    parser.add_argument("--ports", type=int, default=8, help="switch radix of the fat tree")
    parser.add_argument("--oversub", default="1,2,4")
    parser.add_argument("--load", default="0.8,1.0,1.2")
    parser.add_argument("--heavy", default="0,30,60,100", help="communication-heavy share, %%")
    parser.add_argument("--failed-links", default="0,4", help="leaf-spine links failed for a week")
    parser.add_argument("--seeds", default="1-5")
    parser.add_argument("--policies", default=DEFAULT_POLICIES, help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--origin", default="packed", choices=[o.value for o in Origin])
    parser.add_argument("--only", default="", help="scenarios to keep: oversub:load:heavy:links, ';'-joined")
    parser.add_argument("--detail", default=";".join(":".join(f"{x:g}" for x in t) for t in TARGETS),
                        help="scenarios (as --only) whose gang-size and fabric figures are printed and "
                             "written to the JSON's 'detail'; default: the two target scenarios")
    parser.add_argument("--backfill", action="store_true",
                        help="EASY backfill on (the live pool's default; off in the recorded grid)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "network_aware.json")
    parser.add_argument("--plots", type=Path, default=REPO / "docs" / "img")
    parser.add_argument("--summarise", type=Path, help="only summarise and plot the runs in this JSON")
    args = parser.parse_args()
    try:
        only = _scenarios(args.only)
        detailed = _scenarios(args.detail)
    except ValueError as exc:
        parser.error(str(exc))
    if args.summarise is not None:
        doc = json.loads(args.summarise.read_text())
        summary = summarise(doc["runs"])
        _print(summary)
        details = detail(doc["runs"], detailed)
        _print_detail(details)
        for path in plot(summary, args.plots, args.summarise.stem):
            console.print(f"Plot: {path}")
        doc["summary"] = summary
        doc["detail"] = details
        args.summarise.write_text(json.dumps(doc, indent=1, default=str))
        return 0
    trace = require_data_dir() / "philly" / "philly-sia.csv"
    window = None if args.window == "all" else args.window
    unknown = [p for p in args.policies.split(",") if p not in VARIANTS]
    if unknown:
        console.print(f"[red]Unknown policies {unknown}; choose from {', '.join(VARIANTS)}.")
        return 2
    try:
        seeds = _seeds(args.seeds)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        axes = [_floats(text) for text in (args.oversub, args.load, args.heavy, args.failed_links)]
    except ValueError as exc:
        parser.error(f"--oversub, --load, --heavy and --failed-links take comma-separated numbers ({exc}).")
    scenarios = [Scenario(o, lo, int(h), int(k), s) for o, lo, h, k, s in itertools.product(*axes, seeds)]
    if only:
        keep = set(only)
        scenarios = [s for s in scenarios if (s.oversub, s.load, s.heavy_pct, s.failed_links) in keep]
    tasks = [{"scenario": s, "variant": v, "nodes": args.nodes, "ports": args.ports, "trace": str(trace),
              "window": window, "origin": args.origin, "backfill": args.backfill}
             for s in scenarios for v in args.policies.split(",")]
    tasks.sort(key=lambda t: t["scenario"].seed)  # seed by seed: a run stopped early has every scenario
    console.print(f"{len(tasks)} replays ({len(scenarios)} scenarios x {len(args.policies.split(','))} "
                  f"policies) on {args.jobs} processes")
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_one, t) for t in tasks]
        for done, future in enumerate(as_completed(futures), start=1):
            row = future.result()
            rows.append(row)
            s = row["scenario"]
            console.print(f"  [{done}/{len(tasks)}] {s['oversub']:g}:1 load {s['load']} "
                          f"heavy {s['heavy_pct']} % links {s['failed_links']} seed {s['seed']} "
                          f"{row['variant']}: gang JCT "
                          f"{row['gang_jct_mean_s'] / 3600:.2f} h ({row['wall_s']:.0f} s)")
            _write(args, rows, started)
    summary = summarise(rows)
    _print(summary)
    details = detail(rows, detailed)
    _print_detail(details)
    for path in plot(summary, args.plots, args.json.stem):
        console.print(f"Plot: {path}")
    _write(args, rows, started, summary, details)
    return 0


def _write(args: argparse.Namespace, rows: list[dict[str, Any]], started: float,
           summary: list[dict[str, Any]] | None = None, details: list[dict[str, Any]] | None = None) -> None:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    doc = {"command": " ".join(sys.argv), "wall_s": time.perf_counter() - started,
           "summary": summary, "detail": details, "runs": rows}
    args.json.write_text(json.dumps(doc, indent=1, default=str))


def _print(summary: list[dict[str, Any]]) -> None:
    table = Table(title="Multi-node gangs and allocation, mean over seeds (vs the better of best-fit/fgd)")
    for column in ("fabric", "load", "heavy", "links", "policy", "gang JCT h", "vs best", "gang q p95 h",
                   "vs best", "gang locality wait min", "alloc %", "Δ pts", "eff. alloc %",
                   "idle waiting %", "Δ pts", "1-leaf", "across failed"):
        table.add_column(column, justify="right")
    for e in summary:
        table.add_row(
            f"{e['oversub']:g}:1", f"{e['load']:g}", f"{e['heavy_pct']}", f"{e['failed_links']}",
            f"{e['variant']}{'' if e['origin'] == 'packed' else ' (' + e['origin'] + ')'}",
            f"{e['gang_jct_mean_s'] / 3600:.2f}±{e['gang_jct_mean_s_ci95'] / 3600:.2f}",
            f"{e.get('gang_jct_mean_s_vs_best', float('nan')):.3f}",
            f"{e['gang_queue_p95_s'] / 3600:.2f}", f"{e.get('gang_queue_p95_s_vs_best', float('nan')):.3f}",
            f"{e['gang_locality_wait_mean_s'] / 60:.1f}",
            f"{e['alloc_pct']:.1f}", f"{e.get('alloc_pts_vs_best', float('nan')):+.2f}",
            f"{e['effective_alloc_pct']:.1f}", f"{e.get('idle_waiting_pct', float('nan')):.2f}",
            f"{e.get('idle_pts_vs_best', float('nan')):+.2f}", f"{e['in_one_leaf']:.2f}",
            f"{e['across_failed']:.1f}",
        )
    console.print(table)


def _print_detail(entries: list[dict[str, Any]]) -> None:
    if not entries:
        return
    sizes = Table(title="By gang size (GPUs per workload), mean over seeds: JCT and queueing delay in hours")
    for column in ("scenario", "policy", "size", "count", "JCT mean", "p50", "p95", "p99", "queue mean",
                   "queue p95", "locality wait"):
        sizes.add_column(column, justify="right")
    hours = ("jct_s_mean", "jct_s_p50", "jct_s_p95", "jct_s_p99", "queue_delay_s_mean", "queue_delay_s_p95",
             "locality_wait_s_mean")
    fabric = Table(title="Fabric, mean over seeds")
    for column in ("scenario", "policy", "makespan h", "cross-leaf TB", "cross-spine TB", "link util max",
                   "p99", "gangs/bottleneck mean", "max", "hops", "comm-lost GPU-h"):
        fabric.add_column(column, justify="right")
    for e in entries:
        label = f"{e['oversub']:g}:1 {e['load']:g} {e['heavy_pct']}% {e['failed_links']}"
        for size, f in e["by_gang_size"].items():
            if not f["count"]:
                continue
            sizes.add_row(label, e["variant"], size, f"{f['count']:.0f}",
                          *(f"{f[k] / 3600:.2f}" for k in hours))
        fabric.add_row(label, e["variant"], f"{e['makespan_h']:.1f}", f"{e['cross_leaf_tb']:.0f}",
                       f"{e['cross_spine_tb']:.0f}", f"{e['link_util_max']:.3f}", f"{e['link_util_p99']:.3f}",
                       f"{e['gangs_per_bottleneck_mean']:.2f}", f"{e['gangs_per_bottleneck_max']:.1f}",
                       f"{e['hops_mean']:.2f}", f"{e['comm_lost_gpu_h']:.0f}")
    console.print(sizes)
    console.print(fabric)


if __name__ == "__main__":
    raise SystemExit(main())
