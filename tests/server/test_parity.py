"""Parity: the server's control loop and `sim replay` run the same scheduling code, and decide alike.

One trace (a synthetic one that always runs; a few hundred Philly and OpenB jobs when the shared
data is there) goes through the replay and through the server's loop (fake provider, a virtual
clock, the store), with the same configuration: drf ordering, preemption, backfill, two tenants
whose queues share a cohort, and one injected node failure, repaired later. Both must make the
same admissions (with the same placements), preemptions, evictions and requeues, in the same order.

The decisions are compared as the core returned them, and then as the server stored them: its side
is read back from the store (events with from, to, reason and message; pod rows with their node and
device slices; the pending workloads' stored reasons and progress and the backfill reservation after
each step) and from the provider (the grace each stop gave), the replay's side is built from what it
applied (`Recorder`), and the two are compared whole (`Stored`, `differences`).

A variant runs on a generated fat tree with the network-aware policy and topology moves (every
job checkpoints): a move is a stop and an admission at once elsewhere, and its requeue event,
grace and new pod rows are compared as the others (`test_topology_moves_on_a_fabric_are_stored_alike`).

Another moves gangs off congested links (fabric.migrate_on_congestion), on an oversubscribed fat
tree where every multi-node gang is a communication-heavy one of the replay's communication model:
the link loads the model samples every minute are given to the server at the same times through its
telemetry route's service, which finds the gangs' bottlenecks itself and hands its sample to the
cycle (`test_moves_off_congested_links_are_stored_alike`). The replay's gangs are not slowed by the
model there (`ReplayConfig.comm_slows`): the server counts a run's progress in wall-clock seconds up
to its last checkpoint (it cannot know how fast a slowed gang went), so with slowed gangs the two
would keep different progress by construction; replaying the model's end times to the fake
provider would move when pods end but not what they kept. Unslowed, both count alike and every
tuple is compared, while the load that decides the moves is still the model's.

The server is driven as the replay drives the core: at each event time (an arrival, a pod's end,
the failure or the repair, a congestion sample) it takes the arrivals and the telemetry, then runs
one step of its loop with a full pass (`capacity_changed`), as the replay runs its cycles on every
pending workload.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import bindparam, false, or_, select, update

from gpupool.api.tenants import TenantCreate, TenantUpdate
from gpupool.api.workloads import WorkloadSpec
from gpupool.config import PoolConfig, parse_config
from gpupool.core.budgets import Budget, BudgetPeriod, period_end
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.model import Fabric
from gpupool.core.fabric.telemetry import PortLoad
from gpupool.core.fabric.write import to_ibnetdiscover
from gpupool.core.model import Device, Node, Reason, Workload
from gpupool.core.scheduling.congestion import CongestionSample
from gpupool.core.scheduling.cycle import Admit, CycleResult, EventKind, Stop
from gpupool.pods import PodLaunch
from gpupool.providers.fake import FakeProvider, nodes_from_spec
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops import applier as applier_module
from gpupool.server.loops import scheduler as scheduler_module
from gpupool.server.loops.applier import DecisionApplier
from gpupool.server.loops.arrivals import Estimates
from gpupool.server.loops.control import ControlLoop
from gpupool.server.orm import Base
from gpupool.server.runtime import Runtime
from gpupool.server.services import fabric_links, tenants, workloads
from gpupool.server.services.fabric import LiveFabric, load_fabric_file, open_live_fabric
from gpupool.server.services.requeue import Lost, lost_text
from gpupool.server.services.specs import to_workload
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings
from gpupool.sim.comm import JobComm, ModelClass, default_comm_model
from gpupool.sim.comm_net import CommSetup
from gpupool.sim.congestion import CongestionRule
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import NodeFailure, Replay, ReplayConfig

ADMIN = Principal("admin", None)
Entry = tuple[Any, ...]
Sample = tuple[float, dict[tuple[str, int, str, int], float], dict[str, float]]
"""A congestion sample at (time, the load set on each fabric link, each gang's bottleneck load)."""
_W, _E, _P = (Base.metadata.tables[name] for name in ("workloads", "events", "pods"))


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
    for move in result.moved:
        yield (round(now, 6), "move", move.workload_id, move.gang_id, move.reason.value, placed(move))
    for admission in result.admitted:
        where = tuple(sorted((p.pod, p.node, tuple((s.device_index, s.compute_milli, s.memory_mib)
                                                    for s in p.slices)) for p in admission.placements))
        yield (round(now, 6), "admit", admission.workload_id, where)
    for rejection in result.rejected:
        if rejection.final:
            yield (round(now, 6), "reject", rejection.workload_id, rejection.reason.value)


# ------------------------------------------------------------------ what the store holds


@dataclass
class Stored:
    """What a run left in the store: the server's read back from it after (and, for what the store
    keeps only as the latest value, at each event time of) the run; the replay's built from what it
    applied, as the server should have written it. Compared whole (`differences`)."""

    events: dict[str, list[Entry]] = field(default_factory=dict)
    """Per workload, its transitions in order: (at, from, to, reason, message)."""
    pods: dict[str, list[Entry]] = field(default_factory=dict)
    """Per workload, per admission in order: its pods' (name, node, ((device, compute_milli,
    memory_mib), ...)), sorted by name."""
    grace: dict[str, list[Entry]] = field(default_factory=dict)
    """Per workload, per stop: (attempt, grace_s) its pods were stopped with."""
    waiting: dict[float, dict[str, Entry]] = field(default_factory=dict)
    """At each event time after which work waits: per pending workload its stored reason, message
    and progress_s (the work it resumes from) -- the row keeps only the latest, so it is read then."""
    reserved: dict[float, Entry] = field(default_factory=dict)
    """At each event time after which a head holds a backfill reservation: (workload, start_s)."""


@dataclass
class Run:
    log: list[Entry]
    """The core's decisions, as the run's cycles returned them (`log_of`)."""
    stored: Stored
    telemetry: list[Sample] = field(default_factory=list)
    """The replay's: its congestion samples, as telemetry for the server. The server's: what its
    telemetry route answered to each (`congested`)."""


def differences(expected: Stored, got: Stored, most: int = 4) -> list[str]:
    """Where the server's store differs from what the replay applied: per aspect and key, the first
    differing entry (at most `most` lines per aspect)."""
    out: list[str] = []
    for aspect in ("events", "pods", "grace", "waiting", "reserved"):
        want, have = getattr(expected, aspect), getattr(got, aspect)
        shown = len(out)
        for key in sorted(set(want) | set(have), key=str):
            a, b = want.get(key), have.get(key)
            if a == b:
                continue
            if isinstance(a, list) and isinstance(b, list):
                n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                         min(len(a), len(b)))
                a, b = a[n] if n < len(a) else "(none)", b[n] if n < len(b) else "(none)"
                out.append(f"{aspect} of {key}, #{n}: replay {a}, server {b}")
            elif isinstance(a, dict) and isinstance(b, dict):
                ids = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                out.append(f"{aspect} at {key}: " + "; ".join(
                    f"{i}: replay {a.get(i)}, server {b.get(i)}" for i in ids[:3]))
            else:
                out.append(f"{aspect} at {key}: replay {a}, server {b}")
            if len(out) - shown >= most:
                break
    return out


def placed(admission: Any) -> Entry:
    return tuple(sorted((p.pod, p.node, tuple((s.device_index, s.compute_milli, s.memory_mib)
                                              for s in p.slices)) for p in admission.placements))


# ------------------------------------------------------------------ the replay


class Recorder(Replay):
    """The replay, noting what it applies in the shape of the store (`Stored`)."""

    def __init__(self, config: ReplayConfig, grace_of: Callable[[str], float],
                 cancels: frozenset[str] = frozenset()) -> None:
        super().__init__(config)
        self.grace_of = grace_of
        self.cancels = set(cancels)
        """Workloads a user cancels while the cycle that admits them (the first time) runs: the
        cancel wins, the admission is dropped, and the capacity it took is free again."""
        self.log: list[Entry] = []
        self.stored = Stored()
        self._row: dict[str, tuple[str, str]] = {}
        """Each workload's reason and message as the server's row should hold them."""
        self._said: dict[str, str] = {}
        """The wait reason last stored (the server writes a wait's message when its reason changes)."""
        self._lost: dict[str, Lost] = {}
        self._attempts: dict[str, int] = {}
        self._reservation: Any = None
        self._stopping: set[tuple[str, int]] = set()
        """(node, device) of the pods stopped at this event time: the server's rows hold them
        `stopping` until the step's end, and work placed on them waits (`waiting` pods)."""
        self._waiting: set[str] = set()
        """Admitted at this event time onto such a device: launched at the step's end."""
        self.samples: list[Sample] = []

    def _congestion_sample(self, now_s: float) -> None:
        """A sample of the communication model's link loads: noted as the telemetry the server is
        given (every link whose load the scheduler's view is set, cleared ones at 0, as the
        replay's `CongestionWatch` sets them) and the bottleneck loads the cycle judges."""
        assert self.congestion is not None and self.comm is not None
        pools, reported = self.comm.pool_utilisation(), set(self.congestion.reported)
        super()._congestion_sample(now_s)
        links = {key: min(1.0, pools.get(pool, 0.0))
                 for pool in sorted(set(pools) | reported) for key in self.comm.pool_links(pool)}
        judged = self.view.congestion_sample
        self.samples.append((now_s, links, dict(judged.loads) if judged is not None else {}))

    def _event(self, wid: str, now_s: float, *entry: str) -> None:
        self.stored.events.setdefault(wid, []).append((round(now_s, 6), *entry))

    def _arrive(self, job: TraceJob, now_s: float) -> None:
        super()._arrive(job, now_s)
        self._row[job.workload.id] = ("submitted", "Submitted.")
        self._event(job.workload.id, now_s, "", "pending", "submitted", "Submitted.")

    def _finish(self, wid: str, now_s: float) -> None:
        super()._finish(wid, now_s)
        self._event(wid, now_s, "running", "succeeded", "completed", "Every pod exited 0.")

    def _halt(self, job: Any, now_s: float) -> tuple[float, bool]:
        """A stop or a move: the work it loses, as the server accounts a stop (`Lost`)."""
        started, kept = job.run_start_s, job.kept_s
        lost, tracked = super()._halt(job, now_s)
        ran = now_s - started if started is not None else 0.0
        lost_device_s = lost * job.job.workload.total_device_milli / 1000
        self._lost[job.job.workload.id] = Lost(ran, job.kept_s - kept, lost_device_s)
        return lost, tracked

    def _batch(self, now_s: float, events: Sequence[Any]) -> None:
        self._reservation = None
        self._stopping.clear()
        super()._batch(now_s, events)
        for wid in sorted(self._waiting):  # the stopped pods ended: the waiting ones start
            self._event(wid, now_s, "admitted", "running", "launched", "Started.")
        self._waiting.clear()
        at = round(now_s, 6)
        waiting = {wid: (*self._row[wid], round(job.kept_s, 6)) for wid, job in self.pending.items()}
        if waiting:
            self.stored.waiting[at] = waiting
        reserved = self._reservation
        if reserved is not None and reserved.workload_id in self.pending:
            self.stored.reserved[at] = (reserved.workload_id, round(reserved.start_s, 1))

    def _apply(self, result: CycleResult, now_s: float) -> None:
        self.log.extend(log_of(result, now_s))
        self._lost.clear()
        super()._apply(result, now_s)
        # as the server writes a cycle's decisions: every stop (a move's too) in order, then every
        # admission (a move's admission at its new placement) in order, in one transaction
        for stop in result.stopped:
            wid = stop.workload_id
            message = stop.message + lost_text(self._lost[wid])
            waited = wid in self._waiting  # its pods never reached the provider: none to stop
            was = "admitted" if waited else "running"
            self._event(wid, now_s, was, "pending", stop.reason.value, message)
            self._row[wid] = (stop.reason.value, message)
            if waited:
                self._waiting.discard(wid)
                continue
            pods = self.stored.pods[wid][-1]
            self._stopping.update((node, d) for _, node, slices in pods for d, *_ in slices)
            ungraced = stop.kind is EventKind.EVICT or not stop.grace
            grace = 0.0 if ungraced else self.grace_of(self.jobs[wid].job.workload.priority_class)
            self.stored.grace.setdefault(wid, []).append((self._attempts[wid], grace))
        admitted = [d for d in result.decisions
                    if type(d) is Admit or (type(d) is Stop and d.kind is EventKind.MOVE)]
        for admission in admitted:
            wid = admission.workload_id
            if wid in self.cancels:
                self.cancels.discard(wid)
                job = self.jobs[wid]
                if job.token is not None:
                    self.loop.cancel(job.token)
                    job.token = None
                self.view.remove(wid)
                self._event(wid, now_s, "pending", "cancelled", "cancelled_by_user", "Cancelled by the user.")
                continue
            where = ", ".join(sorted({p.node for p in admission.placements}))
            wait = any((p.node, s.device_index) in self._stopping
                       for p in admission.placements for s in p.slices)
            self._event(wid, now_s, "pending", "admitted", "admitted",
                        f"Placed on {where}" + (applier_module._WAITS if wait else "."))
            if wait:
                self._waiting.add(wid)
            else:
                self._event(wid, now_s, "admitted", "running", "launched", "Started.")
            self.stored.pods.setdefault(wid, []).append(placed(admission))
            self._attempts[wid] = self._attempts.get(wid, 0) + 1
            self._said.pop(wid, None)
        for rejection in result.rejected:
            wid, reason = rejection.workload_id, rejection.reason.value
            if rejection.final:
                self._event(wid, now_s, "pending", "failed", reason, rejection.message)
            elif self._said.get(wid) != reason:
                self._said[wid] = reason
                self._row[wid] = (reason, rejection.message)
        self._reservation = result.reservation


def run_replay(nodes: Sequence[Node], jobs: Sequence[Job], config: PoolConfig,
               failure: NodeFailure, budgets: Mapping[str, Budget] | None = None,
               cancels: frozenset[str] = frozenset(), fabric: Path | None = None,
               congestion: CongestionRule | None = None) -> Run:
    """The replay of `jobs`; with `congestion` (and `fabric`), every multi-node gang is a
    communication-heavy one of the model (`congestion_setup`), sampled every `sample_s`."""
    trace = [TraceJob(core_workload(job), job.submit_s, job.duration_s) for job in jobs]
    prices = config.prices.price_book() if budgets else None
    tree = load_fabric_file(fabric) if fabric else None
    comm = congestion_setup(tree, trace) if congestion is not None and tree is not None else None
    replay = Recorder(ReplayConfig(nodes=tuple(nodes), jobs=tuple(trace), policies=config.policies(), seed=7,
                                   failures=(failure,), prices=prices, budgets=budgets or {},
                                   fabric=tree, comm=comm, congestion=congestion, comm_slows=False),
                      config.grace_s, cancels)
    replay.run()
    return Run(replay.log, replay.stored, replay.samples)


def core_workload(job: Job) -> Workload:
    """The Workload the server builds from the job's spec (the same function the API uses)."""
    return to_workload(job.id, WorkloadSpec.model_validate(job.spec), job.tenant, 0, job.submit_s)


# ------------------------------------------------------------------ the server


class ResumingFake(FakeProvider):
    """The fake provider, whose pods resume from their workload's checkpoints as the replay's jobs
    do: a pod runs its duration less the work its workload's earlier attempts kept (the fake's own
    checkpoint marks: the truth, not what the server stored)."""

    def launch(self, pod: PodLaunch) -> None:
        if pod.pod_id not in self._pods and "GPUPOOL_FAKE_CHECKPOINT_S" in pod.env:
            kept: dict[str, float] = {}
            for fake in self._checkpointing.get(pod.workload_id, ()):
                mark, every = self._last_checkpoint_s(fake), fake.checkpoint_every_s
                if mark is not None and every is not None:
                    attempt = fake.launch.pod_id.rsplit("-", 2)[1]  # <workload>-a<attempt>-r<rank>
                    done = mark - (fake.started_at_s + self.startup_s)
                    kept[attempt] = max(kept.get(attempt, 0.0), round(done / every) * every)
            duration = float(pod.env["GPUPOOL_FAKE_DURATION_S"]) - sum(kept.values())
            pod = replace(pod, env=dict(pod.env, GPUPOOL_FAKE_DURATION_S=repr(duration)))
        super().launch(pod)


class ServerRun:
    """The server's control loop on a fake provider and a virtual clock."""

    def __init__(self, tmp_path: Path, nodes: Sequence[Node], config: PoolConfig,
                 url: str | None = None, store_audit_s: float = 60.0, fabric: Path | None = None) -> None:
        self.now = 0.0
        self.provider = ResumingFake(list(nodes), clock=lambda: self.now)
        url = url or f"sqlite:///{tmp_path / 'parity.sqlite'}"
        settings = Settings(data_dir=tmp_path, database_url=url, seed=7, store_audit_interval_s=store_audit_s)
        self.rt = Runtime(settings=settings, store=Store.open(url), provider=self.provider,
                          clock=lambda: self.now, config=config)
        if fabric is not None:  # `gpupool up --fabric FILE`
            self.rt.fabric = open_live_fabric(fabric, self.rt.nodes())
        bootstrap(self.rt)
        self.loop = ControlLoop(self.rt)
        self.loop.recovered = self.loop.reconciler.recover()
        self.log: list[Entry] = []
        self.stored = Stored()
        self.full_passes = True
        """Whether every step is a full pass (as the replay's cycles); else the loop decides, and a
        step with only arrivals runs a cycle on them alone (ARRIVALS_PER_CYCLE, FULL_RESCAN_S)."""
        self.telemetry: list[Sample] = []
        """The replay's congestion samples, still to be given (at their times, before that step)."""
        self.answered: list[Sample] = []
        """What the telemetry route's service answered to each: (time, {}, {congested gang: 1})."""
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
        discard = keeper.discard
        carried = [0]

        def discarded() -> None:  # a cycle whose decisions were not carried out: not in the log
            del self.log[carried[0]:]
            discard()

        def logged_kept(*args: Any, **options: Any) -> CycleResult:
            carried[0] = len(self.log)
            return logged(*args, **options)

        keeper.cycle = logged_kept  # type: ignore[method-assign, assignment]
        keeper.discard = discarded  # type: ignore[method-assign]

    def next_end(self) -> float | None:
        """When the next running fake pod ends on its own (a pod not stopped is final exactly from
        its natural end on: `FakeProvider._status`, whose statuses cost a copy each)."""
        startup, now = self.provider.startup_s, self.now
        ends = [end for p in self.provider._pods.values() if p.stop_at_s is None
                for end in (p.started_at_s + startup + p.duration_s,) if end > now]
        return min(ends, default=None)

    def run(self, jobs: Sequence[Job], failure: NodeFailure) -> list[Entry]:
        arrivals = sorted(jobs, key=lambda j: (j.submit_s, j.id))
        faults = [(failure.at_s, "fail"), (failure.at_s + failure.repair_after_s, "heal")]
        i = 0
        while True:
            times = [t for t in (arrivals[i].submit_s if i < len(arrivals) else None, self.next_end(),
                                 faults[0][0] if faults else None, self.period_end_s,
                                 self.telemetry[0][0] if self.telemetry else None) if t is not None]
            if not times:
                self.read_store()
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
            while self.telemetry and self.telemetry[0][0] == self.now:
                self.send_telemetry(self.telemetry.pop(0)[1])
            if self.full_passes:
                self.rt.capacity_changed.set()  # a full pass, as the replay's cycles
            self.loop.step()
            # pods that waited for a preempted pod to leave start now: the fake provider stops at once
            self.loop.reconciler.sync()
            self.loop.scheduler.promote_waiting()
            self.loop.scheduler.record_launches()  # their launches' outcomes, as the loop's step records
            self.observe()

    def send_telemetry(self, links: Mapping[tuple[str, int, str, int], float]) -> None:
        """The samples' link loads, as `POST /api/v1/fabric/telemetry` hands them on (its service:
        each cable's load from one of its ends' ports); the server reads its running gangs' routes
        from the store, finds their bottlenecks and hands the sample to its next cycle itself."""
        ports = {(a, port): PortLoad(a, port, 0.0, 0.0, load) for (a, port, _, _), load in links.items()}
        change = fabric_links.telemetry(self.rt, ADMIN, ports)
        self.answered.append((self.now, {}, dict.fromkeys(change.effects.congested, 1.0)))

    def observe(self) -> None:
        """What the store holds only as its latest value, read afresh after each step: the pending
        workloads' reasons, messages and progress, and the backfill reservation."""
        at = round(self.now, 6)
        with self.rt.store.read() as session:
            rows = session.connection().execute(
                select(_W.c.id, _W.c.status, _W.c.reason, _W.c.message, _W.c.progress_s,
                       _W.c.reserved_start_s)
                .where(or_(_W.c.status == "pending", _W.c.reserved_start_s.is_not(None)))).all()
        waiting = {r.id: (r.reason, r.message, round(r.progress_s, 6)) for r in rows if r.status == "pending"}
        if waiting:
            self.stored.waiting[at] = waiting
        reserved = [(r.id, r.reserved_start_s) for r in rows if r.reserved_start_s is not None]
        if reserved:
            assert len(reserved) == 1, reserved  # one head holds the reservation
            self.stored.reserved[at] = reserved[0]

    def read_store(self) -> None:
        """The events and pod rows, read from the store after the run; the grace each stopped pod
        was given, from the provider (the store keeps none: what the server told the provider is
        what can be seen of it)."""
        stored = self.stored
        with self.rt.store.read() as session:
            conn = session.connection()
            for e in conn.execute(select(_E).order_by(_E.c.id)):
                stored.events.setdefault(e.workload_id, []).append(
                    (round(e.at_s, 6), e.from_status, e.to_status, e.reason, e.message))
            attempts: dict[tuple[str, int], list[Entry]] = {}
            for pod in conn.execute(select(_P).order_by(_P.c.workload_id, _P.c.attempt, _P.c.name)):
                attempts.setdefault((pod.workload_id, pod.attempt), []).append((pod.name, pod.node, tuple(
                    (s["device_index"], s["compute_milli"], s["memory_mib"]) for s in pod.slices)))
        for (wid, _), pods in sorted(attempts.items()):
            stored.pods.setdefault(wid, []).append(tuple(pods))
        stops: set[tuple[str, int, float]] = set()
        for fake in self.provider._pods.values():
            if fake.stop_at_s is not None:
                wid, attempt, _ = fake.launch.pod_id.rsplit("-", 2)
                stops.add((wid, int(attempt.removeprefix("a")), fake.grace_s))
        for wid, attempt, grace in sorted(stops):
            stored.grace.setdefault(wid, []).append((attempt, grace))

    def submit(self, job: Job) -> None:
        env = {"GPUPOOL_FAKE_DURATION_S": repr(job.duration_s)}
        if job.spec.get("checkpoint_interval_s"):  # the fake pod checkpoints as the replay's job does
            env["GPUPOOL_FAKE_CHECKPOINT_S"] = repr(job.spec["checkpoint_interval_s"])
        spec = dict(job.spec, tenant=job.tenant, env=env)
        assert workloads.submit(self.rt, ADMIN, WorkloadSpec.model_validate(spec)).id == job.id

    def close(self) -> None:
        self.rt.store.close()


def run_server(tmp_path: Path, nodes: Sequence[Node], jobs: Sequence[Job], config: PoolConfig,
               failure: NodeFailure, monkeypatch: pytest.MonkeyPatch,
               budgets: Mapping[str, Budget] | None = None, audit: bool = True,
               full_passes: bool = True, url: str | None = None,
               cancels: frozenset[str] = frozenset(), fabric: Path | None = None,
               telemetry: Sequence[Sample] = ()) -> Run:
    order = iter(sorted(jobs, key=lambda j: (j.submit_s, j.id)))
    monkeypatch.setattr(workloads, "new_workload_id", lambda: next(order).id)
    # without the audits (the mutation controls): the store audit would find the injected bug's
    # rows first and rebuild from them, and this is to show the comparison alone sees it
    server = ServerRun(tmp_path, nodes, config, url, store_audit_s=60.0 if audit else 0.0, fabric=fabric)
    if cancels:
        race_cancels(server.rt, set(cancels), monkeypatch)
    server.full_passes = full_passes
    server.telemetry = list(telemetry)
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
        if audit:
            assert server.loop.scheduler.keeper.drifts == 0
        return Run(log, server.stored, server.answered)
    finally:
        server.close()


def race_cancels(rt: Runtime, cancels: set[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's cancel of each of `cancels`, committed by another thread (another connection) inside
    the transaction that admits it the first time: after the scheduler read it pending, before its
    compare-and-set to admitted. (PostgreSQL only: SQLite's write transaction excludes the cancel.)"""
    apply = applier_module.apply_moves

    def racing(conn: Any, moves: Sequence[Any]) -> Any:
        raced = {m.workload_id for m in moves if m.to_status == "admitted" and m.workload_id in cancels}
        for wid in sorted(raced):
            cancels.discard(wid)
            failed: list[BaseException] = []
            user = threading.Thread(target=cancel, args=(wid, failed))
            user.start()
            user.join(timeout=30)
            assert not user.is_alive() and not failed, failed
        lost = apply(conn, moves)
        assert raced <= {m.workload_id for m in lost}, "a cancel did not win its race"
        return lost

    def cancel(wid: str, failed: list[BaseException]) -> None:
        try:
            workloads.cancel(rt, ADMIN, wid)
        except BaseException as exc:  # told to the test by the thread that waits for it
            failed.append(exc)

    monkeypatch.setattr(applier_module, "apply_moves", racing)


def check_parity(tmp_path: Path, nodes: Sequence[Node], jobs: Sequence[Job], failure: NodeFailure,
                 monkeypatch: pytest.MonkeyPatch, budgets: Mapping[str, Budget] | None = None) -> Run:
    names = sorted({j.tenant for j in jobs})
    config = parse_config(config_text(names))
    expected = run_replay(nodes, jobs, config, failure, budgets)
    got = run_server(tmp_path, nodes, jobs, config, failure, monkeypatch, budgets)
    assert_same(expected, got)
    return expected


def assert_same(expected: Run, got: Run) -> None:
    """The same decisions, and the same store: what the server wrote is what the replay applied."""
    for n, (want, have) in enumerate(zip(expected.log, got.log, strict=False)):
        assert have == want, f"decision {n} differs: replay {want}, server {have}"
    assert len(got.log) == len(expected.log)
    diff = differences(expected.stored, got.stored)
    assert not diff, "the store differs from what the replay applied:\n" + "\n".join(diff)


def kinds(log: Sequence[Entry]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in log:
        counts[entry[1]] = counts.get(entry[1], 0) + 1
    return counts


# ------------------------------------------------------------------ traces


def synthetic_jobs(count: int, seed: int, checkpointing: float = 0.5) -> list[Job]:
    """Fractions, whole devices and gangs from three tenants, in three priority classes; arrivals
    in bursts so that queues form, preemption and backfill have work to do. A share
    (`checkpointing`) of the jobs checkpoint, so that a stopped job resumes with progress."""
    rng = random.Random(seed)
    saves = random.Random(seed + 1)  # its own draws: the rest of the trace is as without checkpoints
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
        if saves.random() < checkpointing:
            spec["checkpoint_interval_s"] = saves.choice([120.0, 300.0, 600.0])
            # the user's estimate: backfill then counts the progress a resumed job keeps
            spec["runtime_estimate_s"] = round(duration * saves.uniform(0.8, 1.5), 3)
        jobs.append(Job(f"s{n:04d}", rng.choice(["vision", "nlp", "speech"]), spec, round(now, 3), duration))
    return jobs


def test_server_and_replay_decide_alike_on_a_synthetic_trace(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = nodes_from_spec("3x8xH100,2x4xV100M32")
    jobs = synthetic_jobs(300, seed=3)
    failure = NodeFailure(at_s=jobs[120].submit_s + 0.5, node=nodes[0].name, repair_after_s=1800.0)
    run = check_parity(tmp_path, nodes, jobs, failure, monkeypatch)
    log, stored = run.log, run.stored
    seen = kinds(log)
    print("synthetic", seen)
    # the trace exercises what it is meant to: every kind of decision happens
    assert seen.get("admit", 0) >= 300 and seen.get("preempt", 0) > 0 and seen.get("evict", 0) > 0, seen
    assert seen["requeue"] == seen["preempt"] + seen["evict"]
    waits = [v for w in stored.waiting.values() for v in w.values()]
    assert stored.reserved and any(progress > 0 for *_, progress in waits), "no reservation or no resume"


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
    assert kinds(expected.log).get("preempt", 0) > 0 and got.log != expected.log


def test_server_and_replay_decide_alike_with_budgets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Budgets (`sim replay --budgets` and the live pool's tenants): two tenants' spend reaches their
    day's budget mid-trace, their new work waits (budget_exhausted) while the third tenant's runs,
    and at midnight a new period lets it start; both runs decide alike throughout."""
    nodes = nodes_from_spec("3x8xH100,2x4xV100M32")
    shift = 86_400.0 - 7_000.0  # the trace crosses the UTC midnight that ends the day's period
    jobs = [replace(j, submit_s=round(j.submit_s + shift, 3)) for j in synthetic_jobs(220, seed=11)]
    failure = NodeFailure(at_s=jobs[90].submit_s + 0.5, node=nodes[0].name, repair_after_s=1800.0)
    budgets = {"vision": Budget(60.0, BudgetPeriod.DAY), "nlp": Budget(110.0, BudgetPeriod.DAY, 0.5)}
    log = check_parity(tmp_path, nodes, jobs, failure, monkeypatch, budgets).log
    seen = kinds(log)
    print("budgets", seen)
    admitted = {e[2]: e[0] for e in log if e[1] == "admit"}
    tenant_of = {j.id: j.tenant for j in jobs}
    # the budgets bit: some budgeted work waited past midnight, and no unbudgeted work had to
    late = [w for w, at in admitted.items() if at >= 86_400.0 and tenant_of[w] in budgets
            and next(j.submit_s for j in jobs if j.id == w) < 86_400.0 - 3_000.0]
    assert late, "no budgeted work waited for the new period"
    without = run_replay(nodes, jobs, parse_config(config_text(sorted(set(tenant_of.values())))), failure).log
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
    log = check_parity(tmp_path, nodes, jobs, failure, monkeypatch).log
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
    log = check_parity(tmp_path, nodes, jobs, failure, monkeypatch).log
    print("openb", kinds(log))
    assert kinds(log).get("admit", 0) >= 300


# ------------------------------------------------------------------ the check sees the store


def _requeue_without_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stop stored as a generic requeue: the message and grace of no preemption or eviction."""
    requeue = DecisionApplier._requeue

    def generic(self: DecisionApplier, session: Any, batch: Any, marks: Any, now: float) -> Any:
        stops = [replace(stop, message="Requeued by the scheduler.", grace=True) for stop in batch.stops]
        return requeue(self, session, replace(batch, stops=stops), marks, now)

    monkeypatch.setattr(DecisionApplier, "_requeue", generic)


def _no_wait_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pending reasons never stored: the statement runs, and matches no row."""
    nowhere = update(_W).where(_W.c.id == bindparam("r_id"), false())
    monkeypatch.setattr(applier_module, "_SET_REASON",
                        nowhere.values(reason=bindparam("r_reason"), message=bindparam("r_message")))


def _no_reservation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backfill reservation never written."""
    monkeypatch.setattr(DecisionApplier, "_write_reservation", lambda self, conn, reserved: None)


def _pod_rows(change: Callable[[dict[str, Any]], None]) -> Callable[[pytest.MonkeyPatch], None]:
    """Pod rows written with `change` made to them (the launches still go where the core placed)."""

    def inject(monkeypatch: pytest.MonkeyPatch) -> None:
        place = DecisionApplier._place_pods

        class Writes:
            def __init__(self, conn: Any) -> None:
                self.conn = conn

            def execute(self, statement: Any, params: Any = None, *args: Any, **kwargs: Any) -> Any:
                if statement is applier_module._INSERT_POD:
                    params = [dict(p) for p in params]
                    for pod in params:
                        change(pod)
                return self.conn.execute(statement, params, *args, **kwargs)

            def __getattr__(self, name: str) -> Any:
                return getattr(self.conn, name)

        def wrong(self: DecisionApplier, conn: Any, *args: Any) -> Any:
            return place(self, Writes(conn), *args)

        monkeypatch.setattr(DecisionApplier, "_place_pods", wrong)

    return inject


def _other_node(pod: dict[str, Any]) -> None:
    pod["node"] = MUTATION_NODES[1].name if pod["node"] == MUTATION_NODES[0].name else MUTATION_NODES[0].name


def _other_device(pod: dict[str, Any]) -> None:
    pod["slices"] = [dict(s, device_index=(s["device_index"] + 1) % 8) for s in pod["slices"]]


def _progress_untold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requeued work's progress (its checkpoints) never told to the core (stored all the same)."""
    told = Estimates.requeued

    def untold(self: Estimates, row: Any, moved_s: float | None, *, migrated: bool = False) -> None:
        told(self, row, moved_s, migrated=migrated)
        self.info[row.id] = replace(self.info[row.id], progress_s=0.0)

    monkeypatch.setattr(Estimates, "requeued", untold)


MUTATION_NODES = nodes_from_spec("2x8xH100")
MUTATIONS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], str]] = {
    "stops stored generic": (_requeue_without_stops, "events"),
    "pending reasons never stored": (_no_wait_reasons, "waiting"),
    "reservation never written": (_no_reservation, "reserved"),
    "pod rows on the wrong node": (_pod_rows(_other_node), "pods"),
    "pod rows on the wrong device": (_pod_rows(_other_device), "pods"),
    "requeue progress untold": (_progress_untold, ""),
}
"""Server bugs that left the decisions-only comparison green, and the aspect of the store that
must show each (any aspect for the last: the core then decides otherwise, so much differs)."""


@dataclass(frozen=True)
class Small:
    jobs: list[Job]
    failure: NodeFailure
    config: PoolConfig
    expected: Run


@pytest.fixture(scope="module")
def small() -> Small:
    """A short trace with every kind of stop, waits and reservations, replayed once. Every job
    checkpoints and gives an estimate, so that the progress a resumed job keeps changes what
    backfill decides (with half of them, as in the longer trace, it happens to change nothing)."""
    jobs = synthetic_jobs(80, seed=5, checkpointing=1.0)
    failure = NodeFailure(at_s=jobs[40].submit_s + 0.5, node=MUTATION_NODES[0].name, repair_after_s=900.0)
    config = parse_config(config_text(sorted({j.tenant for j in jobs})))
    return Small(jobs, failure, config, run_replay(MUTATION_NODES, jobs, config, failure))


def test_the_short_trace_is_stored_alike(small: Small, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a bug the server stores on the short trace what the replay applied (so the
    differences below are the bugs')."""
    assert_same(small.expected, run_server(tmp_path, MUTATION_NODES, small.jobs, small.config, small.failure,
                                           monkeypatch))


def test_the_short_trace_is_stored_alike_on_postgresql(small: Small, postgres: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on PostgreSQL (its row locks, its JSON and float columns)."""
    got = run_server(tmp_path, MUTATION_NODES, small.jobs, small.config, small.failure, monkeypatch,
                     url=postgres.create_database())
    assert_same(small.expected, got)


def test_cancels_racing_admissions_on_postgresql(small: Small, postgres: Any, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Users cancel work while the cycle that admits it runs: each cancel commits between the
    scheduler's read of the row and its move to admitted, wins, and the admission is dropped (no pod
    rows, no launch); the replay cancels the same work as it admits it. Both store alike."""
    cancels = frozenset(j.id for j in small.jobs[3::9])
    expected = run_replay(MUTATION_NODES, small.jobs, small.config, small.failure, cancels=cancels)
    got = run_server(tmp_path, MUTATION_NODES, small.jobs, small.config, small.failure, monkeypatch,
                     url=postgres.create_database(), cancels=cancels)
    cancelled = {w for w, events in got.stored.events.items() if events[-1][2] == "cancelled"}
    assert cancelled == cancels and not cancelled & set(got.stored.pods)
    assert_same(expected, got)


@pytest.mark.parametrize("bug", list(MUTATIONS))
def test_the_store_comparison_sees_a_server_that_stores_wrong(bug: str, small: Small, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    inject, aspect = MUTATIONS[bug]
    stored = small.expected.stored
    # the trace exercises what each bug would spoil
    assert stored.reserved and any(v[2] > 0 for w in stored.waiting.values() for v in w.values())
    assert {g for v in stored.grace.values() for _, g in v} == {0.0, 30.0}  # evictions and preemptions
    inject(monkeypatch)
    got = run_server(tmp_path, MUTATION_NODES, small.jobs, small.config, small.failure, monkeypatch,
                     audit=False)
    diff = differences(stored, got.stored)
    print(bug, "decisions alike:", got.log == small.expected.log, diff[:2])
    assert any(line.startswith(aspect) for line in diff), diff
    with pytest.raises(AssertionError):
        assert_same(small.expected, got)


# ------------------------------------------------------------------ cycles the loop chooses


def _count_arrival_cycles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the cycles that read new arrivals only (not full passes)."""
    counted = [0]
    load = scheduler_module.load

    def counting(*args: Any, **kwargs: Any) -> Any:
        counted[0] += kwargs.get("since_s") is not None
        return load(*args, **kwargs)

    monkeypatch.setattr(scheduler_module, "load", counting)
    return counted


def test_arrivals_only_cycles_store_alike_without_preemption(small: Small, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps are not forced to be full passes: at an instant with only arrivals the loop runs a
    cycle on them alone (plus the reserved head), as it does live. Without preemption what it
    decides and stores is what the replay's full passes decide: the work it sets aside cannot fit
    until something ends, and something ending makes the next cycle a full pass."""
    off = small.config.model_copy(update={"scheduling": small.config.scheduling.model_copy(
        update={"preemption": False})})
    expected = run_replay(MUTATION_NODES, small.jobs, off, small.failure)
    counted = _count_arrival_cycles(monkeypatch)
    got = run_server(tmp_path, MUTATION_NODES, small.jobs, off, small.failure, monkeypatch, full_passes=False)
    assert counted[0] > 10, counted  # arrivals-only cycles ran
    assert expected.stored.reserved and kinds(expected.log).get("evict")
    assert_same(expected, got)


def test_arrivals_only_cycles_store_alike_with_preemption(small: Small, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With preemption, an arrival alone in its cycle might preempt where a full pass leaves it
    waiting behind older work of its queue that was set aside (which may also use up the cycle's
    victim searches): an arrivals-only cycle that preempts is discarded and a full pass decides
    (`Scheduler.cycle`), so what is stored is what the replay's full passes decide."""
    counted = _count_arrival_cycles(monkeypatch)
    got = run_server(tmp_path, MUTATION_NODES, small.jobs, small.config, small.failure, monkeypatch,
                     full_passes=False)
    assert counted[0] > 10, counted  # arrivals-only cycles ran
    assert kinds(small.expected.log).get("preempt")
    assert_same(small.expected, got)


# ------------------------------------------------------------------ a fabric, and topology moves


FABRIC_NODES = [Node(name=f"node{i:05d}", cpu_milli=16_000, memory_mib=131_072,
                     devices=tuple(Device(uuid=f"node{i:05d}-d{d}", model="H100", index=d) for d in range(2)))
                for i in range(1, 9)]
"""8 nodes of 2 devices: the hosts of a generated fat tree of 4 leaves of 2 (`fat_tree(4)`)."""


def fabric_config(tenants: Sequence[str]) -> PoolConfig:
    """The network-aware policy with topology moves: a gang spread over leaves is moved into one
    (and single-node work moved out of its way) at once, costing only the work since its last
    checkpoint (no restart cost: the fake pod resumes at once, as the replay's job does)."""
    text = config_text(tenants).replace(
        "  placement: fgd-strand\n",
        "  placement: network-aware\n  topology_moves: true\n  topology_max_wait: 0s\n"
        "  topology_move_restart: 0s\n  topology_moves_per_workload: 4\n")
    return parse_config(text)


def fabric_jobs(count: int, seed: int) -> list[Job]:
    """Whole-node single jobs and 2- and 3-node gangs of whole nodes, from three tenants, every one
    checkpointing with an estimate (only such work moves), in bursts so that gangs start spread."""
    rng = random.Random(seed)
    shapes = [(1, 1), (2, 1), (2, 1), (2, 2), (2, 2), (2, 3)]
    jobs, now = [], 0.0
    for n in range(count):
        now += rng.expovariate(1 / 200.0)
        gpus, replicas = rng.choice(shapes)
        duration = round(rng.uniform(600, 6000), 3)
        spec: dict[str, Any] = {
            "command": ["train"], "resources": {"gpus": gpus}, "replicas": replicas,
            "priority_class": rng.choice(["normal", "normal", "high"]), "name": f"job{n % 5}",
            "checkpoint_interval_s": rng.choice([120.0, 300.0]),
            "runtime_estimate_s": round(duration * rng.uniform(0.8, 1.5), 3)}
        jobs.append(Job(f"f{n:04d}", rng.choice(["vision", "nlp", "speech"]), spec, round(now, 3), duration))
    return jobs


@dataclass(frozen=True)
class FabricTrace:
    jobs: list[Job]
    failure: NodeFailure
    config: PoolConfig
    topo: Path
    expected: Run


@pytest.fixture(scope="module")
def fabric_trace(tmp_path_factory: pytest.TempPathFactory) -> FabricTrace:
    topo = tmp_path_factory.mktemp("fabric") / "tree.topo"
    topo.write_text(to_ibnetdiscover(fat_tree(4, levels=2)))
    jobs = fabric_jobs(60, seed=11)
    failure = NodeFailure(at_s=jobs[30].submit_s + 0.5, node=FABRIC_NODES[2].name, repair_after_s=900.0)
    config = fabric_config(sorted({j.tenant for j in jobs}))
    expected = run_replay(FABRIC_NODES, jobs, config, failure, fabric=topo)
    return FabricTrace(jobs, failure, config, topo, expected)


def test_topology_moves_on_a_fabric_are_stored_alike(fabric_trace: FabricTrace, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A fat tree, the network-aware policy and topology moves: the cycles move gangs into one leaf
    (and single-node work out of their way); each move is stored as the replay applies it -- its
    requeue event (reason, message, the work lost), the stop's grace, its new attempt's pod rows on
    the new nodes (waiting where a moved pod still stops on the device) and its launch."""
    t = fabric_trace
    seen = kinds(t.expected.log)
    print("fabric", seen)
    assert seen.get("move", 0) >= 2 and seen.get("admit", 0) >= len(t.jobs), seen
    moved = {e[2] for e in t.expected.log if e[1] == "move"}
    assert all(len(t.expected.stored.pods[w]) >= 2 for w in moved)
    gangs = {e[3] for e in t.expected.log if e[1] == "move"}
    assert moved - gangs, "single-node work moved out of a gang's way too"
    when = {(m[2], m[0]) for m in t.expected.log if m[1] == "move"}
    moved_admissions = [e for w in moved for e in t.expected.stored.events[w]
                        if e[3] == "admitted" and (w, e[0]) in when]
    assert any(applier_module._WAITS in e[4] for e in moved_admissions), "a move waits for a stop"
    got = run_server(tmp_path, FABRIC_NODES, t.jobs, t.config, t.failure, monkeypatch, fabric=t.topo)
    assert_same(t.expected, got)


def test_the_store_comparison_sees_a_move_stored_on_the_wrong_node(
        fabric_trace: FabricTrace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that writes a moved workload's new pod rows on another node (its launches still go
    where the core placed them) differs in the pod rows, though every decision is alike."""
    t = fabric_trace
    moved = {e[2] for e in t.expected.log if e[1] == "move"}
    names = [n.name for n in FABRIC_NODES]

    def elsewhere(pod: dict[str, Any]) -> None:
        if pod["workload_id"] in moved and pod["attempt"] > 1:
            pod["node"] = names[(names.index(pod["node"]) + 1) % len(names)]

    _pod_rows(elsewhere)(monkeypatch)
    got = run_server(tmp_path, FABRIC_NODES, t.jobs, t.config, t.failure, monkeypatch, audit=False,
                     fabric=t.topo)
    diff = differences(t.expected.stored, got.stored)
    print("moved pods elsewhere:", got.log == t.expected.log, diff[:2])
    assert any(line.startswith("pods of ") for line in diff), diff
    with pytest.raises(AssertionError):
        assert_same(t.expected, got)


def test_topology_moves_on_a_fabric_are_stored_alike_on_postgresql(
        fabric_trace: FabricTrace, postgres: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on PostgreSQL: a cycle's moves are written in one transaction, its row locks held."""
    t = fabric_trace
    got = run_server(tmp_path, FABRIC_NODES, t.jobs, t.config, t.failure, monkeypatch, fabric=t.topo,
                     url=postgres.create_database())
    assert_same(t.expected, got)


# ------------------------------------------------------------------ moving off congested links


HEAVY = default_comm_model().with_comm_heavy(1.0)
CONGESTED_NODES = [Node(name=f"node{i:05d}", cpu_milli=16_000, memory_mib=131_072, devices=tuple(
                       Device(uuid=f"node{i:05d}-d{d}", model="H100", index=d) for d in range(2)))
                   for i in range(1, 13)]
"""12 nodes of 2 devices: the hosts of a fat tree of 4 leaves of 3, one uplink each (3:1 oversubscribed)."""


def congestion_setup(fabric: Fabric, trace: Sequence[TraceJob]) -> CommSetup:
    """Every multi-node gang a language model's (the model's most communication-bound class); the
    scheduler told no ratio (the live server knows none)."""
    language = JobComm(ModelClass.LANGUAGE, HEAVY.classes[ModelClass.LANGUAGE])
    return CommSetup(fabric, HEAVY, {t.workload.id: language for t in trace if len(t.workload.pods) > 1})


@dataclass(frozen=True)
class CongestedTrace:
    jobs: list[Job]
    failure: NodeFailure
    config: PoolConfig
    topo: Path
    expected: Run


@pytest.fixture(scope="module")
def congested(tmp_path_factory: pytest.TempPathFactory) -> CongestedTrace:
    topo = tmp_path_factory.mktemp("congested") / "tree.topo"
    topo.write_text(to_ibnetdiscover(fat_tree(4, levels=2, oversubscription=3.0)))
    jobs = fabric_jobs(40, seed=11)
    failure = NodeFailure(at_s=jobs[20].submit_s + 0.5, node=CONGESTED_NODES[2].name, repair_after_s=900.0)
    text = config_text(sorted({j.tenant for j in jobs})).replace(
        "  placement: fgd-strand\n", "  placement: network-aware\n  topology_max_wait: 0s\n")
    config = parse_config(text + "fabric: {migrate_on_congestion: true, congestion_threshold: "
                                 f"{CONGESTED_THRESHOLD}, congestion_for: 2m}}\n")
    expected = run_replay(CONGESTED_NODES, jobs, config, failure, fabric=topo,
                          congestion=CongestionRule(sample_s=60.0))
    return CongestedTrace(jobs, failure, config, topo, expected)


def run_congested(t: CongestedTrace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  audit: bool = True) -> Run:
    """The server on the trace, given the replay's samples as telemetry at their times."""
    return run_server(tmp_path, CONGESTED_NODES, t.jobs, t.config, t.failure, monkeypatch, audit=audit,
                      fabric=t.topo, telemetry=t.expected.telemetry)


def test_moves_off_congested_links_are_stored_alike(congested: CongestedTrace, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Gangs whose uplinks stay congested are moved (fabric.migrate_on_congestion): each is stored
    as the replay applies it -- its requeue event (reason congestion_moved, the rule's message, the
    work lost since its checkpoint), the progress it resumes from, its next attempt's pod rows on
    other nodes -- and the server's telemetry route finds the same gangs congested at every sample
    as the replay's communication model. The replay's gangs run at the trace's rate (the module
    docstring says why): with the model's slowdowns the server's run times and progress differ, and
    the very first comparison, the congested gangs per sample, fails."""
    t = congested
    moves = [e for e in t.expected.log if e[1] == "preempt" and e[4] == "congestion_moved"]
    print("congested", kinds(t.expected.log), len(moves), "moves", len(t.expected.telemetry), "samples")
    assert len(moves) >= 2, moves
    for _, _, wid, *_ in moves:
        pods = t.expected.stored.pods[wid]
        assert len(pods) >= 2 and {p[1] for p in pods[-1]} != {p[1] for p in pods[0]}, "placed elsewhere"
    said = [e for at, _, wid, *_ in moves for e in t.expected.stored.events[wid]
            if e[0] == at and e[3] == "congestion_moved"]
    assert len(said) == len(moves) and {e[1:3] for e in said} == {("running", "pending")}
    assert any(e[4].endswith("since its last checkpoint.") for e in said), "one resumes from a checkpoint"
    threshold = t.config.fabric.congestion_threshold
    hot = [(at, sorted(w for w, load in loads.items() if load > threshold))
           for at, _, loads in t.expected.telemetry]
    got = run_congested(t, tmp_path, monkeypatch)
    assert [(at, sorted(c)) for at, _, c in got.telemetry] == hot  # the route's `congested`, each sample
    assert_same(t.expected, got)


def _migration_as_preemption(monkeypatch: pytest.MonkeyPatch) -> None:
    """A move off congestion stored as an ordinary preemption (its reason and message)."""
    requeue = DecisionApplier._requeue

    def preempted(self: DecisionApplier, session: Any, batch: Any, marks: Any, now: float) -> Any:
        stops = [replace(s, reason=Reason.PREEMPTED, message="Preempted by the scheduler.")
                 if s.kind is EventKind.MIGRATE else s for s in batch.stops]
        return requeue(self, session, replace(batch, stops=stops), marks, now)

    monkeypatch.setattr(DecisionApplier, "_requeue", preempted)


def _migration_progress_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A moved gang's checkpoint not counted: it is requeued as if it had kept nothing."""
    requeue = DecisionApplier._requeue

    def dropped(self: DecisionApplier, session: Any, batch: Any, marks: Any, now: float) -> Any:
        moved = {s.workload_id for s in batch.stops if s.kind is EventKind.MIGRATE}
        return requeue(self, session, batch, {w: None if w in moved else m for w, m in marks.items()}, now)

    monkeypatch.setattr(DecisionApplier, "_requeue", dropped)


def _congested_sample_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """A telemetry sample in which some gang is congested never reaches the cycle."""
    hand = LiveFabric.hand_congestion_sample

    def ignoring(self: LiveFabric, sample: CongestionSample) -> None:
        if max(sample.loads.values(), default=0.0) <= CONGESTED_THRESHOLD:
            hand(self, sample)

    monkeypatch.setattr(LiveFabric, "hand_congestion_sample", ignoring)


CONGESTED_THRESHOLD = 0.45
CONGESTION_MUTATIONS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], str]] = {
    "a move stored as a preemption": (_migration_as_preemption, "events"),
    "a move's progress dropped": (_migration_progress_dropped, "waiting"),
    "a congested sample ignored": (_congested_sample_ignored, "events"),
}
"""Server bugs in moving off congestion, and the aspect of the store that must show each."""


@pytest.mark.parametrize("bug", list(CONGESTION_MUTATIONS))
def test_the_store_comparison_sees_a_move_off_congestion_stored_wrong(
        bug: str, congested: CongestedTrace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inject, aspect = CONGESTION_MUTATIONS[bug]
    inject(monkeypatch)
    got = run_congested(congested, tmp_path, monkeypatch, audit=False)
    diff = differences(congested.expected.stored, got.stored)
    print(bug, "decisions alike:", got.log == congested.expected.log, diff[:2])
    assert any(line.startswith(aspect) for line in diff), diff
    with pytest.raises(AssertionError):
        assert_same(congested.expected, got)
