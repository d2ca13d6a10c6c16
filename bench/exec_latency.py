"""What `gpupool exec` costs: p50 and p99 of running `true` inside a live pod, beside a pod of its own.

    .venv/bin/python bench/exec_latency.py [--execs 50] [--rounds 3] [--json FILE]

One API server (in this process, on loopback) over a simulated local node, one tenant, one held
allocation (`sleep infinity` at 0.5 GPU). Each round runs, alternating which goes first so both see
the same load: `--execs` times `gpupool exec ID -- true` through the CLI's own function (WebSocket,
server, agent, launcher helper, exit code back), the same with `--pty`, and `--execs` times
`submit -- true` until it succeeded (the scheduler places it, the agent launches a pod): the anchor,
what the same command costs without an allocation. As root the pods and execs run as the tenant's
own account (the launcher helper); otherwise as this user.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import uvicorn
from rich.console import Console
from rich.table import Table

from gpupool.cli.alloc_fast import exec_command
from gpupool.client import Client
from gpupool.config import PoolConfig
from gpupool.providers.local import LocalProvider
from gpupool.server.app import create_app
from gpupool.server.db import Store
from gpupool.server.pgtemp import free_port
from gpupool.server.runtime import Runtime
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed(count: int, one: Callable[[], None]) -> list[float]:
    times = []
    for _ in range(count):
        began = time.perf_counter()
        one()
        times.append(1000 * (time.perf_counter() - began))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    null = os.open(os.devnull, os.O_RDWR)  # the execs' stdin and output
    os.dup2(null, 0)
    tmp = Path(tempfile.mkdtemp(prefix="gpupool-exec-bench-"))
    provider = LocalProvider(tmp / "agent", simulate="2xH100", node_name="box")
    port = free_port()
    settings = Settings(data_dir=tmp / "data", port=port, placement="first-fit", cycle_interval_s=0.05,
                        busy_poll_interval_s=0.01)
    rt = Runtime(settings=settings, store=Store.open(settings.resolved_database_url), provider=provider,
                 config=PoolConfig())
    admin_token = bootstrap(rt) or ""
    server = uvicorn.Server(uvicorn.Config(create_app(rt), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    samples: dict[str, list[float]] = {"exec": [], "exec --pty": [], "submit (anchor)": []}
    try:
        with Client(url, admin_token) as admin:
            admin.create_tenant("bench")
            token = admin.create_token("bench").token
        with Client(url, token) as pool:
            held = pool.submit({"command": ["sleep", "infinity"], "resources": {"gpus": 0.5}})
            while pool.workload(held).status != "running":
                time.sleep(0.02)
            saved_out = os.dup(1)

            def run_exec(pty: bool) -> None:
                os.dup2(null, 1)
                try:
                    code = exec_command(held, ["true"], pty=pty, url=url, token=token)
                finally:
                    os.dup2(saved_out, 1)
                if code != 0:
                    raise SystemExit(f"exec exited {code}")

            def run_pod() -> None:
                wid = pool.submit({"command": ["true"], "resources": {"gpus": 0.5}})
                while pool.workload(wid).status not in ("succeeded", "failed", "cancelled"):
                    time.sleep(0.005)

            sides: list[tuple[str, Callable[[], None]]] = [
                ("exec", lambda: run_exec(False)), ("exec --pty", lambda: run_exec(True)),
                ("submit (anchor)", run_pod)]
            for number in range(args.rounds):
                for name, one in (sides if number % 2 == 0 else sides[::-1]):
                    samples[name] += timed(args.execs, one)
            pool.cancel(held)
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        provider.close(stop_pods=True)
    anchor = statistics.median(samples["submit (anchor)"])
    rows = {name: {"n": len(v), "p50_ms": round(statistics.median(v), 1),
                   "p99_ms": round(quantile(v, 0.99), 1),
                   "p50_ratio_to_anchor": round(statistics.median(v) / anchor, 2)}
            for name, v in samples.items()}
    table = Table(title=f"true inside a live pod vs a pod of its own ({args.rounds} rounds, "
                        f"{'root' if os.geteuid() == 0 else 'not root'}, load {os.getloadavg()[0]:.1f})")
    for column in ("what", "n", "p50 ms", "p99 ms", "p50 / anchor"):
        table.add_column(column)
    for name, row in rows.items():
        table.add_row(name, str(row["n"]), f"{row['p50_ms']:.1f}", f"{row['p99_ms']:.1f}",
                      f"{row['p50_ratio_to_anchor']:.2f}x")
    Console(file=sys.stdout).print(table)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "rounds": args.rounds, "execs": args.execs,
                                         "root": os.geteuid() == 0}, indent=1))


if __name__ == "__main__":
    main()
