"""Benchmark: how long `GET /usage` (the service beneath it) takes over N pod rows in SQLite, read
through the daily rollup (what the API answers) beside metering every pod row (the raw path), in
the same run; and how long folding the whole history into the rollup takes once.

The window is the last 30 days to now, so its first and last days are partial (read from the pods).

    .venv/bin/python bench/usage_query.py --pods 100000
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpupool.config import PoolConfig
from gpupool.core.model import Device, Node
from gpupool.providers.fake import FakeProvider
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.orm import Base
from gpupool.server.runtime import Runtime
from gpupool.server.services import metering, usage
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

DAY_S = 86_400.0
REPEAT = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--json", default="", help="where to write the result (default bench/results/)")
    args = parser.parse_args()
    rng = random.Random(1)
    nodes = [
        Node(f"n{i}", 64_000, 262_144, tuple(Device(f"n{i}-{d}", "A100-80GB", d, 81_920) for d in range(8)))
        for i in range(64)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'store.sqlite'}"
        rt = Runtime(
            settings=Settings(data_dir=Path(tmp), database_url=url),
            store=Store.open(url),
            provider=FakeProvider(nodes),
            config=PoolConfig(),
        )
        bootstrap(rt)
        end = time.time()
        start = end - 30 * DAY_S
        with rt.store.write() as session:
            conn = session.connection()
            conn.execute(
                Base.metadata.tables["tenants"].insert(),
                [{"name": f"t{t}", "created_s": start} for t in range(args.tenants)],
            )
            conn.execute(
                Base.metadata.tables["queues"].insert(),
                [{"tenant": f"t{t}", "name": "default", "created_s": start} for t in range(args.tenants)],
            )
            workloads, pods = [], []
            for i in range(args.pods):
                begin = rng.uniform(start, end)
                workloads.append(
                    {
                        "id": f"w{i}",
                        "name": "",
                        "tenant": f"t{i % args.tenants}",
                        "queue": "default",
                        "status": "succeeded",
                        "priority": 0,
                        "device_milli": 250,
                        "spec": {"command": ["x"]},
                        "attempt": 1,
                        "reason": "",
                        "message": "",
                        "submit_s": begin,
                    }
                )
                pods.append(
                    {
                        "id": f"w{i}-a1-r0",
                        "workload_id": f"w{i}",
                        "attempt": 1,
                        "name": "r0",
                        "rank": 0,
                        "status": "succeeded",
                        "node": f"n{i % 64}",
                        "slices": [{"device_index": i % 8, "compute_milli": 250, "memory_mib": 20_480}],
                        "models": [{"model": "A100-80GB", "device_memory_mib": 81_920, "simulated": False}],
                        "cpu_milli": 0,
                        "memory_mib": 0,
                        "message": "",
                        "created_s": begin,
                        "started_s": begin,
                        "finished_s": min(end, begin + rng.expovariate(1 / 3600)),
                    }
                )
            conn.execute(Base.metadata.tables["workloads"].insert(), workloads)
            conn.execute(Base.metadata.tables["pods"].insert(), pods)
        tick = time.perf_counter()
        folded = 0
        while batch := rt.usage_rollup.fold(rt):  # FOLD_BATCH pods a transaction, as the loop does
            folded += batch
        fold_s = time.perf_counter() - tick
        print(f"fold of {folded} ended pods into the rollup: {fold_s:.3f} s (once)")
        admin = Principal(token_id="bench", tenant=None)
        table = Table(title=f"GET /usage over {args.pods:,} pods (best of {REPEAT})")
        for column in ("query", "raw (every pod row) s", "rollup s", "raw / rollup"):
            table.add_column(column)
        figures: dict[str, dict[str, float]] = {}
        for name, by, tenant in (
            ("all tenants, by tenant", "tenant", None),
            ("all tenants, by tenant,model,day", "tenant,model,day", None),
            ("one tenant (invoice)", "queue,model,priority_class", "t0"),
        ):
            best = {}
            for label, answer in (("raw", metering.raw_usage), ("rollup", usage.usage)):
                times = []
                for _ in range(REPEAT):
                    tick = time.perf_counter()
                    answer(rt, admin, tenant=tenant, since_s=start, until_s=end, by=by)
                    times.append(time.perf_counter() - tick)
                best[label] = min(times)
            figures[name] = {"raw_s": round(best["raw"], 3), "rollup_s": round(best["rollup"], 3),
                             "ratio": round(best["raw"] / best["rollup"], 1)}
            ratio = best["raw"] / best["rollup"]
            table.add_row(name, f"{best['raw']:.3f}", f"{best['rollup']:.3f}", f"{ratio:.1f}")
        Console().print(table)
        rt.store.close()
    result = {"pods": args.pods, "fold_s": round(fold_s, 3), "seconds": figures}
    out = Path(args.json) if args.json else Path(__file__).parent / "results" / "usage_query.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
