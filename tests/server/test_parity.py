"""Parity: the server's control loop and `sim replay` run the same scheduling code, and decide alike.

One trace (a synthetic one that always runs; a few hundred Philly and OpenB jobs when the shared
data is there) goes through the replay and through the server's loop (fake provider, a virtual
clock, the store), with the same configuration: drf ordering, preemption, backfill, two tenants
whose queues share a cohort, and one injected node failure, repaired later. Both must make the
same admissions (with the same placements), preemptions, evictions and requeues, in the same order.

The server is driven as the replay drives the core: at each event time (an arrival, a pod's end,
the failure or the repair) it takes the arrivals, then runs one step of its loop with a full pass
(`capacity_changed`), as the replay runs its cycles on every pending workload.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from gpupool.config import PoolConfig, parse_config
from gpupool.core.budgets import Budget, BudgetPeriod, period_end
from gpupool.core.model import Node, Reason, Workload
from gpupool.core.scheduling.cycle import CycleResult, EventKind
from gpupool.providers.fake import FakeProvider, nodes_from_spec
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops.control import ControlLoop
from gpupool.server.runtime import Runtime
from gpupool.server.schemas.tenants import TenantCreate, TenantUpdate
from gpupool.server.schemas.workloads import WorkloadSpec
from gpupool.server.services import tenants, workloads
from gpupool.server.services.specs import to_workload
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import NodeFailure, Replay, ReplayConfig

ADMIN = Principal("admin", None)
Entry = tuple[Any, ...]


@dataclass(frozen=True)
class Job:
    """One trace job as a user submits it: its id, tenant, spec, arrival and run time."""

    id: str
    tenant: str
    spec: dict[str, Any]
    submit_s: float
    duration_s: float


def config_text(tenants: Sequence[str]) -> str:
    cohort, others = tenants[:2], tenants[2:]
    lines = ["scheduling:", "  placement: fgd-strand", "  ordering: drf", "  preemption: true",
             "  backfill: true", "queues:"]
    lines += [f"  - {{tenant: {t}, quota: 8, cohort: research, borrowing_limit: 8}}" for t in cohort]
    lines += [f"  - {{tenant: {t}}}" for t in others]
    return "\n".join(lines) + "\n"


def log_of(result: CycleResult, now: float) -> Iterator[Entry]:
    """A cycle's decisions, comparable across the two runs."""
    for stop in result.preempted:
        kind = "evict" if stop.kind is EventKind.EVICT else "preempt"
        yield (round(now, 6), kind, stop.workload_id, stop.preemptor_id, stop.reason.value)
    for requeue in result.requeued:
        yield (round(now, 6), "requeue", requeue.workload_id)
    for admission in result.admitted:
        where = tuple(sorted((p.pod, p.node, tuple((s.device_index, s.compute_milli, s.memory_mib)
                                                    for s in p.slices)) for p in admission.placements))
        yield (round(now, 6), "admit", admission.workload_id, where)
    for rejection in result.rejected:
        if rejection.final:
            yield (round(now, 6), "reject", rejection.workload_id, rejection.reason.value)


# ------------------------------------------------------------------ the replay


def run_replay(nodes: Sequence[Node], jobs: Sequence[Job], config: PoolConfig,
               failure: NodeFailure, budgets: Mapping[str, Budget] | None = None) -> list[Entry]:
    log: list[Entry] = []

    class Logged(Replay):
        def _apply(self, result: CycleResult, now_s: float) -> None:
            log.extend(log_of(result, now_s))
            super()._apply(result, now_s)

    trace = [TraceJob(core_workload(job), job.submit_s, job.duration_s) for job in jobs]
    Logged(ReplayConfig(nodes=tuple(nodes), jobs=tuple(trace), policies=config.policies(), seed=7,
                        failures=(failure,), prices=config.prices.price_book() if budgets else None,
                        budgets=budgets or {})).run()
    return log


def core_workload(job: Job) -> Workload:
    """The Workload the server builds from the job's spec (the same function the API uses)."""
    return to_workload(job.id, WorkloadSpec.model_validate(job.spec), job.tenant, 0, job.submit_s)


# ------------------------------------------------------------------ the server


class ServerRun:
    """The server's control loop on a fake provider and a virtual clock."""

    def __init__(self, tmp_path: Path, nodes: Sequence[Node], config: PoolConfig) -> None:
        self.now = 0.0
        self.provider = FakeProvider(list(nodes), clock=lambda: self.now)
        url = f"sqlite:///{tmp_path / 'parity.sqlite'}"
        settings = Settings(data_dir=tmp_path, database_url=url, seed=7)
        self.rt = Runtime(settings=settings, store=Store.open(url), provider=self.provider,
                          clock=lambda: self.now, config=config)
        bootstrap(self.rt)
        self.loop = ControlLoop(self.rt)
        self.loop.recovered = self.loop.reconciler.recover()
        self.log: list[Entry] = []
        self.budgets: dict[str, Budget] = {}
        self.period_end_s: float | None = None
        """While work waits for a budget, the end of its tenant's period: a step then, as the
        replay wakes (`budget_period`) with no other event."""
        keeper = self.loop.scheduler.keeper
        cycle = keeper.cycle

        def logged(snapshot: Any, pending: Any, policies: Any, now_s: float,
                   rng: random.Random, **options: Any) -> CycleResult:
            result = cycle(snapshot, pending, policies, now_s, rng, **options)
            self.log.extend(log_of(result, now_s))
            tenant_of = {w.id: w.tenant for w in pending}
            waited = {tenant_of[r.workload_id] for r in result.rejected
                      if r.reason is Reason.BUDGET_EXHAUSTED}
            if waited and self.period_end_s is None:
                self.period_end_s = min(period_end(self.budgets[t].period, now_s) for t in waited)
            return result

        keeper.cycle = logged  # type: ignore[method-assign, assignment]

    def next_end(self) -> float | None:
        """When the next running fake pod ends on its own."""
        ends = [p.started_at_s + self.provider.startup_s + p.duration_s
                for p in self.provider._pods.values()
                if p.stop_at_s is None and not self.provider._status(p).phase.is_final]
        return min(ends, default=None)

    def run(self, jobs: Sequence[Job], failure: NodeFailure) -> list[Entry]:
        arrivals = sorted(jobs, key=lambda j: (j.submit_s, j.id))
        faults = [(failure.at_s, "fail"), (failure.at_s + failure.repair_after_s, "heal")]
        i = 0
        while True:
            times = [t for t in (arrivals[i].submit_s if i < len(arrivals) else None, self.next_end(),
                                 faults[0][0] if faults else None, self.period_end_s) if t is not None]
            if not times:
                return self.log
            self.now = min(times)
            if self.now == self.period_end_s:
                self.period_end_s = None
            self.rt.budgets.invalidate()  # spend as of now, as the replay meters it every cycle
            while i < len(arrivals) and arrivals[i].submit_s == self.now:
                self.submit(arrivals[i])
                i += 1
            while faults and faults[0][0] == self.now:
                _, what = faults.pop(0)
                if what == "fail":
                    self.provider.inject_fault(failure.node)
                else:
                    self.provider.clear_fault(failure.node)
            self.rt.capacity_changed.set()  # a full pass, as the replay's cycles
            self.loop.step()
            # pods that waited for a preempted pod to leave start now: the fake provider stops at once
            self.loop.reconciler.sync()
            self.loop.scheduler.promote_waiting()

    def submit(self, job: Job) -> None:
        spec = dict(job.spec, tenant=job.tenant,
                    env={"GPUPOOL_FAKE_DURATION_S": repr(job.duration_s)})
        assert workloads.submit(self.rt, ADMIN, WorkloadSpec.model_validate(spec)).id == job.id

    def close(self) -> None:
        self.rt.store.close()


def run_server(tmp_path: Path, nodes: Sequence[Node], jobs: Sequence[Job], config: PoolConfig,
               failure: NodeFailure, monkeypatch: pytest.MonkeyPatch,
               budgets: Mapping[str, Budget] | None = None) -> list[Entry]:
    order = iter(sorted(jobs, key=lambda j: (j.submit_s, j.id)))
    monkeypatch.setattr(workloads, "new_workload_id", lambda: next(order).id)
    server = ServerRun(tmp_path, nodes, config)
    server.budgets = dict(budgets or {})
    for tenant, budget in server.budgets.items():
        if tenant not in {t.name for t in tenants.list_tenants(server.rt, ADMIN)}:
            tenants.create_tenant(server.rt, ADMIN, TenantCreate.model_validate({"name": tenant}))
        tenants.update_tenant(server.rt, ADMIN, tenant, TenantUpdate(
            budget=budget.amount, budget_period=budget.period.value, budget_warn=budget.warn_fraction,
            overdraft=budget.overdraft))
    try:
        log = server.run(jobs, failure)
        # the loop audits its kept view against the store every minute (of the trace's time): no drift
        assert server.loop.scheduler.keeper.drifts == 0
        return log
    finally:
        server.close()


def check_parity(tmp_path: Path, nodes: Sequence[Node], jobs: Sequence[Job], failure: NodeFailure,
                 monkeypatch: pytest.MonkeyPatch, budgets: Mapping[str, Budget] | None = None) -> list[Entry]:
    names = sorted({j.tenant for j in jobs})
    config = parse_config(config_text(names))
    expected = run_replay(nodes, jobs, config, failure, budgets)
    got = run_server(tmp_path, nodes, jobs, config, failure, monkeypatch, budgets)
    for n, (want, have) in enumerate(zip(expected, got, strict=False)):
        assert have == want, f"decision {n} differs: replay {want}, server {have}"
    assert len(got) == len(expected)
    return expected


def kinds(log: Sequence[Entry]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in log:
        counts[entry[1]] = counts.get(entry[1], 0) + 1
    return counts


# ------------------------------------------------------------------ traces


def synthetic_jobs(count: int, seed: int) -> list[Job]:
    """Fractions, whole devices and gangs from three tenants, in three priority classes; arrivals
    in bursts so that queues form, preemption and backfill have work to do."""
    rng = random.Random(seed)
    shapes = [({"gpus": 0.25}, 1), ({"gpus": 0.5, "gpu_memory": "20GiB"}, 1), ({"gpus": 1}, 1),
              ({"gpus": 2}, 1), ({"gpus": 4}, 2), ({"gpus": 8}, 1)]
    classes = ["best-effort", "normal", "normal", "high"]
    jobs, now = [], 0.0
    for n in range(count):
        now += rng.expovariate(1 / 40.0)
        resources, replicas = rng.choice(shapes)
        spec: dict[str, Any] = {"command": ["train"], "resources": resources, "replicas": replicas,
                                "priority_class": rng.choice(classes), "name": f"job{n % 7}"}
        duration = round(rng.uniform(60, 3000), 3)
        if rng.random() < 0.3:
            limit = round(rng.uniform(600, 4000), 3)
            spec["time_limit_s"] = limit
            duration = min(duration, limit - 1)
        jobs.append(Job(f"s{n:04d}", rng.choice(["vision", "nlp", "speech"]), spec, round(now, 3), duration))
    return jobs


def test_server_and_replay_decide_alike_on_a_synthetic_trace(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = nodes_from_spec("3x8xH100,2x4xV100M32")
    jobs = synthetic_jobs(300, seed=3)
    failure = NodeFailure(at_s=jobs[120].submit_s + 0.5, node=nodes[0].name, repair_after_s=1800.0)
    log = check_parity(tmp_path, nodes, jobs, failure, monkeypatch)
    seen = kinds(log)
    print("synthetic", seen)
    # the trace exercises what it is meant to: every kind of decision happens
    assert seen.get("admit", 0) >= 300 and seen.get("preempt", 0) > 0 and seen.get("evict", 0) > 0, seen
    assert seen["requeue"] == seen["preempt"] + seen["evict"]


def test_parity_fails_when_the_server_decides_otherwise(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is not blind: a server that ignores its configuration's preemption differs."""
    nodes = nodes_from_spec("2x8xH100")
    jobs = synthetic_jobs(80, seed=5)
    failure = NodeFailure(at_s=jobs[40].submit_s + 0.5, node=nodes[0].name, repair_after_s=900.0)
    tenants = sorted({j.tenant for j in jobs})
    config = parse_config(config_text(tenants))
    expected = run_replay(nodes, jobs, config, failure)
    off = config.model_copy(update={"scheduling": config.scheduling.model_copy(update={"preemption": False})})
    got = run_server(tmp_path, nodes, jobs, off, failure, monkeypatch)
    assert kinds(expected).get("preempt", 0) > 0 and got != expected


def test_server_and_replay_decide_alike_with_budgets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Budgets (`sim replay --budgets` and the live pool's tenants): two tenants' spend reaches their
    day's budget mid-trace, their new work waits (budget_exhausted) while the third tenant's runs,
    and at midnight a new period lets it start; both runs decide alike throughout."""
    nodes = nodes_from_spec("3x8xH100,2x4xV100M32")
    shift = 86_400.0 - 7_000.0  # the trace crosses the UTC midnight that ends the day's period
    jobs = [replace(j, submit_s=round(j.submit_s + shift, 3)) for j in synthetic_jobs(220, seed=11)]
    failure = NodeFailure(at_s=jobs[90].submit_s + 0.5, node=nodes[0].name, repair_after_s=1800.0)
    budgets = {"vision": Budget(60.0, BudgetPeriod.DAY), "nlp": Budget(110.0, BudgetPeriod.DAY, 0.5)}
    log = check_parity(tmp_path, nodes, jobs, failure, monkeypatch, budgets)
    seen = kinds(log)
    print("budgets", seen)
    admitted = {e[2]: e[0] for e in log if e[1] == "admit"}
    tenant_of = {j.id: j.tenant for j in jobs}
    # the budgets bit: some budgeted work waited past midnight, and no unbudgeted work had to
    late = [w for w, at in admitted.items() if at >= 86_400.0 and tenant_of[w] in budgets
            and next(j.submit_s for j in jobs if j.id == w) < 86_400.0 - 3_000.0]
    assert late, "no budgeted work waited for the new period"
    without = run_replay(nodes, jobs, parse_config(config_text(sorted(set(tenant_of.values())))), failure)
    assert without != log  # the budgets changed the decisions


# ------------------------------------------------------------------ the shared data


def dataset_jobs(trace: Sequence[TraceJob], count: int, tenants: int = 4) -> list[Job]:
    """The first `count` jobs a spec can express (every pod alike), as users would submit them."""
    out: list[Job] = []
    for job in trace:
        w = job.workload
        first = w.pods[0]
        if any(replace(p, name=first.name) != first for p in w.pods) or first.num_devices == 0:
            continue
        if w.total_device_milli > 8000:  # within what a cohort queue may ever hold (else refused)
            continue
        gpus = first.device_milli / 1000 if first.is_fractional else first.num_devices
        resources: dict[str, Any] = {"gpus": gpus, "cpu": f"{first.cpu_milli}m",
                                     "memory": f"{first.memory_mib}MiB"}
        if first.device_memory_mib:
            resources["gpu_memory"] = f"{first.device_memory_mib}MiB"
        spec = {"command": ["train"], "resources": resources, "replicas": len(w.pods),
                "priority_class": w.priority_class, "name": w.name[:63]}
        tenant = f"t{len(out) % tenants}"
        out.append(Job(f"d{len(out):04d}", tenant, spec, job.submit_s - trace[0].submit_s,
                       max(1.0, job.duration_s)))
        if len(out) == count:
            break
    return out


def test_server_and_replay_decide_alike_on_philly(tmp_path: Path, shared_data: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.sim.jobs import philly_jobs

    path = next((shared_data / "philly").glob("*.csv"), None)
    if path is None:
        pytest.skip("no Philly csv in the shared data")
    nodes = nodes_from_spec("4x8xV100M32")
    jobs = dataset_jobs(philly_jobs(path, 8, seed=0), 250)
    failure = NodeFailure(at_s=jobs[100].submit_s + 0.5, node=nodes[0].name, repair_after_s=3600.0)
    log = check_parity(tmp_path, nodes, jobs, failure, monkeypatch)
    print("philly", kinds(log))
    assert kinds(log).get("admit", 0) >= 250


def test_server_and_replay_decide_alike_on_openb(tmp_path: Path, shared_data: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.sim.jobs import openb_jobs

    pods = sorted((shared_data / "openb").rglob("*pod*.csv"))
    timed = [p for p in pods if "multigpu" not in p.name]
    if not timed:
        pytest.skip("no OpenB pod csv with creation and deletion times in the shared data")
    nodes = nodes_from_spec("4x8xV100M32")
    jobs = dataset_jobs(openb_jobs(timed[0]), 300)
    failure = NodeFailure(at_s=jobs[150].submit_s + 0.5, node=nodes[0].name, repair_after_s=3600.0)
    log = check_parity(tmp_path, nodes, jobs, failure, monkeypatch)
    print("openb", kinds(log))
    assert kinds(log).get("admit", 0) >= 300
