"""What a full pass's pending read costs when more waits than one read takes: the core's order
against the tenants taking turns within each priority (loops/snapshot.py), in one process, alternating.

    .venv/bin/python bench/pending_read.py [--pending 10000] [--tenants 8] [--rounds 20]
        [--backends sqlite,postgresql] [--json OUT.json]

Each backend's store gets `--pending` workloads of `--tenants` tenants (arrays of 1,000 tasks, one
tenant after another, so the oldest `MAX_PENDING_PER_CYCLE` are a few tenants' alone). Each round
times the statement of either kind (executed and fetched, in the core's order) and the whole `load`
of a full pass with a warm cache, with either statement, in the process's CPU time and wall clock.
PostgreSQL is a throwaway server on loopback (pgtemp); it is skipped, with the reason, where its
binaries are missing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpupool.api.tenants import TenantCreate
from gpupool.api.workloads import WorkloadSpec
from gpupool.providers.fake import FakeProvider
from gpupool.server import pgtemp
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops import snapshot
from gpupool.server.runtime import Runtime
from gpupool.server.services import tenants, workloads
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

ADMIN = Principal("admin", None)
LIMIT = snapshot.MAX_PENDING_PER_CYCLE


def _fill(rt: Runtime, pending: int, tenant_count: int) -> None:
    spec = {"command": ["train"], "resources": {"gpus": 1}}
    names = [f"team-{i}" for i in range(tenant_count)]
    for name in names:
        tenants.create_tenant(rt, ADMIN, TenantCreate(name=name, unix_user=None, max_pending=pending))
    left, i = pending, 0
    while left:
        size = min(1000, left)
        workloads.submit(rt, Principal("t", names[i % tenant_count]),
                         WorkloadSpec.model_validate({**spec, "array": f"0-{size - 1}"}))
        left, i = left - size, i + 1


@contextlib.contextmanager
def _in_order() -> Iterator[None]:
    """`load` as it read before turns were taken: always in the core's order."""
    taking_turns = snapshot._pending_read
    snapshot._pending_read = lambda arrivals, backoff, limit, turns=False: taking_turns(  # type: ignore
        arrivals, backoff, limit, False)
    try:
        yield
    finally:
        snapshot._pending_read = taking_turns


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return 1000 * (time.process_time() - cpu), 1000 * (time.perf_counter() - wall)


def _backend(url: str, data_dir: Path, pending: int, tenant_count: int, rounds: int) -> dict[str, Any]:
    rt = Runtime(settings=Settings(data_dir=data_dir, database_url=url), store=Store.open(url),
                 provider=FakeProvider("4x8xH100"))
    try:
        bootstrap(rt)
        _fill(rt, pending, tenant_count)
        now = rt.clock()
        params = {"now_s": now}

        def statement(turns: bool) -> Callable[[], Any]:
            def read() -> Any:
                with rt.store.read() as session:
                    return session.connection().execute(snapshot._pending_read(False, True, LIMIT, turns),
                                                        params).all()
            return read

        plain_rows, turn_rows = statement(False)(), statement(True)()
        # a cache each (one keeps only what its read holds), each warm: its specs parsed once, as a
        # running loop has them
        cache, in_order = snapshot.WorkloadCache(), snapshot.WorkloadCache()
        snapshot.load(rt, cache, now_s=now)
        with _in_order():
            snapshot.load(rt, in_order, now_s=now)
        tenants_read = {"order": len({r.tenant for r in plain_rows}),
                        "turns": len({r.tenant for r in turn_rows})}
        samples: dict[str, list[tuple[float, float]]] = {"order": [], "turns": [], "load_order": [],
                                                         "load_turns": []}
        for _ in range(rounds):
            samples["order"].append(_timed(statement(False)))
            samples["turns"].append(_timed(statement(True)))
            samples["load_turns"].append(_timed(lambda: snapshot.load(rt, cache, now_s=now)))
            with _in_order():
                samples["load_order"].append(_timed(lambda: snapshot.load(rt, in_order, now_s=now)))
        medians = {kind: {"cpu_ms": statistics.median(c for c, _ in got),
                          "wall_ms": statistics.median(w for _, w in got)} for kind, got in samples.items()}
        ratios = {f"{prefix}turns_over_order_{clock}": medians[prefix + "turns"][f"{clock}_ms"]
                  / medians[prefix + "order"][f"{clock}_ms"]
                  for prefix in ("", "load_") for clock in ("cpu", "wall")}
        return {"rows": len(turn_rows), "tenants_read": tenants_read, "median": medians, **ratios}
    finally:
        rt.store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pending", type=int, default=10_000, help="pending workloads in the store")
    parser.add_argument("--tenants", type=int, default=8, help="tenants they belong to")
    parser.add_argument("--rounds", type=int, default=20, help="alternating rounds per backend")
    parser.add_argument("--backends", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    results: dict[str, Any] = {"pending": args.pending, "tenants": args.tenants, "limit": LIMIT,
                               "rounds": args.rounds}
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            if backend == "sqlite":
                results[backend] = _backend(f"sqlite:///{tmp}/store.sqlite", Path(tmp), args.pending,
                                            args.tenants, args.rounds)
                continue
            reason = pgtemp.why_unavailable()
            if reason:
                results[backend] = {"skipped": reason}
                continue
            server = pgtemp.start()
            try:
                results[backend] = _backend(server.create_database(), Path(tmp), args.pending, args.tenants,
                                            args.rounds)
            finally:
                server.stop()
    table = Table(title=f"a full pass's pending read, {args.pending:,} pending of {args.tenants} tenants, "
                        f"at most {LIMIT:,} read (median of {args.rounds})")
    for column in ("store", "read", "tenants read", "CPU ms", "wall ms", "turns / order"):
        table.add_column(column, justify="right" if column not in ("store", "read") else "left")
    for backend in args.backends.split(","):
        got = results[backend]
        if "skipped" in got:
            table.add_row(backend, "skipped", got["skipped"], "", "", "")
            continue
        for kind, label in (("order", "the core's order"), ("turns", "tenants taking turns"),
                            ("load_order", "whole load(), core's order"),
                            ("load_turns", "whole load(), turns")):
            m = got["median"][kind]
            prefix = {"turns": "", "load_turns": "load_"}.get(kind)
            ratio = "" if prefix is None else (f"{got[prefix + 'turns_over_order_cpu']:.2f} CPU, "
                                               f"{got[prefix + 'turns_over_order_wall']:.2f} wall")
            table.add_row(backend, label, str(got["tenants_read"].get(kind, "")), f"{m['cpu_ms']:.1f}",
                          f"{m['wall_ms']:.1f}", ratio)
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
