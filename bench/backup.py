"""What `gpupool backup` and `gpupool restore` cost on a large store, beside a plain copy.

    .venv/bin/python bench/backup.py [--workloads 100000] [--rounds 3] [--json bench/results/backup.json]

A store of `--workloads` finished workloads (each with one pod and three events, over 10 tenants)
is written straight into SQLite, and into PostgreSQL when one can be started here. Each round, in
alternation: the SQLite store is backed up (online backup API, manifest, checksums, tar) and
restored into a fresh data directory, beside the baseline of copying the store file and reading it
back (`cp`-like, only safe while no server runs); the PostgreSQL store is backed up and restored,
beside plain `pg_dump -Fc` and `pg_restore` of the same database. Medians over the rounds, and the
ratio of each to its baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy import insert

from gpupool.server import pgtemp
from gpupool.server.backup import _libpq_env, backup, find_pg_tool, restore
from gpupool.server.db import Store
from gpupool.server.orm import Base

TENANTS = 10
SPEC = {"command": ["python", "train.py", "--epochs", "3"],
        "resources": {"gpus": 1, "cpu": 4, "memory": "16GiB"},
        "env": {"EPOCHS": "3", "DATASET": "imagenet"}, "name": "train"}


def fill(url: str, workloads: int) -> None:
    """`workloads` finished workloads with a pod and three events each, over TENANTS tenants."""
    store = Store.open(url)
    tables = Base.metadata.tables
    now = time.time()
    with store.engine.begin() as conn:
        conn.execute(insert(tables["tenants"]), [{"name": f"t{i}", "created_s": now} for i in range(TENANTS)])
        conn.execute(insert(tables["queues"]), [{"tenant": f"t{i}", "name": "default", "created_s": now}
                                                for i in range(TENANTS)])
    step = 5000
    event = 0
    for start in range(0, workloads, step):
        rows, pods, events = [], [], []
        for n in range(start, min(workloads, start + step)):
            wid = f"w-{n:012x}"
            rows.append({"id": wid, "name": f"job-{n}", "tenant": f"t{n % TENANTS}", "queue": "default",
                         "status": "succeeded", "spec": SPEC, "submit_s": now - n, "started_s": now - n + 1,
                         "finished_s": now - n + 60, "exit_code": 0, "device_milli": 1000})
            pods.append({"id": f"{wid}-a1-r0", "workload_id": wid, "attempt": 1, "name": "r0", "rank": 0,
                         "status": "succeeded", "node": f"node-{n % 100:03d}", "slices": [{"device": n % 8}],
                         "created_s": now - n, "finished_s": now - n + 60, "exit_code": 0})
            for to in ("pending", "running", "succeeded"):
                event += 1
                events.append({"id": event, "workload_id": wid, "to_status": to, "reason": to,
                               "message": f"{to} on node-{n % 100:03d}", "at_s": now - n})
        with store.engine.begin() as conn:
            conn.execute(insert(tables["workloads"]), rows)
            conn.execute(insert(tables["pods"]), pods)
            conn.execute(insert(tables["events"]), events)
    store.close()


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def sqlite_round(work: Path, data: Path, url: str) -> dict[str, float]:
    out = work / "sqlite.tar"
    fresh = work / "restored"
    result = {"backup": timed(lambda: backup(data, url, out)),
              "restore": timed(lambda: restore(out, fresh, f"sqlite:///{fresh / 'gpupool.sqlite'}"))}
    copy = work / "copy.sqlite"

    def plain_copy() -> None:
        shutil.copyfile(data / "gpupool.sqlite", copy)
        with copy.open("rb") as handle:
            os.fsync(handle.fileno())

    def plain_read() -> None:
        shutil.copyfile(copy, work / "back.sqlite")

    result["copy"] = timed(plain_copy)
    result["copy back"] = timed(plain_read)
    result["size_mib"] = out.stat().st_size / 2**20
    for path in (out, copy, work / "back.sqlite"):
        path.unlink()
    shutil.rmtree(fresh)
    return result


def pg_round(work: Path, server: pgtemp.TempPostgres, url: str) -> dict[str, float]:
    out = work / "pg.tar"
    target = server.create_database()
    result = {"backup": timed(lambda: backup(work / "pgdata", url, out)),
              "restore": timed(lambda: restore(out, work / "pg-restored", target))}
    dump = work / "plain.pgdump"
    result["copy"] = timed(lambda: subprocess.run([find_pg_tool("pg_dump"), "-Fc", "-f", str(dump)],
                                                  env=_libpq_env(url), check=True))
    plain_target = server.create_database()
    plain_env = _libpq_env(plain_target)
    result["copy back"] = timed(lambda: subprocess.run(
        [find_pg_tool("pg_restore"), "--no-owner", "--exit-on-error", "-d", plain_env["PGDATABASE"],
         str(dump)], env=plain_env, check=True))
    result["size_mib"] = out.stat().st_size / 2**20
    out.unlink()
    dump.unlink()
    shutil.rmtree(work / "pg-restored")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("bench/results/backup.json"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gpupool-bench-backup-"))
    server = None
    try:
        data = work / "data"
        data.mkdir(mode=0o700)
        url = f"sqlite:///{data / 'gpupool.sqlite'}"
        started = time.perf_counter()
        fill(url, args.workloads)
        print(f"SQLite store of {args.workloads} workloads in {time.perf_counter() - started:.1f} s",
              file=sys.stderr)
        pg_url = ""
        if not pgtemp.why_unavailable():
            server = pgtemp.start(fsync=True)
            pg_url = server.create_database()
            (work / "pgdata").mkdir(mode=0o700)
            fill(pg_url, args.workloads)
        rounds: dict[str, list[dict[str, float]]] = {"sqlite": [], "postgresql": []}
        for _ in range(args.rounds):
            rounds["sqlite"].append(sqlite_round(work, data, url))
            if server is not None:
                rounds["postgresql"].append(pg_round(work, server, pg_url))
        report(args, rounds)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report(args: argparse.Namespace, rounds: dict[str, list[dict[str, float]]]) -> None:
    summary: dict[str, Any] = {"workloads": args.workloads, "rounds": args.rounds, "stores": {}}
    table = Table(title=f"backup and restore of {args.workloads:,} workloads (median of {args.rounds})")
    columns = ("store", "backup s", "baseline s", "ratio", "restore s", "baseline s", "ratio", "file MiB")
    for column in columns:
        table.add_column(column, justify="right")
    for kind, results in rounds.items():
        if not results:
            continue
        med = {key: statistics.median(r[key] for r in results) for key in results[0]}
        summary["stores"][kind] = {"median": med, "rounds": results}
        baseline = "file copy" if kind == "sqlite" else "pg_dump / pg_restore"
        table.add_row(f"{kind} (vs {baseline})", f"{med['backup']:.2f}", f"{med['copy']:.2f}",
                      f"{med['backup'] / med['copy']:.2f}", f"{med['restore']:.2f}",
                      f"{med['copy back']:.2f}", f"{med['restore'] / med['copy back']:.2f}",
                      f"{med['size_mib']:.1f}")
    Console(width=140).print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    sys.exit(main())
