"""The FGD paper's `fill` protocol: inflate, shuffle, place-or-fail, allocation against arrived demand.

1. The cluster is the node list, empty. 2. The pod list is inflated with a seeded RNG: pods are
drawn uniformly with replacement and cloned until the total requested device capacity would
exceed `ratio` (1.3) x the cluster's (a list that already asks for more loses random pods
instead). 3. The list is shuffled with the same RNG and submitted one pod at a time; each pod is
placed at once or fails (no admission control, no queue) and pods never leave. 4. After every pod,
allocated device milli and cumulative requested ("arrived") device milli are recorded; the curve
is the allocation % at every integer percent 0-130 of arrived demand, measured the way the
paper's analysis scripts measure it: each pod's arrived % is rounded to an integer (half to even),
allocation % to two decimals, and the value at x is the mean over pods whose arrived % is x (or,
when none is, within x +- 1), rounded to two decimals.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gpupool.core.fabric.model import Fabric
from gpupool.core.model import Node, PodRequest
from gpupool.core.scheduling.policies.base import Choice, make_policy
from gpupool.core.scheduling.topology import FabricView, TopologyContext
from gpupool.core.state import ClusterState
from gpupool.core.units import MILLI

INFLATION_RATIO = 1.3
MAX_PERCENT = 130
SEEDS = tuple(range(42, 52))
MAX_SEEDS = 1000
"""Most seeds one fill takes: each is a run of seconds per policy (about 10 for fgd-plan on OpenB's
default trace), so 1,000 is hours of work; a range past it is a typo (0-999999999), refused before
the list is built."""


@dataclass(frozen=True, slots=True)
class FillResult:
    """One fill run: the allocation % at arrived demand 0..130 % and what it took."""

    policy: str
    seed: int
    alloc_pct: tuple[float, ...]
    wall_s: float
    pods: int
    placed: int
    failed: int

    def at(self, percent: int) -> float:
        return self.alloc_pct[percent]


def inflate(
    pods: Sequence[PodRequest], capacity_milli: int, rng: random.Random, ratio: float = INFLATION_RATIO
) -> list[PodRequest]:
    """Clone seeded random pods until the next would push demand past ratio x capacity (or trim)."""
    out = list(pods)
    target = ratio * capacity_milli
    total = sum(p.total_device_milli for p in out)
    if not out:
        return out
    if total > target:
        while out and total > target:
            total -= out.pop(rng.randrange(len(out))).total_device_milli
        return out
    while True:
        pod = pods[rng.randrange(len(pods))]
        if total + pod.total_device_milli > target:
            return out
        out.append(pod)
        total += pod.total_device_milli
        if pod.total_device_milli == 0 and len(out) > 100 * len(pods):
            return out  # a trace without device demand never reaches the target


def allocation_curve(
    arrived_milli: npt.NDArray[np.int64], used_milli: npt.NDArray[np.int64], capacity_milli: int
) -> tuple[float, ...]:
    """Allocation % at every integer arrived % 0..130, as the paper's analysis computes it.

    A percent with no sample nearby repeats the previous value (0.0 before the first).
    """
    devices = capacity_milli / MILLI
    arrived_pct = np.round(arrived_milli / devices / 10.0)
    alloc_pct = np.round(used_milli / devices / 10.0, 2)
    out: list[float] = []
    for x in range(MAX_PERCENT + 1):
        sel = arrived_pct == x
        if not sel.any():
            sel = (arrived_pct >= x - 1) & (arrived_pct <= x + 1)
        if sel.any():
            out.append(round(float(alloc_pct[sel].mean()), 2))
        else:
            out.append(out[-1] if out else 0.0)
    return tuple(out)


def fill(
    nodes: Sequence[Node],
    pods: Sequence[PodRequest],
    policy: str,
    seed: int,
    options: Mapping[str, Any] | None = None,
    ratio: float = INFLATION_RATIO,
    fabric: Fabric | None = None,
) -> FillResult:
    """Run the fill protocol once with the named placement policy and seed.

    With `fabric` the policy is bound to the nodes' places in it (`FabricView.from_fabric`); the
    protocol places single pods, which no topology constraint binds, so only a policy that reads the
    fabric for single pods could place differently."""
    started = time.perf_counter()
    rng = random.Random(seed)
    state = ClusterState(nodes)
    capacity = state.total_device_milli
    sequence = inflate(pods, capacity, rng, ratio)
    rng.shuffle(sequence)
    placer = make_policy(policy, **dict(options or {}))
    if fabric is not None:
        placer.bind_topology(TopologyContext(FabricView.from_fabric(fabric, nodes)))
    placer.prepare(state, pods)
    policy_rng = random.Random(rng.getrandbits(64))
    arrived = np.zeros(len(sequence), dtype=np.int64)
    used = np.zeros(len(sequence), dtype=np.int64)
    arrived_total = used_total = placed = 0
    for i, pod in enumerate(sequence):
        arrived_total += pod.total_device_milli
        choice = placer.place(pod, state, policy_rng)
        if isinstance(choice, Choice):
            record = state.make_alloc(pod, choice.node, choice.devices)
            state.allocate(record)
            used_total += sum(record.device_milli)
            placed += 1
        arrived[i] = arrived_total
        used[i] = used_total
    curve = allocation_curve(arrived, used, capacity) if capacity else (0.0,) * (MAX_PERCENT + 1)
    return FillResult(
        policy=policy,
        seed=seed,
        alloc_pct=curve,
        wall_s=time.perf_counter() - started,
        pods=len(sequence),
        placed=placed,
        failed=len(sequence) - placed,
    )


@dataclass(frozen=True, slots=True)
class FillJob:
    """One run to do in a worker process: files are read (once per process) by the worker."""

    nodes_path: str
    pods_path: str
    policy: str
    seed: int
    options: Mapping[str, Any] = field(default_factory=dict)
    fabric_path: str | None = None


def load_fabric_file(path: str) -> Fabric:
    """A fabric from an ibnetdiscover (or ibsim net) file, such as `gpupool fabric generate` writes
    (parsed once per process while the file is unchanged)."""
    stat = Path(path).stat()
    return _parse_fabric(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=4)
def _parse_fabric(path: str, mtime_ns: int, size: int) -> Fabric:
    from gpupool.core.fabric.parse import parse_topology

    return parse_topology(Path(path).read_text(errors="replace"), source=path)


@lru_cache(maxsize=8)
def _load(nodes_path: str, pods_path: str) -> tuple[tuple[Node, ...], tuple[PodRequest, ...]]:
    from gpupool.sim.traces.openb import load_openb_nodes, load_openb_pods

    return tuple(load_openb_nodes(Path(nodes_path))), tuple(load_openb_pods(Path(pods_path)))


def run_job(job: FillJob) -> FillResult:
    """Run one FillJob (picklable entry point for process pools)."""
    nodes, pods = _load(job.nodes_path, job.pods_path)
    fabric = load_fabric_file(job.fabric_path) if job.fabric_path else None
    return fill(nodes, pods, job.policy, job.seed, job.options, fabric=fabric)


def run_jobs(
    jobs: Sequence[FillJob], workers: int = 1, on_done: Callable[[FillResult], None] | None = None
) -> list[FillResult]:
    """Run fill jobs (in `workers` processes when > 1); results come back in job order."""
    results: list[FillResult | None] = [None] * len(jobs)
    if workers <= 1 or len(jobs) <= 1:
        for i, job in enumerate(jobs):
            results[i] = run_job(job)
            if on_done:
                on_done(results[i])  # type: ignore[arg-type]
        return [r for r in results if r is not None]
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_job, job): i for i, job in enumerate(jobs)}
        for future in as_completed(futures):
            result = future.result()
            results[futures[future]] = result
            if on_done:
                on_done(result)
    return [r for r in results if r is not None]


def parse_seeds(text: str) -> list[int]:
    """'42-51' -> 42..51, '42,45,50-51' -> [42, 45, 50, 51]; raise InvalidInput on anything else."""
    import re

    from gpupool.errors import InvalidInput

    seeds: dict[int, None] = {}
    for part in (p.strip() for p in text.split(",")):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match or (match.group(2) and int(match.group(2)) < int(match.group(1))):
            raise InvalidInput(
                f"Cannot read seeds {text!r}; write a range such as 42-51 or a list such as 42,43,50-51."
            )
        lo = int(match.group(1))
        hi = int(match.group(2) or lo)
        # counted before the range is built (0-999999999 would fill memory), a seed listed twice once
        if len(seeds) + (hi - lo + 1) - sum(lo <= seed <= hi for seed in seeds) > MAX_SEEDS:
            many = f"{hi - lo + 1:,}" if part == text.strip() else f"more than {MAX_SEEDS:,}"
            raise InvalidInput(
                f"Seeds {text!r} name {many} seeds, but a fill takes at most {MAX_SEEDS:,} (each is a "
                "run of every policy, seconds each); give a shorter range or list, such as 42-51."
            )
        seeds.update(dict.fromkeys(range(lo, hi + 1)))
    return list(seeds)
