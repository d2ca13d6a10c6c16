"""Clients that open connections to the API and never finish a request (a "slowloris"), and a
tenant's requests meanwhile, on a server allowed few open files.

    .venv/bin/python bench/slow_clients.py [--connections 2500] [--open-files 2048] [--seconds 5]
        [--json OUT.json]

Starts `gpupool up --simulate 1x8xH100` (SQLite) with its limit of open files, soft and hard, at
`--open-files`, creates tenant `quiet`, then keeps `--connections` connections open from this
process (from 127.0.0.2), each sending a request line and one header and nothing more, and opening
a new one 0.1 s after one is closed. No token is needed for that. After 5 s, `quiet` lists its
workloads every
50 ms for `--seconds` and submits 3 workloads, from a process of its own
(`bench/tenant_streams.py --quiet-only`). It reports the connections held, the server's open
descriptors, and the quiet tenant's errors and latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from _control_plane import gpupool_up
from tenant_flood import prepare_tenants
from tenant_streams import quiet_figures, report

HERE = Path(__file__).resolve().parent
SLOW_SOURCE = "127.0.0.2"
"""The slow clients' address (a loopback one, as every 127/8 address is): the quiet tenant's is
127.0.0.1, as a stranger's and a tenant's addresses differ."""


async def _slow(port: int, until: float, held: list[int], made: list[int]) -> None:
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(SLOW_SOURCE, 0))
        except OSError:
            await asyncio.sleep(0.1)
            continue
        made[0] += 1
        held[0] += 1
        try:
            writer.write(b"GET /api/v1/health HTTP/1.1\r\nHost: pool\r\n")
            await writer.drain()
            await asyncio.wait_for(reader.read(100), max(0.01, until - time.monotonic()))
        except (OSError, TimeoutError):
            pass
        finally:
            held[0] -= 1
            writer.close()
        await asyncio.sleep(0.1)


async def _run(url: str, pid: int, token: str, connections: int, seconds: float) -> dict[str, Any]:
    port = int(url.rsplit(":", 1)[1])
    held, made = [0], [0]
    until = time.monotonic() + 5 + seconds + 15
    tasks = [asyncio.create_task(_slow(port, until, held, made)) for _ in range(connections)]
    await asyncio.sleep(5)
    held_before, fds = held[0], len(os.listdir(f"/proc/{pid}/fd"))
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(HERE / "tenant_streams.py"), "--quiet-only", url, token, str(seconds),
        stdout=asyncio.subprocess.PIPE)
    out, _ = await child.communicate()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"slow_held": held_before, "slow_connections_made": made[0], "server_fds": fds, **json.loads(out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=2500)
    parser.add_argument("--open-files", type=int, default=2048)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.connections + 1000), hard))
    with gpupool_up("--simulate", "1x8xH100", open_files=(args.open_files, args.open_files)) as server:
        token = prepare_tenants(server.url, server.token, 0)["quiet"]
        got = asyncio.run(_run(server.url, server.pid, token, args.connections, args.seconds))
    result = {"server_open_files": args.open_files, "slow_held": got["slow_held"],
              "slow_connections_made": got["slow_connections_made"], "server_fds": got["server_fds"],
              **quiet_figures(got)}
    table = Table(title=f"{args.connections} connections that never finish a request; the server may "
                        f"open {args.open_files} files")
    for column in ("held", "made", "server's descriptors", "quiet ok", "quiet errors", "quiet p50 ms",
                   "quiet submitted"):
        table.add_column(column, justify="right")
    table.add_row(str(result["slow_held"]), str(result["slow_connections_made"]), str(result["server_fds"]),
                  str(result["quiet_requests_ok"]), str(result["quiet_errors"]),
                  f"{result['quiet_p50_ms']:.1f}", f"{result['quiet_submitted']} of 3")
    report(table, result, args.json)


if __name__ == "__main__":
    main()
