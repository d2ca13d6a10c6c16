"""What one store audit costs (loops/store_audit.py) at 1,000 nodes and 7,000 running allocations.

    .venv/bin/python bench/store_audit.py [--nodes 1000] [--allocations 7000] [--rounds 20]

A control loop on the fake provider (8 devices a node, first-fit) admits `--allocations` one-GPU
workloads; then one audit (`compare`: the fresh read of every active pod and of the admitted and
running workloads, and the comparison with the cache) is timed `--rounds` times, beside one
snapshot read (`load`, cached) for scale. On SQLite, and on PostgreSQL when one can be started here.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from gpupool.api.workloads import WorkloadSpec
from gpupool.config import parse_config
from gpupool.providers.fake import FakeProvider
from gpupool.server import pgtemp
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops.control import ControlLoop
from gpupool.server.loops.snapshot import load
from gpupool.server.loops.store_audit import compare
from gpupool.server.runtime import Runtime
from gpupool.server.services import workloads
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

ADMIN = Principal("admin", None)
CONFIG = "scheduling:\n  placement: first-fit\n"


def measure(url: str, data_dir: Path, nodes: int, allocations: int, rounds: int) -> dict[str, float]:
    now = [1_000_000.0]
    provider = FakeProvider(f"{nodes}x8xH100", clock=lambda: now[0], duration_s=1e9)
    settings = Settings(data_dir=data_dir, database_url=url, store_audit_interval_s=0)
    rt = Runtime(settings=settings, store=Store.open(url), provider=provider, clock=lambda: now[0],
                 config=parse_config(CONFIG))
    try:
        bootstrap(rt)
        loop = ControlLoop(rt)
        loop.recovered = loop.reconciler.recover()
        spec = WorkloadSpec.model_validate({"command": ["train"], "resources": {"gpus": 1}})
        for _ in range(allocations):
            workloads.submit(rt, ADMIN, spec)
        for _ in range(20):
            now[0] += 1.0
            loop.step()
            if len(loop.scheduler.cache.allocations()) >= allocations:
                break
        cache = loop.scheduler.cache
        held = len(cache.allocations())
        assert held == allocations, f"only {held} of {allocations} admitted"
        audits, loads = [], []
        for _ in range(rounds):
            start = time.perf_counter()
            found = compare(rt, cache)
            audits.append(time.perf_counter() - start)
            assert not found, found.line()
            start = time.perf_counter()
            load(rt, cache, now_s=now[0])
            loads.append(time.perf_counter() - start)
        return {"audit_ms": 1000 * statistics.median(audits), "audit_max_ms": 1000 * max(audits),
                "load_ms": 1000 * statistics.median(loads)}
    finally:
        rt.store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--allocations", type=int, default=7000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stores = [("sqlite", f"sqlite:///{Path(tmp) / 'store.sqlite'}")]
        reason = pgtemp.why_unavailable()
        server = None if reason else pgtemp.start()
        if server is not None:
            stores.append(("postgresql", server.create_database()))
        else:
            print(f"postgresql: skipped ({reason})")
        try:
            for name, url in stores:
                result = measure(url, Path(tmp), args.nodes, args.allocations, args.rounds)
                print(f"{name}: {args.nodes} nodes, {args.allocations} allocations: one audit "
                      f"{result['audit_ms']:.1f} ms median (max {result['audit_max_ms']:.1f}), "
                      f"one cached snapshot read {result['load_ms']:.1f} ms; at one audit a minute "
                      f"{result['audit_ms'] / 600:.3f} % of the loop's time")
        finally:
            if server is not None:
                server.stop()


if __name__ == "__main__":
    main()
