"""What dependencies and holds cost the live scheduler: 10,000 pending, half of them waiting on a
dependency, side by side with the same 10,000 carrying none.

    .venv/bin/python bench/dependencies.py [--pending 10000] [--rounds 5] \
        [--json bench/results/dependencies.json]

Two stores (SQLite) are filled the same way: one simulated 16-GPU node held by 16 running 1-GPU
workloads, then `--pending` pending 1-GPU workloads (none fits). In the `on` store every other one
is submitted with `--dependency afterok:<a running workload>`; in `off` none is. Each round, on
both stores in turn: the scheduler's read of the pending work for a full pass (`snapshot.load`),
the dependency pass judging every waiting workload (`DependencyPass.run(force=True)`, as after a
restart or a pass that changed something; nothing changes, so it writes nothing), the check the
control loop runs when a pod ended elsewhere (`run(force=False)`: one read of the statuses of the
named work), the pass after one more dependent submission (`run(force=False, arrivals=True)`),
and one full scheduling cycle (`Scheduler.cycle`, the read included). Medians over the rounds,
and the ratio on/off; pass_and_cycle_ms is the forced pass plus the cycle.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy import update

from gpupool.api.workloads import WorkloadSpec
from gpupool.providers.fake import FakeProvider
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops.control import ControlLoop
from gpupool.server.loops.snapshot import load
from gpupool.server.orm import TenantRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import workloads
from gpupool.server.services.dependencies import DependencyPass
from gpupool.server.services.submit_writer import commit
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

ADMIN = Principal("admin", None)
BATCH = 500


class _Pool:
    def __init__(self, data_dir: Path, pending: int, dependencies: bool) -> None:
        self.now = 1_000_000.0
        url = f"sqlite:///{data_dir / 'store.sqlite'}"
        provider = FakeProvider("1x16xH100", clock=lambda: self.now, duration_s=1e9)
        self.rt = Runtime(settings=Settings(data_dir=data_dir, database_url=url), store=Store.open(url),
                          provider=provider, clock=lambda: self.now)
        bootstrap(self.rt)
        with self.rt.store.write() as session:  # room for the pending work and each round's arrival
            session.execute(update(TenantRow).values(max_pending=10 * pending))
        self.loop = ControlLoop(self.rt)
        self.loop.recovered = self.loop.reconciler.recover()
        self.with_dependencies = dependencies
        self.running = running = [self._submit({}) for _ in range(16)]
        for _ in range(3):
            self.loop.step()
        batch = []
        for i in range(pending):
            extra = {"dependency": f"afterok:{running[i % 16]}"} if dependencies and i % 2 else {}
            batch.append(workloads.prepare(self.rt, ADMIN, _spec(extra)))
            self.now += 0.001
            if len(batch) == BATCH:
                commit(self.rt, batch)
                batch = []
        if batch:
            commit(self.rt, batch)
        self.rt.submitted.clear()  # as after a restart: the scheduler parses what it reads
        self.loop.step()  # the first full pass: parses and sets aside what does not fit
        self.dependencies = DependencyPass(self.rt)
        self.dependencies.run()  # parses each waiting workload's expression once

    def _submit(self, extra: dict[str, Any]) -> str:
        return workloads.submit(self.rt, ADMIN, _spec(extra)).id

    def measure(self) -> dict[str, float]:
        began = time.perf_counter()
        view = load(self.rt, self.loop.scheduler.cache, now_s=self.now)
        read_s = time.perf_counter() - began
        began = time.perf_counter()
        self.dependencies.run(force=True)
        pass_s = time.perf_counter() - began
        began = time.perf_counter()
        self.dependencies.run(force=False)  # what a pod ending elsewhere costs
        check_s = time.perf_counter() - began
        self.now += 10.0  # one more dependent submission (or a plain one, in 'off'): its arrival pass
        self._submit({"dependency": f"afterok:{self.running[0]}"} if self.with_dependencies else {})
        began = time.perf_counter()
        self.dependencies.run(force=False, arrivals=True)
        arrival_s = time.perf_counter() - began
        began = time.perf_counter()
        self.loop.scheduler.cycle(capacity_changed=True)
        cycle_s = time.perf_counter() - began
        return {"pending_read": len(view.pending), "read_ms": read_s * 1e3,
                "dependency_pass_ms": pass_s * 1e3, "dependency_check_ms": check_s * 1e3,
                "dependency_arrival_ms": arrival_s * 1e3,
                "full_cycle_ms": cycle_s * 1e3,
                "pass_and_cycle_ms": (pass_s + cycle_s) * 1e3}


def _spec(extra: dict[str, Any]) -> WorkloadSpec:
    return WorkloadSpec.model_validate({"command": ["train"], "resources": {"gpus": 1}, **extra})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=Path("bench/results/dependencies.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as off_dir, tempfile.TemporaryDirectory() as on_dir:
        pools = {"off": _Pool(Path(off_dir), args.pending, False),
                 "on": _Pool(Path(on_dir), args.pending, True)}
        rounds: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
        for _ in range(args.rounds):
            for name in ("off", "on"):  # side by side, alternating
                rounds[name].append(pools[name].measure())
        for pool in pools.values():
            pool.rt.store.close()
    metrics = ("pending_read", "read_ms", "dependency_pass_ms", "dependency_check_ms",
               "dependency_arrival_ms", "full_cycle_ms", "pass_and_cycle_ms")
    medians = {name: {m: statistics.median(r[m] for r in rounds[name]) for m in metrics} for name in rounds}
    title = f"{args.pending} pending; 'on': half wait on afterok (median of {args.rounds} rounds)"
    table = Table(title=title)
    for column in ("metric", "dependencies off", "dependencies on", "on / off"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for metric in metrics:
        off, on = medians["off"][metric], medians["on"][metric]
        table.add_row(metric, f"{off:.1f}", f"{on:.1f}", f"{on / off:.2f}" if off else "-")
    Console().print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    result = {"pending": args.pending, "rounds": rounds, "medians": medians}
    args.json.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
