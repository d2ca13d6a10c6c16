"""One tenant holds as many followed event streams open as it can; another tenant's requests
meanwhile, on a server whose soft limit of open files is low, as it often is (1024).

    .venv/bin/python bench/tenant_streams.py [--streams 1200] [--open-files 1024] [--seconds 5]
        [--json OUT.json]

Starts `gpupool up --simulate 1x8xH100` (SQLite) with its soft limit of open files set to
`--open-files` (the hard limit as it is here), creates tenants `flood` and `quiet`, and has `flood`
open `--streams` followed event streams (`GET /events/stream?follow=true`) within its request rate,
each re-opened 1 s after it is refused or fails, and held to the end. Once no more have opened for
3 s (at most 60 s), `quiet`
lists its workloads every 50 ms for `--seconds` and submits 3 workloads, from a process of its own.
It reports the streams
open and refused, the requests of `quiet` that failed, its latency, and the server's limit of open
files. Every request is a real HTTP call on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from _control_plane import gpupool_up
from tenant_flood import prepare_tenants

API = "/api/v1"
MAX_RAMP_S = 60.0
"""The flood's streams are given at most this long to open before the quiet tenant starts."""


async def _hold(url: str, token: str, until: float, outcomes: Counter[str], open_now: list[int]) -> None:
    async with httpx.AsyncClient(base_url=url + API, headers={"Authorization": f"Bearer {token}"},
                                 timeout=30) as c:
        while time.monotonic() < until:
            try:
                async with c.stream("GET", "/events/stream", params={"follow": "true"}) as answer:
                    outcomes[str(answer.status_code)] += 1
                    if answer.status_code == 200:
                        open_now[0] += 1
                        try:
                            async for _ in answer.aiter_bytes():
                                if time.monotonic() >= until:
                                    return
                        finally:
                            open_now[0] -= 1
            except httpx.HTTPError as exc:
                outcomes[type(exc).__name__] += 1
            await asyncio.sleep(1.0)


async def _quiet(url: str, token: str, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    submitted = 0
    async with httpx.AsyncClient(base_url=url + API, headers={"Authorization": f"Bearer {token}"},
                                 timeout=10) as c:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            start = time.perf_counter()
            try:
                answer = await c.get("/workloads", params={"limit": 20})
                if answer.status_code == 200:
                    latencies.append(1000 * (time.perf_counter() - start))
                else:
                    errors[str(answer.status_code)] += 1
            except httpx.HTTPError as exc:
                errors[type(exc).__name__] += 1
            await asyncio.sleep(0.05)
        for _ in range(3):
            try:
                answer = await c.post("/workloads", json={"command": ["true"], "resources": {"gpus": 1}})
                submitted += answer.status_code == 201
                if answer.status_code != 201:
                    errors[f"submit {answer.status_code}"] += 1
            except httpx.HTTPError as exc:
                errors[f"submit {type(exc).__name__}"] += 1
    return {"latencies": latencies, "errors": dict(errors), "submitted": submitted}


async def _run(url: str, tokens: dict[str, str], streams: int, seconds: float) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    open_now = [0]
    until = time.monotonic() + MAX_RAMP_S + seconds + 30
    holders = []
    for i in range(streams):
        holders.append(asyncio.create_task(_hold(url, tokens["flood"], until, outcomes, open_now)))
        if i % 45 == 44:
            await asyncio.sleep(0.5)  # within the default 100 requests a second
    ramp_end = time.monotonic() + MAX_RAMP_S
    most, since = open_now[0], time.monotonic()
    while open_now[0] < streams and time.monotonic() - since < 3 and time.monotonic() < ramp_end:
        await asyncio.sleep(0.25)  # until the flood holds all it will: no more for 3 s
        if open_now[0] > most:
            most, since = open_now[0], time.monotonic()
    held = open_now[0]
    child = await asyncio.create_subprocess_exec(  # its own process: the flood's 1,000 tasks are not its
        sys.executable, __file__, "--quiet-only", url, tokens["quiet"], str(seconds),
        stdout=asyncio.subprocess.PIPE)
    out, _ = await child.communicate()
    quiet = json.loads(out)
    for task in holders:
        task.cancel()
    await asyncio.gather(*holders, return_exceptions=True)
    return {"streams_open": held, "flood_outcomes": dict(outcomes), **quiet}


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--quiet-only":  # the quiet tenant, as a child process
        print(json.dumps(asyncio.run(_quiet(sys.argv[2], sys.argv[3], float(sys.argv[4])))))
        return
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=1200)
    parser.add_argument("--open-files", type=int, default=1024, help="the server's soft limit at its start")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < args.streams + 200:  # this process holds the streams' connections itself
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.streams * 2 + 1000), hard))
    with gpupool_up("--simulate", "1x8xH100", open_files=(args.open_files, hard)) as server:
        limit = next(line.split()[3] for line in Path(f"/proc/{server.pid}/limits").read_text().splitlines()
                     if line.startswith("Max open files"))
        tokens = prepare_tenants(server.url, server.token, 0)
        got = asyncio.run(_run(server.url, tokens, args.streams, args.seconds))
    failed = sum(n for key, n in got["flood_outcomes"].items() if key not in ("200", "429"))
    result = {"server_open_files": int(limit), "streams_open": got["streams_open"],
              "flood_refused_429": got["flood_outcomes"].get("429", 0), "flood_failed": failed,
              "flood_outcomes": got["flood_outcomes"], **quiet_figures(got)}
    table = Table(title=f"one tenant holding up to {args.streams} followed streams; the server started "
                        f"with {args.open_files} open files allowed")
    for column in ("server's limit", "streams open", "flood 429", "flood failed", "quiet ok", "quiet errors",
                   "quiet p50 ms", "quiet submitted"):
        table.add_column(column, justify="right")
    table.add_row(str(result["server_open_files"]), str(result["streams_open"]),
                  str(result["flood_refused_429"]), str(failed), str(result["quiet_requests_ok"]),
                  str(result["quiet_errors"]),
                  f"{result['quiet_p50_ms']:.1f}", f"{result['quiet_submitted']} of 3")
    report(table, result, args.json)


def quiet_figures(quiet: dict[str, Any]) -> dict[str, Any]:
    """The quiet tenant's figures from what `_quiet` returned."""
    latencies = sorted(quiet["latencies"])
    return {"quiet_requests_ok": len(latencies), "quiet_errors": sum(quiet["errors"].values()),
            "quiet_error_kinds": dict(quiet["errors"]), "quiet_submitted": quiet["submitted"],
            "quiet_p50_ms": statistics.median(latencies) if latencies else float("nan")}


def report(table: Table, result: dict[str, Any], json_path: Path | None) -> None:
    Console().print(table)
    if result["quiet_error_kinds"]:
        Console().print(f"quiet's errors: {result['quiet_error_kinds']}")
    if json_path:
        json_path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
