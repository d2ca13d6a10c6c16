"""Check: a digest of every decision the scheduler's loop of bench/cycle_latency.py takes.

Runs the loop of `cycle_latency.time_loop` (the same seeded pool, pending work, churn and
configuration) without timing it and hashes every cycle's decisions (admissions with their
placements, preemptions, every rejection with its reason and message, requeues, the
reservation; `_encode`), on the kept view and on a fresh one. Two commits decide alike on this scenario when
they print the same digests: run it with each commit's `gpupool` first on PYTHONPATH (an
optimisation of the cycle must leave the digests as they were).

    python bench/cycle_decisions.py --config default --pending 10000 [--cycles 25] [--churn 10]
    PYTHONPATH=/path/to/other/checkout/src python bench/cycle_decisions.py --config default ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path

from cycle_latency import Running, Waiting, _workload, build
from gpupool.config import load_config
from gpupool.core.model import Allocation
from gpupool.core.scheduling.cycle import CycleResult, run_cycle
from gpupool.core.scheduling.keeper import ViewKeeper


def digests(config: str, nodes: int, pending: int, cycles: int, churn: int, seed: int,
            kept_queue: bool = True, changes: bool = True) -> dict[str, object]:
    policies = load_config(None if config == "default" else config).policies()
    snapshot, waiting_list = build(nodes, pending, seed)
    rng = random.Random(seed)
    keeper = ViewKeeper()
    running = Running(snapshot.allocations, changes)
    waiting = Waiting(waiting_list, kept_queue)
    kept_hash, fresh_hash = hashlib.sha256(), hashlib.sha256()
    now, serial = 3600.0, 200_000
    admitted = preempted = rejected = differ = 0
    for k in range(cycles):
        for wid in rng.sample(sorted(running.items), min(churn, len(running.items))):
            running.end(wid)
        for _ in range(churn):
            w = _workload(serial, rng, now)
            serial += 1
            waiting.add(w)
        current = running.snapshot(snapshot.nodes)
        work = waiting.work()
        fresh = run_cycle(current, work, policies, now, random.Random(k))
        kept = keeper.cycle(current, work, policies, now, random.Random(k))
        fresh_hash.update(_encode(fresh))
        kept_hash.update(_encode(kept))
        differ += (kept.admitted, kept.preempted) != (fresh.admitted, fresh.preempted)
        admitted += len(kept.admitted)
        preempted += len(kept.preempted)
        rejected += len(kept.rejected)
        for stop in kept.preempted:
            waiting.add(running.end(stop.workload_id).workload)
        for admission in kept.admitted:
            w = waiting.pop(admission.workload_id)
            running.start(Allocation(w, admission.placements, now))
        now += 10.0
    return {"config": config, "pending": pending, "cycles": cycles, "kept_sha256": kept_hash.hexdigest(),
            "fresh_sha256": fresh_hash.hexdigest(), "admitted": admitted, "preempted": preempted,
            "rejected": rejected, "cycles_kept_differs_from_fresh": differ}


def _encode(result: CycleResult) -> bytes:
    """Every decision, by kind, in a form that does not depend on how the result is laid out (its
    views by kind: the same on commits from before `CycleResult.decisions`): admissions with their
    placements; stops with reason, message, preemptor, kind and lost work; requeues with their
    resume point; waits and refusals with reason and message; moves; the reservation."""
    reserved = result.reservation
    return repr((
        [(a.workload_id, a.placements) for a in result.admitted],
        [(p.workload_id, p.reason, p.message, p.preemptor_id, str(p.kind), p.lost_work_s, p.lost_device_s)
         for p in result.preempted],
        [(r.workload_id, r.reason, r.resume_progress_s) for r in result.requeued],
        [(r.workload_id, r.reason, r.message, r.final) for r in result.rejected],
        [(m.workload_id, m.gang_id, m.placements, m.resume_progress_s, m.lost_work_s) for m in result.moved],
        None if reserved is None else (reserved.workload_id, reserved.start_s),
    )).encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", default=[],
                        help="a pool configuration file, or `default`; repeat for more (default: default)")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=25)
    parser.add_argument("--churn", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--queue", choices=("kept", "list"), default="kept",
                        help="as bench/cycle_latency.py --queue: the pending work kept in a PendingQueue "
                        "handed to each cycle, or a fresh list each cycle")
    parser.add_argument("--allocations", choices=("changes", "whole"), default="changes",
                        help="as bench/cycle_latency.py --allocations: snapshots carry what started and "
                        "ended since the last, or only the whole list")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = [digests(c, args.nodes, args.pending, args.cycles, args.churn, args.seed, args.queue == "kept",
                    args.allocations == "changes")
            for c in args.config or ["default"]]
    for row in rows:
        print(json.dumps(row))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
