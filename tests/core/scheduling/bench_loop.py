"""The cycle benchmark's loop (bench/cycle_latency.py), scaled down, for tests that compare a fast
path with its plain form cycle by cycle: a kept view, work ending and arriving before each cycle,
the admissions started and the preempted requeued."""

from __future__ import annotations

import random
import sys
from pathlib import Path

from gpupool.config import load_config
from gpupool.core.model import Allocation, ClusterSnapshot
from gpupool.core.scheduling.cycle import CycleResult, Policies
from gpupool.core.scheduling.keeper import ViewKeeper

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import cycle_latency

ROOT = Path(__file__).resolve().parents[3]


def bench_loop(policies: Policies, cycles: int, *, nodes: int, pending: int, seed: int, churn_seed: int,
               churn: int) -> list[tuple[CycleResult, object]]:
    """Per cycle its result and the state of the cycle's rng after it."""
    snapshot, waiting_list = cycle_latency.build(nodes, pending, seed=seed)
    rng = random.Random(churn_seed)
    keeper = ViewKeeper()
    running = {a.workload.id: a for a in snapshot.allocations}
    waiting = {w.id: w for w in waiting_list}
    now, serial, out = 3600.0, 500_000, []
    for k in range(cycles):
        for wid in rng.sample(sorted(running), min(churn, len(running))):
            del running[wid]
        for _ in range(churn):
            w = cycle_latency._workload(serial, rng, now)
            serial += 1
            waiting[w.id] = w
        current = ClusterSnapshot(snapshot.nodes, tuple(running.values()))
        draws = random.Random(k)
        result = keeper.cycle(current, list(waiting.values()), policies, now, draws)
        for stop in result.preempted:
            waiting[stop.workload_id] = running.pop(stop.workload_id).workload
        for admission in result.admitted:
            w = waiting.pop(admission.workload_id)
            running[w.id] = Allocation(w, admission.placements, now)
        out.append((result, draws.getstate()))
        now += 10.0
    return out


def config_loop(config: str) -> list[tuple[CycleResult, object]]:
    """`bench_loop` at the switch tests' scale (12 cycles, 60 nodes, 300 pending) under `default`
    or a configuration file of the repository (e.g. bench/configs/full.yaml)."""
    policies = load_config(None if config == "default" else ROOT / config).policies()
    return bench_loop(policies, 12, nodes=60, pending=300, seed=7, churn_seed=3, churn=4)


Cycles = list[tuple[CycleResult, object]]


def assert_same_cycles(fast: Cycles, plain: Cycles) -> None:
    """Every cycle decided alike (the decisions, their kinds, the preempted) and left the rng alike."""
    for (a, rng_a), (b, rng_b) in zip(fast, plain, strict=True):
        assert a.decisions == b.decisions
        assert list(map(type, a.decisions)) == list(map(type, b.decisions))
        assert a.preempted == b.preempted
        assert rng_a == rng_b
