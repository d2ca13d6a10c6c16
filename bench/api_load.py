"""Sustained workload submissions through the HTTP API on loopback (SQLite and PostgreSQL).

A bounded async load generator: CONCURRENCY keep-alive connections, TOTAL submissions, each one a
real POST /api/v1/workloads into a `gpupool up` process. The timed requests go through a minimal
asyncio HTTP/1.1 client (bench/_control_plane.py), because httpx's async client costs about as much
CPU per request as the server does and would share the same two cores; the warm-up goes through
httpx. The load generator's own CPU per submission is reported beside the server's.
Target: >= 500 submissions/s with
p99 < 50 ms on 2 cores with SQLite.

    .venv/bin/python bench/api_load.py [--total 3000] [--concurrency 8] [--backends sqlite,postgresql] \
        [--config FILE] [--mix plain|cohort]

--config FILE starts the pool with that configuration (`gpupool up --config`); --mix cohort submits
the mix of `_control_plane.workload_mix` (three tenants, three priority classes, some whole-device
jobs with a time limit) instead of one spec; bench/side_by_side.py --config-b compares two
configurations in alternating rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import httpx
from rich.console import Console
from rich.table import Table

from _control_plane import (
    MIXES,
    RawHttpClient,
    ensure_tenants,
    gpupool_up,
    p50_ms,
    percentile_ms,
    unusual_events,
    workload_mix,
    write_json,
)

POOL = "16x8xH100"


async def _load(url: str, token: str, total: int, concurrency: int,
                specs: list[dict[str, object]]) -> tuple[float, list[float], int]:
    """CONCURRENCY keep-alive connections, each sending its share of TOTAL submissions back to back
    (submission i sends specs[i % len])."""
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
        for i in range(20):  # warm-up through a full client: the specs are accepted, caches are filled
            (await client.post("/api/v1/workloads", json=specs[i % len(specs)])).raise_for_status()
    latencies: list[float] = []
    errors = 0
    sent = 0
    clients = [RawHttpClient(url) for _ in range(concurrency)]
    requests = [clients[0].request_bytes("POST", "/api/v1/workloads", token, s) for s in specs]

    async def worker(client: RawHttpClient) -> None:
        nonlocal errors, sent
        while sent < total:
            request = requests[sent % len(requests)]
            sent += 1
            start = time.perf_counter()
            status, _ = await client.send(request)
            latencies.append(time.perf_counter() - start)
            errors += status != 201

    began = time.perf_counter()
    try:
        await asyncio.gather(*(worker(c) for c in clients))
        return time.perf_counter() - began, latencies, errors
    finally:
        for c in clients:
            await c.close()


def _run(backend: str, total: int, concurrency: int, config: str, mix: str) -> dict[str, object]:
    args = ["--provider", "fake", "--simulate", POOL, *(["--config", config] if config else [])]
    pg = None
    if backend == "postgresql":
        from gpupool.server import pgtemp

        reason = pgtemp.why_unavailable()
        if reason:
            return {"backend": backend, "skipped": reason}
        pg = pgtemp.start(fsync=True)
        args += ["--database-url", pg.create_database()]
    try:
        with gpupool_up(*args) as server:
            ensure_tenants(server, mix)
            cpu_before, own_before = server.cpu_s(), time.process_time()
            wall_s, latencies, errors = asyncio.run(
                _load(server.url, server.token, total, concurrency, workload_mix(mix)))
            cpu_ms = (server.cpu_s() - cpu_before) * 1000 / (total + 20)
            client_cpu_ms = (time.process_time() - own_before) * 1000 / (total + 20)
            events = unusual_events(server)
    finally:
        if pg is not None:
            pg.stop()
    return {
        "backend": backend,
        "config": config or "defaults",
        "mix": mix,
        "submissions": total,
        "concurrency": concurrency,
        "errors": errors,
        "wall_s": round(wall_s, 3),
        "per_s": round(total / wall_s, 1),
        "p50_ms": round(p50_ms(latencies), 2),
        "p99_ms": round(percentile_ms(latencies, 99), 2),
        "server_cpu_ms_per_submission": round(cpu_ms, 2),
        "load_generator_cpu_ms_per_submission": round(client_cpu_ms, 2),
        "events": events,
        "load_average_1m": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--config", default="", help="the pool's configuration file (gpupool up --config)")
    parser.add_argument("--mix", choices=MIXES, default="plain", help="what is submitted (see above)")
    parser.add_argument("--json", default="")
    opts = parser.parse_args()
    rows = [_run(b.strip(), opts.total, opts.concurrency, opts.config, opts.mix)
            for b in opts.backends.split(",") if b.strip()]
    table = Table(
        title=f"API submissions: {opts.total} POSTs ({opts.mix} mix), {opts.concurrency} in flight, "
              f"configuration {opts.config or 'defaults'} (target 500/s, p99 < 50 ms)"
    )
    for column in ("store", "submissions/s", "p50 ms", "p99 ms", "server CPU ms/submission",
                   "load generator CPU ms/submission", "errors", "load average (1 min)"):
        table.add_column(column)
    for r in rows:
        if "skipped" in r:
            table.add_row(str(r["backend"]), "skipped: " + str(r["skipped"]), "", "", "", "", "", "")
        else:
            table.add_row(
                str(r["backend"]),
                str(r["per_s"]),
                str(r["p50_ms"]),
                str(r["p99_ms"]),
                str(r["server_cpu_ms_per_submission"]),
                str(r["load_generator_cpu_ms_per_submission"]),
                str(r["errors"]),
                f"{r['load_average_1m']:.2f}",
            )
    Console().print(table)
    print(f"JSON: {write_json(opts.json, 'api_load', {'rows': rows})}")


if __name__ == "__main__":
    main()
