"""Cancels racing a running control loop on PostgreSQL: submits and cancels from concurrent clients.

    .venv/bin/python bench/cancel_race.py [--ops 10000] [--clients 20] [--json bench/results/cancel_race.json]

A `gpupool up` process (fake provider, 16 simulated 8-GPU nodes, bench/configs/live-full-16x8.yaml:
fgd-strand, drf, preemption, backfill, a cohort of three tenants, four priority classes) on a
throwaway PostgreSQL. `--clients` keep-alive HTTP connections send `--ops` requests in all, each
client in turn: a submission (the cohort mix of bench/_control_plane.py, each pod running 1-3 s on
the fake provider, so the loop admits, launches, preempts and finishes all the while), and after
every second submission a cancel, alternately of the workload it just submitted (racing its
admission) and of a random earlier one of its own (pending, admitted, running or finished by then).

Counted afterwards from the store (the events and pods tables), against what the API acknowledged:

- cancelled then admitted / running: a workload whose events go on to admitted or running after
  its `cancelled` event (must be 0);
- cancelled then admitted or running covers launches too: a launch is recorded as the move to
  running (its `launched` event), in the transaction that records the provider's start;
- cancelled pods left holding devices: a pod of a cancelled workload still launching, waiting,
  running or stopping once the loop has run on for `--settle` seconds (0);
- not a violation, counted beside them: pods the provider started after the cancel's clock reading.
  Their workload was admitted (committed) before the cancel, and the launch call, made outside any
  transaction, met a cancel committed meanwhile; the transaction that records the start finds the
  pod `stopping` and stops it at once (no `launched` event, no move to running);
- cancel acknowledged but not cancelled: a 200 cancel whose workload is not `cancelled` (0);
- submissions lost: a 201 whose workload the store does not hold, or holds without its
  `submitted` event (0);
- duplicates: a workload id acknowledged twice, a workload with two `submitted` or two `cancelled`
  events, or rows no acknowledged submission made (0).

- requests answered 5xx: a submit or cancel the server could not take (a deadlock detected by
  PostgreSQL is answered 503) (0).

Throughput is the requests per second over the whole run (a 409 for a cancel of a workload that
had already finished counts as a handled request).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table
from sqlalchemy import create_engine, select

from _control_plane import (
    RawHttpClient,
    ensure_tenants,
    gpupool_up,
    p50_ms,
    percentile_ms,
    workload_mix,
    write_json,
)
from gpupool.server import pgtemp
from gpupool.server.orm import EventRow, PodRow, WorkloadRow

POOL = "16x8xH100"
CONFIG = str(Path(__file__).parent / "configs" / "live-full-16x8.yaml")
ADMITTED_OR_LATER = frozenset({"admitted", "running", "succeeded", "failed"})
HOLDING = frozenset({"launching", "waiting", "running", "stopping"})


def _specs(seed: int) -> list[dict[str, object]]:
    """The cohort mix, each spec's pods running 1, 2 or 3 s on the fake provider."""
    specs = workload_mix("cohort")
    for i, spec in enumerate(specs):
        spec["env"] = {"GPUPOOL_FAKE_DURATION_S": str(1 + (i + seed) % 3)}
    return specs


async def _clients(url: str, token: str, ops: int, clients: int, seed: int) -> dict[str, object]:
    specs = _specs(seed)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as warm:
        (await warm.get("/api/v1/workloads", params={"limit": 1})).raise_for_status()
    conns = [RawHttpClient(url) for _ in range(clients)]
    submits = [conns[0].request_bytes("POST", "/api/v1/workloads", token, s) for s in specs]
    acknowledged: list[str] = []
    cancels_ok: list[str] = []
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    unexpected: dict[str, str] = {}
    sent = 0

    async def client(index: int, conn: RawHttpClient) -> None:
        nonlocal sent
        rng = random.Random(seed * 1000 + index)
        mine: list[str] = []
        turn = 0
        while sent < ops:
            turn += 1
            if turn % 3 == 0 and mine:  # every second submission is followed by a cancel
                target = mine[-1] if turn % 6 == 0 else rng.choice(mine)
                request = conn.request_bytes("POST", f"/api/v1/workloads/{target}/cancel", token, {})
                kind = "cancel"
            else:
                request, target, kind = submits[rng.randrange(len(submits))], "", "submit"
            sent += 1
            began = time.perf_counter()
            status, body = await conn.send(request)
            latencies.append(time.perf_counter() - began)
            statuses[f"{kind} {status}"] += 1
            if status not in (200, 201, 409):
                unexpected.setdefault(f"{kind} {status}", body.decode(errors="replace")[:300])
            if kind == "submit" and status == 201:
                workload_id = json.loads(body)["id"]
                mine.append(workload_id)
                acknowledged.append(workload_id)
            elif kind == "cancel" and status == 200:
                cancels_ok.append(target)

    began = time.perf_counter()
    try:
        await asyncio.gather(*(client(i, c) for i, c in enumerate(conns)))
    finally:
        for c in conns:
            await c.close()
    wall_s = time.perf_counter() - began
    return {"acknowledged": acknowledged, "cancels_ok": cancels_ok,
            "statuses": dict(sorted(statuses.items())), "unexpected": unexpected,
            "answered_5xx": sum(n for k, n in statuses.items() if k.split()[1].startswith("5")),
            "wall_s": wall_s, "latencies": latencies}


def count_violations(database_url: str, acknowledged: list[str], cancels_ok: list[str]) -> dict[str, object]:
    """The race's counts, read from the store's events, pods and workloads tables."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            status = dict(conn.execute(select(WorkloadRow.id, WorkloadRow.status)).all())
            events = conn.execute(select(EventRow.workload_id, EventRow.pod_id, EventRow.to_status,
                                         EventRow.reason, EventRow.at_s).order_by(EventRow.id)).all()
            pods = conn.execute(select(PodRow.workload_id, PodRow.status, PodRow.started_s)).all()
    finally:
        engine.dispose()
    cancelled_at: dict[str, float] = {}
    after: set[str] = set()
    submitted: Counter[str] = Counter()
    cancelled_events: Counter[str] = Counter()
    for workload_id, pod_id, to_status, reason, at_s in events:
        if reason == "submitted":
            submitted[workload_id] += 1
        if workload_id in cancelled_at and not pod_id and to_status in ADMITTED_OR_LATER:
            after.add(workload_id)
        if to_status == "cancelled" and not pod_id:
            cancelled_events[workload_id] += 1
            cancelled_at.setdefault(workload_id, at_s)
    started_after = {w for w, _, started_s in pods
                     if w in cancelled_at and (started_s or 0.0) > cancelled_at[w]}
    left = {w for w, pod_status, _ in pods if w in cancelled_at and pod_status in HOLDING}
    acked = Counter(acknowledged)
    broken = sorted(after | {w for w in set(cancels_ok) if status.get(w) != "cancelled"})[:3]
    return {
        "examples": {w: [f"{to_status}:{reason}" for w2, pod_id, to_status, reason, _ in events
                         if w2 == w and not pod_id] for w in broken},
        "workloads_acknowledged": len(acknowledged),
        "cancels_acknowledged": len(cancels_ok),
        "workloads_cancelled": sum(1 for s in status.values() if s == "cancelled"),
        "cancelled_then_admitted_or_running": len(after),
        "cancelled_pods_left_holding_devices": len(left),
        "pods_started_after_the_cancel_then_stopped": len(started_after),
        "cancel_acknowledged_not_cancelled": sum(1 for w in set(cancels_ok) if status.get(w) != "cancelled"),
        "submissions_lost": sum(1 for w in acked if w not in status or submitted[w] == 0),
        "duplicate_ids_acknowledged": sum(1 for n in acked.values() if n > 1),
        "duplicate_submitted_events": sum(1 for n in submitted.values() if n > 1),
        "duplicate_cancelled_events": sum(1 for n in cancelled_events.values() if n > 1),
        "rows_not_acknowledged": sum(1 for w in status if w not in acked),
    }


VIOLATIONS = ("cancelled_then_admitted_or_running", "cancelled_pods_left_holding_devices",
              "cancel_acknowledged_not_cancelled", "submissions_lost", "duplicate_ids_acknowledged",
              "duplicate_submitted_events", "duplicate_cancelled_events", "rows_not_acknowledged")


def run(ops: int, clients: int, seed: int, settle_s: float) -> dict[str, object]:
    reason = pgtemp.why_unavailable()
    if reason:
        return {"skipped": reason}
    pg = pgtemp.start()
    try:
        database_url = pg.create_database()
        with gpupool_up("--provider", "fake", "--simulate", POOL, "--config", CONFIG,
                        "--database-url", database_url) as server:
            ensure_tenants(server, "cohort")
            load = asyncio.run(_clients(server.url, server.token, ops, clients, seed))
            time.sleep(settle_s)  # the loop goes on admitting and launching what is left
        assert isinstance(load["acknowledged"], list) and isinstance(load["cancels_ok"], list)
        counts = count_violations(database_url, load["acknowledged"], load["cancels_ok"])
    finally:
        pg.stop()
    latencies = load["latencies"]
    assert isinstance(latencies, list) and isinstance(load["wall_s"], float)
    return {"ops": ops, "clients": clients, "seed": seed, "wall_s": round(load["wall_s"], 2),
            "requests_per_s": round(ops / load["wall_s"], 1), "p50_ms": round(p50_ms(latencies), 2),
            "p99_ms": round(percentile_ms(latencies, 99), 2), "responses": load["statuses"],
            "unexpected_responses": load["unexpected"], **counts,
            "requests_answered_5xx": load["answered_5xx"],
            "violations": sum(int(counts[k]) for k in VIOLATIONS) + int(load["answered_5xx"]),  # type: ignore[call-overload]
            "load_average_1m": os.getloadavg()[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=10_000, help="requests in all (submits and cancels)")
    parser.add_argument("--clients", type=int, default=20, help="concurrent keep-alive connections")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds the loop runs on after the load")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    result = run(args.ops, args.clients, args.seed, args.settle)
    table = Table(title=f"Cancel race on PostgreSQL: {args.ops} submits and cancels, {args.clients} clients "
                        "(target: every violation 0)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, str(value))
    Console().print(table)
    print(f"JSON: {write_json(args.json, 'cancel_race', result)}")
    return 1 if int(result.get("violations", 0) or 0) else 0  # type: ignore[call-overload]


if __name__ == "__main__":
    raise SystemExit(main())
