"""A victim-search switch on and off, cycle by cycle in one process: the CPU time of one part.

Two copies of the loop of bench/cycle_latency.py (the same seeded pool, pending work and churn,
a kept view each) run side by side, one with a module-level switch of
`gpupool.core.scheduling.preemption` (or of the module `--module` names) on, the other with it
off, alternating which goes first each cycle; the thread CPU time of one function of that module
(the part the switch changes) and of the whole cycle are summed per side. Both sides decide the
same when the switch keeps its promise: the script checks it cycle by cycle.

    python bench/victim_switch.py --switch put_back_from_base --part _drop_apart \\
        --config bench/configs/full.yaml --pending 1000 --cycles 14
    python bench/victim_switch.py --module gpupool.core.scheduling.policies.fgd \\
        --switch lazy_refresh --part Fgd._place_feasible --config default --pending 10000
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from cycle_latency import _workload, build
from gpupool.config import load_config
from gpupool.core.model import Allocation, ClusterSnapshot
from gpupool.core.scheduling import preemption
from gpupool.core.scheduling.cycle import CycleResult, Policies
from gpupool.core.scheduling.keeper import ViewKeeper


class _Loop:
    """One copy of the benchmark's loop (`cycle_latency.time_loop`, kept view only)."""

    def __init__(self, snapshot: ClusterSnapshot, pending: list[Any], policies: Policies, seed: int
                 ) -> None:
        self.snapshot, self.policies = snapshot, policies
        self.rng = random.Random(seed)
        self.keeper = ViewKeeper()
        self.running = {a.workload.id: a for a in snapshot.allocations}
        self.waiting = {w.id: w for w in pending}
        self.now, self.serial = 3600.0, 200_000

    def step(self, k: int, churn: int) -> tuple[CycleResult, float]:
        for wid in self.rng.sample(sorted(self.running), min(churn, len(self.running))):
            del self.running[wid]
        for _ in range(churn):
            w = _workload(self.serial, self.rng, self.now)
            self.serial += 1
            self.waiting[w.id] = w
        current = ClusterSnapshot(self.snapshot.nodes, tuple(self.running.values()))
        start = time.thread_time()
        result = self.keeper.cycle(current, list(self.waiting.values()), self.policies, self.now,
                                   random.Random(k))
        spent = time.thread_time() - start
        for stop in result.preempted:
            self.waiting[stop.workload_id] = self.running.pop(stop.workload_id).workload
        for admission in result.admitted:
            w = self.waiting.pop(admission.workload_id)
            self.running[w.id] = Allocation(w, admission.placements, self.now)
        self.now += 10.0
        return result, spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default=preemption.__name__, help="the module of the switch and part")
    parser.add_argument("--switch", required=True, help="a boolean of that module")
    parser.add_argument("--part", required=True,
                        help="the function of that module to time (Class.method: a method)")
    parser.add_argument("--config", default="default")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=14)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--churn", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=Path("bench/results/victim_switch.json"))
    args = parser.parse_args()
    try:
        module = importlib.import_module(args.module)
    except ImportError:
        print(f"--module {args.module!r} is not a module of this checkout.", file=sys.stderr)
        return 2
    owner_name, _, part_name = args.part.rpartition(".")
    owner = getattr(module, owner_name, None) if owner_name else module
    switch, part_fn = getattr(module, args.switch, None), getattr(owner, part_name, None)
    if not isinstance(switch, bool) or not callable(part_fn):
        print(f"--switch must name a boolean and --part a function of {module.__name__}: "
              f"{args.switch!r} / {args.part!r} are not.", file=sys.stderr)
        return 2
    policies = load_config(None if args.config == "default" else args.config).policies()
    snapshot, pending = build(args.nodes, args.pending, args.seed)
    part = part_fn
    spent = {True: 0.0, False: 0.0}

    def timed(*a: Any, **kw: Any) -> Any:
        start = time.thread_time()
        try:
            return part(*a, **kw)
        finally:
            spent[getattr(module, args.switch)] += time.thread_time() - start

    setattr(owner, part_name, timed)
    try:
        return _compare(args, module, snapshot, pending, policies, spent)
    finally:  # (the module as it was: the switch and the part)
        setattr(owner, part_name, part)
        setattr(module, args.switch, switch)


def _compare(args: argparse.Namespace, module: Any, snapshot: ClusterSnapshot, pending: list[Any],
             policies: Policies, spent: dict[bool, float]) -> int:
    """The two loops, alternating; the table printed and the JSON written."""
    loops = {side: _Loop(snapshot, pending, policies, args.seed) for side in (True, False)}
    cycles: dict[bool, list[float]] = {True: [], False: []}
    differ = 0
    for k in range(args.warmup + args.cycles):
        if k == args.warmup:
            spent.update({True: 0.0, False: 0.0})
        results = {}
        for side in (True, False) if k % 2 else (False, True):
            setattr(module, args.switch, side)
            results[side], cpu = loops[side].step(k, args.churn)
            if k >= args.warmup:
                cycles[side].append(1000.0 * cpu)
        differ += results[True].decisions != results[False].decisions
    rows = {side: {"part_ms_per_cycle": 1000.0 * spent[side] / args.cycles,
                   "cycle_cpu_median_ms": statistics.median(cycles[side])} for side in (True, False)}
    print(f"{args.switch} on / off, {args.config}, {args.pending} pending, {args.cycles} cycles")
    print(f"{'':>6} {args.part + ' ms/cycle':>24} {'cycle CPU median ms':>20}")
    for side in (True, False):
        print(f"{'on' if side else 'off':>6} {rows[side]['part_ms_per_cycle']:>24.2f} "
              f"{rows[side]['cycle_cpu_median_ms']:>20.2f}")
    ratio = rows[True]["part_ms_per_cycle"] / max(rows[False]["part_ms_per_cycle"], 1e-9)
    print(f"part on/off: {ratio:.2f}; cycles deciding otherwise: {differ}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    out = {"args": {k: str(v) for k, v in vars(args).items()}, "on": rows[True], "off": rows[False],
           "part_ratio": ratio, "cycles_deciding_otherwise": differ}
    args.json.write_text(json.dumps(out, indent=2))
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
