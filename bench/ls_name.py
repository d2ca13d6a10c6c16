"""Wall time of `gpupool ls -o name` as a command on a pool holding 10,000 workloads (target < 0.5 s).

The store is filled through the API (`gpupool up --provider fake`, its one node cordoned so the
10,000 workloads stay pending and nothing runs), then each command is timed end to end as a process,
N times in sequence. Beside it: Python's own start-up (the floor), `gpupool ls` (a 50-row table) and
`gpupool ls -o json` (every workload as a whole object, read 1,000 a page) - what listing every id
costs without the API's ids-only pages (`fields=id`, 10,000 a page).

    .venv/bin/python bench/ls_name.py [--workloads 10000] [--calls 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from _control_plane import RawHttpClient, gpupool_up, p50_ms, write_json

GPUPOOL = Path(sys.executable).parent / "gpupool"
CONNECTIONS = 4


async def _fill(url: str, token: str, count: int) -> None:
    """Submit `count` workloads over CONNECTIONS keep-alive connections."""
    async def one_connection(n: int) -> None:
        client = RawHttpClient(url)
        request = client.request_bytes("POST", "/api/v1/workloads", token,
                                       {"command": ["true"], "resources": {"gpus": 0.25}})
        for _ in range(n):
            status, body = await client.send(request)
            if status != 201:
                raise RuntimeError(f"submit answered {status}: {body[:200]!r}")

    share = [count // CONNECTIONS + (i < count % CONNECTIONS) for i in range(CONNECTIONS)]
    await asyncio.gather(*(one_connection(n) for n in share))


def _time(argv: list[str], env: dict[str, str], calls: int) -> tuple[list[float], int]:
    """Wall seconds per call, and the lines the last call printed."""
    samples, printed = [], 0
    for _ in range(calls):
        start = time.perf_counter()
        out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
        samples.append(time.perf_counter() - start)
        printed = len(out.splitlines())
    return samples, printed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--json", default="")
    opts = parser.parse_args()
    with gpupool_up("--provider", "fake", "--simulate", "1x8xH100") as server:
        headers = {"Authorization": f"Bearer {server.token}"}
        with httpx.Client(base_url=server.url + "/api/v1", headers=headers) as api:
            api.patch("/tenants/default", json={"max_pending": opts.workloads + 1000}).raise_for_status()
            (node,) = api.get("/nodes").json()
            api.post(f"/nodes/{node['name']}/cordon").raise_for_status()
            started = time.perf_counter()
            asyncio.run(_fill(server.url, server.token, opts.workloads))
            fill_s = time.perf_counter() - started
            total = api.get("/workloads", params={"limit": 1}).json()["total"]
        env = {**os.environ, "GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.token}
        commands = {
            "python -c pass (floor)": [sys.executable, "-c", "pass"],
            "gpupool ls -o name": [str(GPUPOOL), "ls", "-o", "name"],
            "gpupool ls (table, 50 rows)": [str(GPUPOOL), "ls"],
            "gpupool ls -o json (all, whole objects)": [str(GPUPOOL), "ls", "-o", "json"],
        }
        results: dict[str, dict[str, float]] = {}
        for name, argv in commands.items():
            calls = opts.calls if "json" not in name else max(1, opts.calls // 5)
            samples, printed = _time(argv, env, calls)
            results[name] = {"calls": calls, "p50_s": round(p50_ms(samples) / 1000, 3),
                             "max_s": round(max(samples), 3), "lines": printed}
    table = Table(title=f"{total} workloads in the store (filled in {fill_s:.1f} s); "
                  "target: ls -o name < 0.5 s")
    for column in ("command", "calls", "p50 s", "max s", "lines printed"):
        table.add_column(column)
    for name, row in results.items():
        table.add_row(name, *(f"{v:g}" for v in row.values()))
    Console().print(table)
    payload: dict[str, object] = {
        "workloads": total, "fill_s": round(fill_s, 1), **results,
        "ls_name_p50_s": results["gpupool ls -o name"]["p50_s"],  # flat, for bench/side_by_side.py
        "load_average_1m": os.getloadavg()[0],
    }
    print(f"JSON: {write_json(opts.json, 'ls_name', payload)}")


if __name__ == "__main__":
    main()
