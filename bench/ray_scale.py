"""The ray provider at scale on this machine: simulated nodes joining, pod start latency and trivial
0.25-GPU jobs per second through Ray with both pod carriers, beside the local provider (a LocalPool
of the same nodes) measured in the same run.

    .venv/bin/python bench/ray_scale.py [--nodes 16] [--devices 8] [--latency-pods 40] [--jobs 100]
        [--actor-latency-pods 10] [--actor-jobs 20] [--join-parallel 1]

1. join: a Ray head, then NODES worker nodes of DEVICES simulated H100s joined JOIN_PARALLEL at a
   time, as `gpupool node join --simulate` does; per node, the seconds from the join's start until
   the provider lists the node (schedulable). Target: within 5 s of the join on a real machine (here
   every node shares two cores with all the others).
2. start latency: LATENCY_PODS pods (`true`, one 0.25 slice), one at a time, round-robin over the
   nodes; launch() to the pod's recorded start, p50 and p99: Ray with the group carrier (the
   default: a placement group per pod, the process started by the node agent), Ray with the actor
   carrier (an actor, so a Python process, per pod; ACTOR_LATENCY_PODS of them), and local.
3. throughput: JOBS trivial pods of 0.25 GPU (ACTOR_JOBS with the actor carrier), at most IN_FLIGHT
   at once, from the first launch until all have ended: jobs/s, each beside local. Provider level:
   the scheduler's own cost is measured by bench/jobs_e2e.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpupool.core.model import Slice
from gpupool.pods import PodLaunch, PodStatus
from gpupool.providers.base import Provider
from gpupool.providers.localpool import LocalPool
from gpupool.providers.nodespec import nodes_from_spec

sys.path.insert(0, str(Path(__file__).parent))
from _control_plane import write_json


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _statuses(provider: Provider) -> dict[str, PodStatus]:
    return {s.pod_id: s for s in provider.poll()}


def _wait(provider: Provider, done: Callable[[dict[str, PodStatus]], bool], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not done(_statuses(provider)):
        if time.monotonic() > deadline:
            raise SystemExit("the pods did not end in time")
        time.sleep(0.005)


def _pod(pod_id: str, node: str) -> PodLaunch:
    return PodLaunch(pod_id=pod_id, workload_id=pod_id, node=node, command=("true",),
                     slices=(Slice(0, 250, 0),))


def start_latency(provider: Provider, nodes: list[str], pods: int, tag: str) -> list[float]:
    """Seconds from launch() to the pod's recorded start, one pod at a time."""
    samples = []
    for i in range(pods):
        pod_id = f"{tag}-lat-{i}"
        launched = time.time()
        provider.launch(_pod(pod_id, nodes[i % len(nodes)]))
        _wait(provider, lambda s, p=pod_id: p in s and s[p].phase.is_final)  # type: ignore[misc]
        started = _statuses(provider)[pod_id].started_at_s
        samples.append((started or time.time()) - launched)
    return samples


def throughput(provider: Provider, nodes: list[str], jobs: int, in_flight: int, tag: str) -> float:
    """Jobs per second from the first launch until all JOBS have ended, IN_FLIGHT at a time."""
    started = time.monotonic()
    launched = 0
    while True:
        statuses = _statuses(provider)
        mine = [s for p, s in statuses.items() if p.startswith(f"{tag}-job-")]
        running = sum(1 for s in mine if not s.phase.is_final)
        while launched < jobs and running < in_flight:
            provider.launch(_pod(f"{tag}-job-{launched}", nodes[launched % len(nodes)]))
            launched += 1
            running += 1
        if launched == jobs and sum(1 for s in mine if s.phase.is_final) == jobs:
            return jobs / (time.monotonic() - started)
        time.sleep(0.005)


def join_times(ray_provider: object, count: int, devices: int, data_dir: Path, parallel: int) -> list[float]:
    from gpupool.providers.ray import RayProvider
    from gpupool.providers.ray.join import start_node
    from gpupool.providers.ray.nodeconfig import NodeConfig

    assert isinstance(ray_provider, RayProvider)
    names = [n.name for n in nodes_from_spec(f"{count}x{devices}xH100")]

    def join(name: str) -> float:
        began = time.monotonic()
        config = NodeConfig(name=name, state_dir=str(data_dir / "ray-nodes" / name),
                            simulate=f"{devices}xH100", pool_id=ray_provider.pool_id)
        joined = start_node(ray_provider.address, ray_provider.token_path, config, simulated=True)
        ray_provider.joined.append(joined)
        while name not in {n.name for n in ray_provider.nodes()}:
            time.sleep(0.01)
        listed = time.monotonic() - began
        joined.agent_ready()  # before the next measure: its pods would wait for it
        return listed

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        return list(pool.map(join, names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--latency-pods", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--actor-latency-pods", type=int, default=10)
    parser.add_argument("--actor-jobs", type=int, default=20)
    parser.add_argument("--join-parallel", type=int, default=1,
                        help="nodes joining at once (1: as one `gpupool node join` each)")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    from gpupool.providers.ray import RayProvider

    data_dir = Path(tempfile.mkdtemp(prefix="gpupool-ray-bench-"))
    os.environ.setdefault("GPUPOOL_SCRATCH_DIR", str(data_dir / "scratch"))
    console = Console()
    began = time.monotonic()
    ray_provider = RayProvider(data_dir=data_dir)
    head_s = time.monotonic() - began
    local = LocalPool(nodes_from_spec(f"{args.nodes}x{args.devices}xH100"), data_dir / "local")
    try:
        joins = join_times(ray_provider, args.nodes, args.devices, data_dir, args.join_parallel)
        names = [n.name for n in ray_provider.nodes()]
        actors = RayProvider(ray_provider.address, data_dir=data_dir, pod_carrier="actor")
        try:
            latency = {"group": start_latency(ray_provider, names, args.latency_pods, "group"),
                       "actor": start_latency(actors, names, args.actor_latency_pods, "actor"),
                       "local": start_latency(local, names, args.latency_pods, "local")}
            rate = {"group": throughput(ray_provider, names, args.jobs, args.in_flight, "group"),
                    "actor": throughput(actors, names, args.actor_jobs, args.in_flight, "actor"),
                    "local": throughput(local, names, args.jobs, args.in_flight, "local")}
        finally:
            actors.close(stop_pods=True)
    finally:
        local.close(stop_pods=True)
        ray_provider.close(stop_pods=True)
    table = Table(title=f"ray provider: {args.nodes} simulated nodes x {args.devices} H100 on this machine")
    for column in ("measure", "ray group", "ray actor", "local", "group / local", "actor / local"):
        table.add_column(column, justify="right" if column != "measure" else "left")
    table.add_row("head start (s)", f"{head_s:.1f}", "", "", "", "")
    table.add_row("join to schedulable p50 / max (s)",
                  f"{statistics.median(joins):.1f} / {max(joins):.1f}", "", "", "", "")
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        g, a_, loc = (_pct(latency[k], q) for k in ("group", "actor", "local"))
        table.add_row(f"pod start latency {label} (ms)", f"{g * 1000:.1f}", f"{a_ * 1000:.0f}",
                      f"{loc * 1000:.1f}", f"{g / loc:.1f}x", f"{a_ / loc:.0f}x")
    table.add_row(f"0.25-GPU jobs/s ({args.in_flight} in flight)", f"{rate['group']:.1f}",
                  f"{rate['actor']:.2f}", f"{rate['local']:.1f}", f"{rate['group'] / rate['local']:.2f}",
                  f"{rate['actor'] / rate['local']:.3f}")
    console.print(table)
    out = write_json(args.out, "ray_scale", {
        "nodes": args.nodes, "devices": args.devices, "head_start_s": head_s, "join_s": joins,
        "join_parallel": args.join_parallel, "start_latency_s": latency,
        "jobs": {"group": args.jobs, "actor": args.actor_jobs, "local": args.jobs},
        "in_flight": args.in_flight, "jobs_per_s": rate})
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
