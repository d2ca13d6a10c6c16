"""One tenant floods the API; another tenant's requests meanwhile: with each tenant's request rate
bounded (the default) and without (`--tenant-request-rate off`), alternating, one `gpupool up` each.

    .venv/bin/python bench/tenant_flood.py [--rounds 3] [--seconds 10] [--connections 16]
        [--workloads 2000] [--flood-tenants 1] [--flood-token tenant|unknown|random] [--json OUT.json]

Each round starts `gpupool up --simulate 1x8xH100` (SQLite) with one setting, creates tenants
`flood` and `quiet`, and stores `--workloads` held workloads of `flood` (so its listings cost what
a busy tenant's do). Then for `--seconds`, `flood` sends `GET /workloads?limit=ROWS` (`--rows`) on
`--connections` keep-alive connections as fast as they are answered, while `quiet` lists its own
workloads every 50 ms on one connection (from 0.5 s in). It reports `quiet`'s latency (p50, p99),
the requests `flood` had served, refused (429) and refused as unauthorized (401) per second, and the server's
CPU. `--flood-token unknown` / `random` make the flood a stranger's: one token the pool does not
know, or a new made-up one each request. `--flood-tenants N`: N tenants flood at once, each with
`--workloads` held workloads, the connections shared between them. Every request is a real HTTP
call on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from _control_plane import gpupool_up

API = "/api/v1"
SETTINGS = {"bounded": [], "off": ["--tenant-request-rate", "off"]}
WARM_UP_S = 0.5
"""The quiet tenant's first request waits this long: the flood's connections opening in this same
process (16 at once) would otherwise be its worst latency, whatever the server does."""


def prepare_tenants(url: str, admin: str, workloads: int, flooding: int = 1) -> dict[str, str]:
    """Tokens of `quiet` and of the flooding tenants (`flood`, or `flood-0`..), each holding
    `workloads` held workloads."""
    tokens = {}
    names = ["flood"] if flooding == 1 else [f"flood-{i}" for i in range(flooding)]
    with httpx.Client(base_url=url + API, headers={"Authorization": f"Bearer {admin}"}, timeout=60) as c:
        for name in ("quiet", *names):
            c.post("/tenants", json={"name": name, "max_pending": max(workloads, 10)}).raise_for_status()
            made = c.post("/tokens", json={"tenant": name, "name": "bench"})
            made.raise_for_status()
            tokens[name] = made.json()["token"]
        for name in names:
            spec = {"command": ["true"], "resources": {"gpus": 1}, "tenant": name}
            left = workloads
            while left:
                size = min(1000, left)
                c.post("/workloads", params={"hold": "true"},
                       json={**spec, "array": f"0-{size - 1}"}).raise_for_status()
                left -= size
    return tokens


async def _flood(url: str, token: str, until: float, counts: dict[str, int], rows: int, kind: str) -> None:
    async with httpx.AsyncClient(base_url=url + API, headers={"Authorization": f"Bearer {token}"},
                                 timeout=60) as c:
        while time.monotonic() < until:
            headers = {"Authorization": f"Bearer {secrets.token_urlsafe(32)}"} if kind == "random" else None
            answer = await c.get("/workloads", params={"limit": rows}, headers=headers)
            key = "served" if answer.status_code == 200 else str(answer.status_code)
            counts[key] = counts.get(key, 0) + 1


async def _quiet(url: str, token: str, until: float, latencies: list[float], errors: list[int]) -> None:
    async with httpx.AsyncClient(base_url=url + API, headers={"Authorization": f"Bearer {token}"},
                                 timeout=60) as c:
        await asyncio.sleep(WARM_UP_S)
        while time.monotonic() < until:
            start = time.perf_counter()
            answer = await c.get("/workloads", params={"limit": 20})
            latencies.append(1000 * (time.perf_counter() - start))
            if answer.status_code != 200:
                errors.append(answer.status_code)
            await asyncio.sleep(0.05)


async def _load(url: str, tokens: dict[str, str], seconds: float, connections: int, rows: int, kind: str,
                ) -> tuple[dict[str, int], list[float], list[int]]:
    counts = {"served": 0, "429": 0}  # shared: the coroutines take turns on one thread
    latencies: list[float] = []
    errors: list[int] = []
    until = time.monotonic() + seconds
    flooding = [token for name, token in tokens.items() if name != "quiet"]
    await asyncio.gather(_quiet(url, tokens["quiet"], until, latencies, errors),
                         *(_flood(url, flooding[i % len(flooding)], until, counts, rows, kind)
                           for i in range(connections)))
    return counts, latencies, errors


def _round(setting: str, args: argparse.Namespace) -> dict[str, Any]:
    with gpupool_up("--simulate", "1x8xH100", *SETTINGS[setting]) as server:
        tokens = prepare_tenants(server.url, server.token, args.workloads, args.flood_tenants)
        cpu = server.cpu_s()
        if args.flood_token != "tenant":  # not a token of this pool: refused, as a stranger's would be
            tokens = {"quiet": tokens["quiet"], "flood": "not-a-token-of-this-pool"}
        counts, latencies, errors = asyncio.run(_load(server.url, tokens, args.seconds, args.connections,
                                                         args.rows, args.flood_token))
        cpu = server.cpu_s() - cpu
    latencies.sort()
    return {"setting": setting, "quiet_p50_ms": statistics.median(latencies),
            "quiet_p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            "quiet_requests": len(latencies), "quiet_errors": len(errors),
            "flood_served_per_s": counts["served"] / args.seconds,
            "flood_refused_per_s": counts.get("429", 0) / args.seconds,
            "flood_unauthorized_per_s": counts.get("401", 0) / args.seconds,
            "server_cpu_share": cpu / args.seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rows", type=int, default=200,
                        help="workloads each of the flood's listings asks for (1: cheap requests)")
    parser.add_argument("--workloads", type=int, default=2000,
                        help="held workloads of the flooding tenant")
    parser.add_argument("--flood-tenants", type=int, default=1,
                        help="tenants flooding at once, the connections shared between them")
    parser.add_argument("--flood-token", choices=("tenant", "unknown", "random"), default="tenant",
                        help="what the flood sends: its tenant's token, one token this pool does not know, "
                             "or a new random one each request (a stranger guessing)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rounds = []
    for i in range(args.rounds):
        for setting in ("off", "bounded"):
            got = _round(setting, args)
            rounds.append(got)
            print(f"round {i + 1} {setting}: quiet p50 {got['quiet_p50_ms']:.1f} ms, "
                  f"p99 {got['quiet_p99_ms']:.1f} ms, flood served {got['flood_served_per_s']:.0f}/s, "
                  f"refused {got['flood_refused_per_s']:.0f}/s, unauthorized "
                  f"{got['flood_unauthorized_per_s']:.0f}/s, server CPU {got['server_cpu_share']:.2f}",
                  flush=True)
    summary: dict[str, Any] = {}
    for setting in ("off", "bounded"):
        mine = [r for r in rounds if r["setting"] == setting]
        summary[setting] = {key: statistics.median(r[key] for r in mine)
                            for key in mine[0] if key != "setting"}
    for key in ("quiet_p50_ms", "quiet_p99_ms", "server_cpu_share"):
        summary[f"{key}_bounded_over_off"] = summary["bounded"][key] / summary["off"][key]
    for key in ("quiet_p50_ms", "quiet_p99_ms", "quiet_errors", "server_cpu_share"):
        for setting in ("off", "bounded"):  # flat, for bench/side_by_side.py --metric
            summary[f"{setting}_{key}"] = summary[setting][key]
    tenants = "one tenant" if args.flood_tenants == 1 else f"{args.flood_tenants} tenants"
    who = {"tenant": tenants, "unknown": "a stranger (one unknown token)",
           "random": "a stranger (a made-up token each request)"}[args.flood_token]
    table = Table(title=f"{who} flooding on {args.connections} connections, another listing every "
                        f"50 ms (medians of {args.rounds} alternating rounds of {args.seconds:g} s)")
    for column in ("per-tenant rate", "quiet p50 ms", "quiet p99 ms", "quiet errors", "flood served /s",
                   "flood refused /s", "flood 401 /s", "server CPU"):
        table.add_column(column, justify="left" if column == "per-tenant rate" else "right")
    for setting, label in (("off", "off"), ("bounded", "default (100/s, 3,000/min)")):
        s = summary[setting]
        table.add_row(label, f"{s['quiet_p50_ms']:.1f}", f"{s['quiet_p99_ms']:.1f}",
                      f"{s['quiet_errors']:.0f}", f"{s['flood_served_per_s']:.0f}",
                      f"{s['flood_refused_per_s']:.0f}", f"{s['flood_unauthorized_per_s']:.0f}",
                      f"{s['server_cpu_share']:.2f}")
    Console().print(table)
    Console().print(f"bounded / off: quiet p50 {summary['quiet_p50_ms_bounded_over_off']:.2f}, "
                    f"p99 {summary['quiet_p99_ms_bounded_over_off']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, **summary}, indent=1))


if __name__ == "__main__":
    main()
