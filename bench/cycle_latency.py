"""Benchmark: latency of one scheduling cycle on a 1,000-node / 8,000-device pool with 1,000 pending.

The pool is filled to the brim with running work (OpenB-like shapes: fractional slices, whole
devices, 2- and 8-device gangs) and 1,000 workloads of the same mix wait. Then a scheduler's loop
runs: before each cycle --churn running workloads finish and as many new ones arrive; the cycle's
admissions start running. Every cycle is timed two ways on the same inputs:

* fresh view: `run_cycle(snapshot, ...)`, the view built from the whole snapshot;
* kept view: `ViewKeeper.cycle(snapshot, ...)`, the view of the last cycle brought up to date with
  the snapshot (what `gpupool up`'s scheduling loop runs).

The loop keeps its pending work in a `PendingQueue` handed to both (`--queue kept`): the kept
view reads what joined and left from its log; `--queue list` hands a fresh list (the cycle
compares it with the last one). Likewise each snapshot carries the allocations that started and
ended since the last (`--allocations changes`), or only the whole list (`--allocations whole`: the
kept view compares it with what it holds).

`--path server` hands what `gpupool up`'s scheduling loop hands a full pass (every cycle here is
one: work ends before each): its pending read, the waiting workloads in the store's order (the
read itself not timed; at most --server-limit of them, as the server reads at most
`MAX_PENDING_PER_CYCLE`: while more wait, each priority in turn with the tenants taking turns
within it where the server does, else the first in that order), kept in the loop's `StoreQueue`
and checked against that read (`KeptPending.follow`, timed apart: `follow_median_ms`), and its
cache's allocation changes; on a checkout from before the loop kept them, the read as a fresh list
and whole snapshots. The store, its reads and writes are not in it: only the core cycle and what
the loop hands it.

The kept view's cycle is also timed in CPU time (`kept_cpu_median_ms`: the thread's CPU seconds,
which other work on a shared machine stretches far less than the wall clock).

--warmup cycles run first, untimed (the first cycle of the admission configuration reclaims the
quota of over-quota tenants: hundreds of preemptions). Target: median under 50 ms.

    python bench/cycle_latency.py [--repeat 15] [--churn 10] [--policies fgd-strand,first-fit]
        [--config FILE|default ...] [--pending N] [--gc server|default] [--clock wall|cpu]
        [--queue kept|list] [--allocations changes|whole] [--path core|server] [--json OUT.json]

Without --config, each placement policy of --policies runs twice: with priority-fifo and nothing
else (no preemption, no backfill, each spelled out), and with drf + per-tenant quota in one cohort +
preemption + backfill. With --config (repeatable), each row is a pool configuration as `gpupool up
--config` and `gpupool sim replay --config` read it (`load_config(FILE).policies()`); `default` is the
configuration's defaults (no file). bench/configs/full.yaml is the full configuration: the
defaults (drf, preemption, backfill, fgd-strand) with the bench's eight tenants as queues of
1,000 devices each in one cohort. The load average of the machine is recorded beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpupool import gc_tuning
from gpupool.config import load_config
from gpupool.core.model import Allocation, ClusterSnapshot, Device, Node, PodRequest, Workload
from gpupool.core.quota import QuotaConfig, devices_milli
from gpupool.core.scheduling.cycle import Policies, run_cycle
from gpupool.core.scheduling.keeper import ViewKeeper
from gpupool.core.scheduling.policies.base import DEFAULT_POLICY, policy_names
from gpupool.errors import InvalidInput, UnknownName

try:  # (bench/side_by_side.py --ref runs this script on checkouts from before it: they take lists)
    from gpupool.core.scheduling.pending import PendingQueue
except ImportError:
    PendingQueue = None  # type: ignore[assignment,misc]
try:  # (as above: snapshots without changes)
    from gpupool.core.model import AllocationChanges
except ImportError:
    AllocationChanges = None  # type: ignore[assignment,misc]
try:  # (as above: a server loop that hands a fresh list in the store's order and whole snapshots)
    from gpupool.server.loops.pending_queue import KeptPending
except ImportError:
    KeptPending = None  # type: ignore[assignment,misc]
try:
    from gpupool.server.loops.snapshot import MAX_PENDING_PER_CYCLE
except ImportError:  # (a checkout from before the server's read was capped)
    MAX_PENDING_PER_CYCLE = 0
try:  # (a checkout from before a read past the cap let the tenants take turns reads in order)
    from gpupool.server.loops.snapshot import _taking_turns as _takes_turns
except ImportError:
    _takes_turns = None  # type: ignore[assignment]

SHAPES = ((1, 250), (1, 500), (1, 1000), (2, 1000), (8, 1000))
WEIGHTS = (25, 25, 35, 10, 5)
TENANTS = [f"team-{i}" for i in range(8)]


def _nodes(count: int) -> list[Node]:
    return [
        Node(
            name=f"n{i:04d}",
            cpu_milli=96_000,
            memory_mib=786_432,
            devices=tuple(Device(f"n{i}-d{d}", "V100M32", d, 32_768) for d in range(8)),
        )
        for i in range(count)
    ]


def _workload(i: int, rng: random.Random, submit_s: float) -> Workload:
    num, milli = rng.choices(SHAPES, WEIGHTS)[0]
    pod = PodRequest("p0", cpu_milli=4000 * num, memory_mib=16_384 * num, num_devices=num, device_milli=milli)
    return Workload(
        id=f"w{i}",
        pods=(pod,),
        tenant=rng.choice(TENANTS),
        priority_class=rng.choice(("high", "normal", "normal", "best-effort")),
        submit_time_s=submit_s,
        runtime_estimate_s=rng.uniform(600, 36_000),
    )


def build(nodes: int, pending: int, seed: int) -> tuple[ClusterSnapshot, list[Workload]]:
    """The pool filled by a first cycle (more work than fits), plus `pending` waiting workloads.

    A queue of 1,000 exists only when the pool is (nearly) full, so that is the state measured.
    """
    rng = random.Random(seed)
    snapshot = ClusterSnapshot(tuple(_nodes(nodes)))
    filler = [_workload(i, rng, 0.0) for i in range(nodes * 8)]
    first = run_cycle(snapshot, filler, Policies(placement="first-fit"), 0.0, random.Random(seed))
    by_id = {w.id: w for w in filler}
    allocations = tuple(Allocation(by_id[a.workload_id], a.placements, 0.0) for a in first.admitted)
    waiting = [_workload(100_000 + i, rng, 100.0 + i) for i in range(pending)]
    return ClusterSnapshot(snapshot.nodes, allocations), waiting


def _store_key(w: Workload) -> tuple[int, float, str]:
    return -w.priority, w.submit_time_s, w.id


def _in_turns(read: list[Workload], limit: int) -> list[Workload]:
    """What the server reads while more waits than it reads (loops/snapshot.py `_taking_turns`): each
    priority in turn, the tenants taking turns within it; in the store's order."""
    turns: dict[tuple[str, int], int] = {}
    ranked = []
    for w in read:  # in the store's order, so each tenant's in its own
        turn = turns[w.tenant, w.priority] = turns.get((w.tenant, w.priority), 0) + 1
        ranked.append((-w.priority, turn, w.submit_time_s, w.id, w))
    ranked.sort(key=lambda r: r[:4])
    return sorted((r[4] for r in ranked[:limit]), key=_store_key)


class Waiting:
    """The loop's pending work: kept in a `PendingQueue` handed to each cycle as it is (`--queue
    kept`, where the package has one: the cycle reads its log of changes), or in a dict whose list
    is made afresh for each cycle (`--queue list`: the cycle compares it with the last one)."""

    def __init__(self, pending: list[Workload], kept: bool, server: int | None = None) -> None:
        self.server = server
        """--path server: at most this many read (the server's MAX_PENDING_PER_CYCLE); None: --path core."""
        self.kept = KeptPending() if server is not None and KeptPending is not None else None
        self.queue = PendingQueue(pending) if kept and server is None and PendingQueue is not None else None
        self.items = {} if self.queue is not None else {w.id: w for w in pending}
        self.follow_ms: list[float] = []

    def add(self, w: Workload) -> None:
        if self.kept is not None:
            self.kept.expect((w,))  # told, as the server's loop is told of submissions and requeues
        if self.queue is not None:
            self.queue.add(w)
        else:
            self.items[w.id] = w

    def pop(self, workload_id: str) -> Workload:
        w = self.queue.pop(workload_id) if self.queue is not None else self.items.pop(workload_id)
        assert w is not None
        if self.kept is not None:
            self.kept.left(workload_id)  # an admission the server's loop committed
        return w

    def work(self) -> Sequence[Workload]:
        if self.server is not None:
            # what the server's full pass reads: the first pending workloads in the store's order (the
            # read itself is not timed); its loop hands that list, or its kept queue checked against it
            read = sorted(self.items.values(), key=_store_key)
            if self.server and len(read) >= self.server and _takes_turns is not None:
                read = _in_turns(read, self.server)
            del read[self.server or len(read):]
            if self.kept is None:
                return read
            start = time.thread_time()
            queue = self.kept.follow(read)
            self.follow_ms.append(1000.0 * (time.thread_time() - start))
            return queue
        return self.queue if self.queue is not None else list(self.items.values())


class Running:
    """The loop's running allocations by workload, with the objects that started and ended since the
    last snapshot: handed over in each snapshot's `changes` (`--allocations changes`, where the
    package has them) or not (`--allocations whole`)."""

    def __init__(self, allocations: Sequence[Allocation], changes: bool) -> None:
        self.items = {a.workload.id: a for a in allocations}
        self.changes = changes and AllocationChanges is not None
        self.started: dict[int, Allocation] = {}
        self.ended: list[Allocation] = []
        self.serial = 0

    def end(self, workload_id: str) -> Allocation:
        a = self.items.pop(workload_id)
        if self.started.pop(id(a), None) is None:  # (one that started since is in neither)
            self.ended.append(a)
        return a

    def start(self, a: Allocation) -> None:
        if a.workload.id in self.items:
            self.end(a.workload.id)
        self.items[a.workload.id] = a  # at the end, as in `started`
        self.started[id(a)] = a

    def snapshot(self, nodes: tuple[Node, ...]) -> ClusterSnapshot:
        allocations = tuple(self.items.values())
        if not self.changes:
            return ClusterSnapshot(nodes, allocations)
        changes = AllocationChanges(self.serial, tuple(self.started.values()), tuple(self.ended))
        self.serial += 1
        self.started, self.ended = {}, []
        return ClusterSnapshot(nodes, allocations, changes=changes)


def time_loop(
    snapshot: ClusterSnapshot,
    pending: list[Workload],
    policies: Policies,
    repeat: int,
    warmup: int,
    churn: int,
    seed: int,
    kept_queue: bool = True,
    changes: bool = True,
    server: int | None = None,
    fresh_after: bool = False,
) -> dict[str, object]:
    """A scheduler's loop over `warmup + repeat` cycles; each timed with a fresh and a kept view.
    `fresh_after`: the fresh view's cycles run once the loop is over, on the same inputs (so the
    kept cycles are timed without a 200 ms rebuild of the whole pool between them, as in the server)."""
    rng = random.Random(seed)
    keeper = ViewKeeper()
    running = Running(snapshot.allocations, changes and (server is None or KeptPending is not None))
    waiting = Waiting(pending, kept_queue, server)
    fresh_ms: list[float] = []
    kept_ms: list[float] = []
    kept_cpu_ms: list[float] = []
    admitted = preempted = differ = 0
    inputs: list[tuple[ClusterSnapshot, list[Workload], float, int]] = []
    decided: list[tuple[object, object]] = []
    now = 3600.0
    serial = 200_000
    for k in range(warmup + repeat):
        for wid in rng.sample(sorted(running.items), min(churn, len(running.items))):
            running.end(wid)
        for _ in range(churn):
            w = _workload(serial, rng, now)
            serial += 1
            waiting.add(w)
        current = running.snapshot(snapshot.nodes)
        work = waiting.work()
        if fresh_after:
            inputs.append((current, list(work), now, k))
        else:
            tick = clock()
            fresh = run_cycle(current, work, policies, now, random.Random(k))
            fresh_ms.append(1000.0 * (clock() - tick))
        tock, cpu = clock(), time.thread_time()
        kept = keeper.cycle(current, work, policies, now, random.Random(k))
        done, cpu_done = clock(), time.thread_time()
        decided.append((kept.admitted, kept.preempted))
        if k >= warmup:
            kept_ms.append(1000.0 * (done - tock))
            kept_cpu_ms.append(1000.0 * (cpu_done - cpu))
            admitted += len(kept.admitted)
            preempted += len(kept.preempted)
            if not fresh_after:
                differ += decided[-1] != (fresh.admitted, fresh.preempted)
        for stop in kept.preempted:
            waiting.add(running.end(stop.workload_id).workload)
        for admission in kept.admitted:
            w = waiting.pop(admission.workload_id)
            running.start(Allocation(w, admission.placements, now))
        now += 10.0
    for current, work, at, k in inputs:
        tick = clock()
        fresh = run_cycle(current, work, policies, at, random.Random(k))
        fresh_ms.append(1000.0 * (clock() - tick))
        differ += k >= warmup and decided[k] != (fresh.admitted, fresh.preempted)
    fresh_ms = fresh_ms[warmup:]
    fresh_ms.sort()
    kept_ms.sort()
    return {
        "fresh_median_ms": statistics.median(fresh_ms),
        "fresh_p90_ms": fresh_ms[int(0.9 * (len(fresh_ms) - 1))],
        "kept_median_ms": statistics.median(kept_ms),
        "kept_p90_ms": kept_ms[int(0.9 * (len(kept_ms) - 1))],
        "kept_min_ms": kept_ms[0],
        "kept_cpu_median_ms": statistics.median(kept_cpu_ms),
        "admitted_per_cycle": admitted / repeat,
        "preempted_per_cycle": preempted / repeat,
        "cycles_deciding_otherwise": differ,
        "kept_view_rebuilds": keeper.rebuilds,
        "follow_median_ms": statistics.median(waiting.follow_ms) if waiting.follow_ms else None,
        "queue_resyncs": waiting.kept.resyncs if waiting.kept is not None else None,
    }


def _configs(args: argparse.Namespace) -> list[tuple[str, Policies]]:
    """The rows to measure: named configurations from --config, else the --policies pairs."""
    if args.config:
        rows = []
        for source in args.config:
            policies = load_config(None if source == "default" else source).policies()
            label = "default" if source == "default" else Path(source).stem
            parts = [policies.placement, policies.ordering]
            parts += [name for name, on in (("quota", policies.quota.enabled),
                                            ("preempt", policies.preemption),
                                            ("backfill", policies.backfill)) if on]
            rows.append((f"{label}: {', '.join(parts)}", policies))
        return rows
    placements = [p for p in args.policies.split(",") if p]
    unknown = [p for p in placements if p not in policy_names()]
    if unknown:
        raise UnknownName(f"unknown placement policies {unknown}; choose from {', '.join(policy_names())}.")
    quota = QuotaConfig.per_tenant(
        {t: {"device_milli": devices_milli(args.nodes * 8 / len(TENANTS))} for t in TENANTS}
    )
    rows = []
    for placement in placements:
        rows += [
            (f"{placement}, priority-fifo",
             Policies(placement=placement, ordering="priority-fifo", preemption=False, backfill=False)),
            (
                f"{placement}, drf+quota+preempt+backfill",
                Policies(placement=placement, ordering="drf", quota=quota, preemption=True, backfill=True),
            ),
        ]
    return rows


clock = time.perf_counter
"""What a cycle is timed with (`--clock`)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=15, help="timed cycles per configuration")
    parser.add_argument("--warmup", type=int, default=5, help="untimed cycles first")
    parser.add_argument("--churn", type=int, default=10, help="finishes and arrivals before each cycle")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policies", default=f"{DEFAULT_POLICY},first-fit")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        help="a pool configuration file (YAML, as `gpupool up --config` reads), or `default` for the "
        "configuration's defaults; repeat for more rows (replaces --policies)",
    )
    parser.add_argument(
        "--queue",
        choices=("kept", "list"),
        default="kept",
        help="kept: the loop keeps its pending work in a PendingQueue and hands it to each cycle (the "
        "cycle reads what joined and left from its log); list: a fresh list each cycle (compared whole).",
    )
    parser.add_argument(
        "--allocations",
        choices=("changes", "whole"),
        default="changes",
        help="changes: each snapshot carries the allocations that started and ended since the last (the "
        "kept view reads them); whole: only the whole list (compared with what the kept view holds).",
    )
    parser.add_argument(
        "--path",
        choices=("core", "server"),
        default="core",
        help="core: --queue and --allocations as given; server: what `gpupool up`'s loop hands a full pass "
        "(its pending read in the store's order, kept in its queue and checked against that read, and its "
        "cache's allocation changes; before the loop kept them: the read as a list and whole snapshots).",
    )
    parser.add_argument(
        "--server-limit",
        type=int,
        default=MAX_PENDING_PER_CYCLE,
        help="--path server: at most this many pending workloads read by a full pass, the tenants taking "
        f"turns within each priority while more wait (the server's own: {MAX_PENDING_PER_CYCLE}; 0: all)",
    )
    parser.add_argument(
        "--fresh",
        choices=("beside", "after"),
        default="beside",
        help="beside: each cycle's fresh view runs just before its kept view; after: every fresh cycle "
        "runs once the loop is over, on the same inputs (decisions compared alike), so the kept cycles "
        "are timed without a rebuild of the whole pool between them, as the server runs them.",
    )
    parser.add_argument("--json", type=Path, default=Path("bench/results/cycle_latency.json"))
    parser.add_argument(
        "--gc",
        choices=("server", "default"),
        default="server",
        help="server: the garbage-collector settings `gpupool up` runs with (gpupool/gc_tuning.py); "
        "default: CPython's own.",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: elapsed time; cpu: the process's CPU time (time.process_time), less disturbed by "
        "other work on a shared machine (it leaves out time spent waiting for a core).",
    )
    args = parser.parse_args()
    global clock
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    console = Console(width=max(Console().width, 120))
    try:
        configs = _configs(args)
    except (InvalidInput, UnknownName) as exc:
        console.print(f"Error: {exc}")
        return 2
    snapshot, pending = build(args.nodes, args.pending, args.seed)
    if args.gc == "server":
        gc_tuning.tune()
    table = Table(
        title=f"One cycle: {args.nodes} nodes / {args.nodes * 8} devices, "
        f"{len(snapshot.allocations)} running, {len(pending)} pending, {args.churn} finish and "
        f"{args.churn} arrive per cycle (target: median < 50 ms), {args.gc} GC settings"
    )
    for column in (
        "configuration",
        "kept view median ms",
        "kept p90",
        "fresh view median ms",
        "fresh p90",
        "admitted /cycle",
        "preempted /cycle",
    ):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    rows = []
    for name, policies in configs:
        row: dict[str, object] = {"configuration": name}
        row.update(
            time_loop(snapshot, pending, policies, args.repeat, args.warmup, args.churn, args.seed,
                      kept_queue=args.queue == "kept", changes=args.allocations == "changes",
                      server=args.server_limit if args.path == "server" else None,
                      fresh_after=args.fresh == "after")
        )
        rows.append(row)
        table.add_row(
            name,
            f"{row['kept_median_ms']:.1f}",
            f"{row['kept_p90_ms']:.1f}",
            f"{row['fresh_median_ms']:.1f}",
            f"{row['fresh_p90_ms']:.1f}",
            f"{row['admitted_per_cycle']:.1f}",
            f"{row['preempted_per_cycle']:.1f}",
        )
    console.print(table)
    differing = sum(int(str(r["cycles_deciding_otherwise"])) for r in rows)
    if differing:
        console.print(
            f"{differing} timed cycles decided otherwise on the kept view (the placement policy's "
            "workload-mix sample differs; see core/scheduling/keeper.py)."
        )
    load = os.getloadavg()
    console.print(f"Load average (1, 5, 15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "nodes": args.nodes,
                "pending": len(pending),
                "running": len(snapshot.allocations),
                "rows": rows,
                "load_average": list(load),
                "gc": args.gc,
                "clock": args.clock,
                "churn": args.churn,
                "warmup": args.warmup,
                "repeat": args.repeat,
                "configs": args.config,
                "queue": args.queue if PendingQueue is not None else "list",
                "path": args.path,
                "server_limit": args.server_limit if args.path == "server" else None,
                "server_hands_changes": args.path == "server" and KeptPending is not None,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
