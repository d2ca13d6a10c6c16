"""Submit-to-admit latency through a follower beside the same through the leader, several servers
on one PostgreSQL (`gpupool up --ha`).

    .venv/bin/python bench/follower_wake.py [--rounds 40] [--before-src DIR] \\
        [--json bench/results/follower_wake.json]

Two real servers share a throwaway PostgreSQL and one data directory (simulated 2x8xH100). Each
round submits one small workload (`true`, 0.125 GPU), alternately to the leader and to the follower,
at a random moment (so no round lines up with the leader's cycle), and reads the admission time the
store recorded: latency = admitted_s - submit_s (both from servers on this machine's clock).
`--before-src` runs the same rounds a second time with the servers started from another source tree
(e.g. `git archive main src | tar -x -C /tmp/before`), the baseline beside it in the same run.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table
from sqlalchemy import create_engine, text

from failover import Server
from gpupool.server import pgtemp


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(pg: pgtemp.TempPostgres, rounds: int, src: Path | None, rng: random.Random) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gpupool-wake-"))
    url = pg.create_database()
    env = {"GPUPOOL_DATABASE_URL": url, "GPUPOOL_LEASE_S": "10", "GPUPOOL_LEASE_RENEW_S": "2"}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    servers = [Server(root / "data", root / f"server{i}.log", env, "2x8xH100") for i in range(2)]
    engine = create_engine(url)
    try:
        for server in servers:
            server.start()
        token = (root / "data" / "admin-token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        holder = ""
        while not holder:
            with engine.connect() as conn:
                row = conn.execute(text("SELECT s.address FROM leader_lease l JOIN servers s "
                                        "ON s.id = l.holder")).first()
            holder = str(row[0]) if row else ""
            time.sleep(0.1)
        port = int(holder.rsplit(":", 1)[1])
        leader = next(s for s in servers if s.port == port)
        follower = next(s for s in servers if s is not leader)
        got: dict[str, list[float]] = {"leader": [], "follower": []}
        with httpx.Client(headers=headers, timeout=30) as api:
            for i in range(rounds):
                time.sleep(rng.uniform(0.2, 1.2))
                which, server = ("leader", leader) if i % 2 == 0 else ("follower", follower)
                answer = api.post(f"{server.url}/api/v1/workloads",
                                  json={"command": ["true"], "resources": {"gpus": 0.125}})
                answer.raise_for_status()
                wid = answer.json()["id"]
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    body = api.get(f"{leader.url}/api/v1/workloads/{wid}").json()
                    if body.get("admitted_s") is not None:
                        got[which].append(float(body["admitted_s"]) - float(body["submit_s"]))
                        break
                    time.sleep(0.01)
                else:
                    raise SystemExit(f"workload {wid} not admitted within 30 s")
        return {path: {"n": len(v), "p50_ms": statistics.median(v) * 1000, "p90_ms": _pct(v, 0.9) * 1000,
                       "max_ms": max(v) * 1000} for path, v in got.items()}
    finally:
        engine.dispose()
        for server in servers:
            if server.proc is not None and server.proc.poll() is None:
                server.proc.terminate()
                server.proc.wait(30)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--before-src", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=Path("bench/results/follower_wake.json"))
    args = parser.parse_args()
    reason = pgtemp.why_unavailable()
    if reason:
        raise SystemExit(f"needs PostgreSQL: {reason}")
    pg = pgtemp.start()
    rng = random.Random(args.seed)
    results: dict[str, Any] = {}
    try:
        results["this tree"] = measure(pg, args.rounds, None, rng)
        if args.before_src is not None:
            results["before"] = measure(pg, args.rounds, args.before_src.resolve(), rng)
    finally:
        pg.stop()
    table = Table(title="submit to admit, several servers on one PostgreSQL")
    for column in ("code", "submitted to", "n", "p50 ms", "p90 ms", "max ms"):
        table.add_column(column, justify="right" if column not in ("code", "submitted to") else "left")
    for code, paths in results.items():
        for path, row in paths.items():
            table.add_row(code, path, str(row["n"]), f"{row['p50_ms']:.1f}", f"{row['p90_ms']:.1f}",
                          f"{row['max_ms']:.1f}")
    Console().print(table)
    ratios = {code: paths["follower"]["p50_ms"] / paths["leader"]["p50_ms"]
              for code, paths in results.items()}
    print("follower / leader p50:", {k: round(v, 2) for k, v in ratios.items()})
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rounds": args.rounds, "results": results,
                                     "follower_over_leader_p50": ratios}, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
