"""How decisions reach the store under load: a stop storm and cancels racing admissions.

    .venv/bin/python bench/stop_storm.py [--pods 1000] [--races 200] [--json bench/results/stop_storm.json]

Stop storm: `--pods` pods of 0.1 GPU run on one node (one class, 30 s grace) of a control loop on
the fake provider; the node fails and the loop takes one step. Counted from the events table: the
evictions stored with the eviction's reason and message, the grace each pod was stopped with,
the cycles it took, and the longest write transaction. On SQLite, and on PostgreSQL when one can
be started here.

Cancel race (PostgreSQL only): `--races` workloads are submitted, and half of them are cancelled
at the worst moment, each cancel committed on its own connection between the scheduler's read of
the statuses and its write. Counted from the events table: cancelled workloads that were admitted
or ran after their cancel (must be 0), and pods the provider was asked to launch for them.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.api.workloads import WorkloadSpec
from gpupool.config import parse_config
from gpupool.providers.fake import FakeProvider
from gpupool.server import pgtemp
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops import applier as applier_module
from gpupool.server.loops.control import ControlLoop
from gpupool.server.orm import EventRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import workloads
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

ADMIN = Principal("admin", None)
CONFIG = """\
scheduling:
  placement: first-fit
priority_classes:
  - {name: low, value: 0, preemptible: true, grace: 30s}
"""
EVICTION_MESSAGE = "A node or device it ran on became unhealthy"


class _Provider(FakeProvider):
    """The fake provider, noting the grace of every stop."""

    def __init__(self, nodes: str, **kwargs: Any) -> None:
        super().__init__(nodes, **kwargs)
        self.graces: dict[str, float] = {}

    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        self.graces[pod_id] = grace_s
        super().stop(pod_id, grace_s)


class _Loop:
    """A control loop on the fake provider with a clock moved by hand; counts cycles and write holds."""

    def __init__(self, url: str, data_dir: Path, nodes: str) -> None:
        self.now = 1_000_000.0
        self.provider = _Provider(nodes, clock=lambda: self.now, duration_s=1e9)
        settings = Settings(data_dir=data_dir, database_url=url, cycle_interval_s=0.05)
        self.rt = Runtime(settings=settings, store=Store.open(url), provider=self.provider,
                          clock=lambda: self.now, config=parse_config(CONFIG))
        bootstrap(self.rt)
        self.holds_s: list[float] = []
        write = self.rt.store.write

        @contextmanager
        def timed() -> Iterator[Session]:
            began = time.perf_counter()
            try:
                with write() as session:
                    yield session
            finally:
                self.holds_s.append(time.perf_counter() - began)

        self.rt.store.write = timed  # type: ignore[method-assign]
        self.loop = ControlLoop(self.rt)
        self.loop.recovered = self.loop.reconciler.recover()
        self.cycles = 0
        cycle = self.loop.scheduler.cycle

        def counted(capacity_changed: bool = True) -> Any:
            self.cycles += 1
            return cycle(capacity_changed)

        self.loop.scheduler.cycle = counted  # type: ignore[method-assign]

    def submit(self, gpus: float) -> str:
        spec = WorkloadSpec.model_validate({"command": ["train"], "resources": {"gpus": gpus},
                                            "priority_class": "low"})
        return workloads.submit(self.rt, ADMIN, spec).id

    def step(self, advance_s: float = 0.0) -> None:
        self.now += advance_s
        self.loop.step()

    def events(self) -> list[tuple[str, str, str, str, str]]:
        with self.rt.store.read() as session:
            return [(r.workload_id, r.from_status, r.to_status, r.reason, r.message) for r in session.execute(
                select(EventRow.workload_id, EventRow.from_status, EventRow.to_status, EventRow.reason,
                       EventRow.message).order_by(EventRow.id))]


def stop_storm(url: str, data_dir: Path, pods: int) -> dict[str, object]:
    devices = math.ceil(pods / 10)
    run = _Loop(url, data_dir, f"1x{devices}xH100,1x8xH100")
    try:
        ids = [run.submit(0.1) for _ in range(pods)]
        for _ in range(math.ceil(pods / 128) + 2):
            run.step()
        big = run.provider.nodes()[0].name
        on_big = {w for w in ids if run.provider._pods[f"{w}-a1-r0"].launch.node == big}
        run.provider.inject_fault(big)
        run.cycles, run.holds_s = 0, []
        began = time.perf_counter()
        run.step()
        step_s = time.perf_counter() - began
        requeued = [e for e in run.events() if (e[1], e[2]) == ("running", "pending")]
        stored = {w for w, _, _, reason, why in requeued
                  if reason == "evicted_unhealthy" and why.startswith(EVICTION_MESSAGE)}
        graces = [run.provider.graces.get(f"{w}-a1-r0") for w in on_big]
        return {"pods_on_failed_node": len(on_big), "evictions_stored_with_reason": len(stored & on_big),
                "stopped_with_zero_grace": sum(1 for g in graces if g == 0.0),
                "stopped_with_other_grace": sum(1 for g in graces if g not in (None, 0.0)),
                "cycles": run.cycles, "step_s": round(step_s, 3),
                "longest_write_ms": round(1000 * max(run.holds_s, default=0.0), 1)}
    finally:
        run.rt.store.close()


def cancel_race(url: str, data_dir: Path, count: int) -> dict[str, object]:
    run = _Loop(url, data_dir, f"1x{max(8, count)}xH100")
    read = applier_module.states
    try:
        ids = [run.submit(1) for _ in range(count)]
        to_cancel = set(ids[::2])
        landed: list[str] = []

        def read_then_cancel(conn: Any, wanted: Sequence[str], *, with_spec: bool) -> dict[str, Any]:
            rows = read(conn, wanted, with_spec=with_spec)
            if with_spec:
                for workload_id in sorted((to_cancel - set(landed)) & set(wanted)):
                    workloads.cancel(run.rt, ADMIN, workload_id)  # commits on its own connection
                    landed.append(workload_id)
            return rows

        applier_module.states = read_then_cancel  # type: ignore[assignment]
        for _ in range(math.ceil(count / 128) + 2):
            run.step(1.0)
        applier_module.states = read
        for _ in range(2):
            run.step(1.0)
        cancelled: set[str] = set()
        after: set[str] = set()
        for workload_id, _, to, _, _ in run.events():
            if workload_id in cancelled:
                after.add(workload_id)
            if to == "cancelled":
                cancelled.add(workload_id)
        launched = {pod.launch.workload_id for pod in run.provider._pods.values()}
        return {"workloads": count, "cancels_inside_admission": len(landed),
                "cancelled_then_admitted_or_run": len(after),
                "cancelled_launched": len(launched & cancelled),
                "others_running": len(launched - cancelled)}
    finally:
        applier_module.states = read
        run.rt.store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--races", type=int, default=200)
    parser.add_argument("--json", type=Path, default=Path("bench/results/stop_storm.json"))
    args = parser.parse_args()
    logging.getLogger("gpupool.transitions").setLevel(logging.ERROR)  # the race's dropped moves are counted
    results: dict[str, object] = {}
    work = Path(tempfile.mkdtemp(prefix="gpupool-stop-storm-"))
    results["stop_storm_sqlite"] = stop_storm(f"sqlite:///{work / 'storm.sqlite'}", work, args.pods)
    why = pgtemp.why_unavailable()
    if why:
        results["postgresql"] = f"skipped: {why}"
    else:
        server = pgtemp.start()
        try:
            results["stop_storm_postgresql"] = stop_storm(server.create_database(), work, args.pods)
            results["cancel_race_postgresql"] = cancel_race(server.create_database(), work, args.races)
        finally:
            server.stop()
    console = Console()
    for name, figures in results.items():
        table = Table(title=name)
        table.add_column("measure")
        table.add_column("value", justify="right")
        for key, value in (figures.items() if isinstance(figures, dict) else [("", figures)]):
            table.add_row(key, str(value))
        console.print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
