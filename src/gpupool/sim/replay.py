"""The replay protocol: jobs arrive at trace times and run for their duration, one cycle per event.

Each batch of simultaneous events (arrivals, completions, node failures and repairs) is applied
and then one full admission + placement cycle runs (`core.scheduling.cycle.cycle_on`) on a view
kept alive across events. A job runs `duration_s` of work; on an oversubscribed device it
progresses at 1/slowdown (core/overcommit.py), so its completion moves when neighbours come and
go. A preempted or evicted job is requeued whole and resumes from its last checkpoint; the work
after that checkpoint is lost and accounted.

With a communication model the scheduler is told each job's estimated communication ratio
(`CommSetup.estimate_ratio`: exact, noisy or none, as the setup drew it), never its class. The
time a job waits for locality (from each cycle in which wait-or-spread held it back to the next
cycle, until its first start) is accounted per job: the part of its queueing delay spent waiting
for a domain. A held gang also wakes the replay when its `max_locality_wait_s` runs out, so it
spreads then as the live loop's next cycle would let it, not at whatever event comes next.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpupool.core.budgets import Budget
from gpupool.core.fabric.model import Fabric
from gpupool.core.metering import PriceBook
from gpupool.core.model import Node, Reason, Workload, WorkloadInfo
from gpupool.core.overcommit import device_slowdown
from gpupool.core.scheduling.backfill import RuntimeEstimator
from gpupool.core.scheduling.congestion import CongestionSample
from gpupool.core.scheduling.cycle import (
    Admit,
    CycleResult,
    EventKind,
    Policies,
    Refuse,
    Reserve,
    Stop,
    Wait,
    cycle_on,
    unhandled,
)
from gpupool.core.scheduling.ordering.base import make_ordering
from gpupool.core.scheduling.pending import PendingQueue
from gpupool.core.scheduling.preemption import checkpoint_split
from gpupool.core.scheduling.topology import FabricView
from gpupool.core.scheduling.view import ClusterView
from gpupool.sim.budgets import BudgetWatch
from gpupool.sim.comm_net import CommSetup, CommTracker, LinkFailure
from gpupool.sim.congestion import CongestionRule, CongestionWatch
from gpupool.sim.cost import CostMeter
from gpupool.sim.engine import EventLoop
from gpupool.sim.jobs import TraceJob
from gpupool.sim.metrics import ReplayMetrics

MAX_CYCLES_PER_EVENT = 3
"""Cycles run at one event time while each one stops (preempts or evicts) something."""
FREEING = frozenset({"finish", "repair", "link_repair"})
"""Events after which a spread gang may move into a leaf (`Policies.moves`) with nothing pending."""


@dataclass(frozen=True, slots=True)
class NodeFailure:
    """A node breaks at `at_s` (its work is evicted) and is repaired `repair_after_s` later."""

    at_s: float
    node: str
    repair_after_s: float = math.inf


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    nodes: tuple[Node, ...]
    jobs: tuple[TraceJob, ...]
    policies: Policies
    seed: int = 0
    failures: tuple[NodeFailure, ...] = ()
    check_invariants: bool = False
    timeline_points: int = 400
    prices: PriceBook | None = None
    """With a price book, the result has `cost`: per tenant, pooled vs exclusive (sim/cost.py)."""
    budgets: Mapping[str, Budget] = field(default_factory=dict)
    """Tenants' budgets (with a price book): their work waits once spent; the result has `budgets`."""
    comm: CommSetup | None = None
    """The communication model (sim/comm.py): multi-node gangs progress at their network-bound rate."""
    link_failures: tuple[LinkFailure, ...] = ()
    """Fabric links that fail (and come back) during the replay; seen by the truth and the scheduler."""
    fabric: Fabric | None = None
    """The fabric the scheduler places by (`--fabric`): the nodes are mapped onto its hosts
    (`core.scheduling.topology.map_hosts`); None: the communication model's, else none."""
    congestion: CongestionRule | None = None
    """With `comm`: link load sampled from the truth into the scheduler's view every `sample_s`
    while gangs run, and with `policies.migrate` each sample handed to the cycle, which moves gangs
    off congested links (sim/congestion.py); the result gains congestion_samples, congestion_moves,
    congestion_lost_gpu_h, congestion_same_nodes."""
    comm_slows: bool = True
    """With `comm`: multi-node gangs progress at their network-bound rate. False: at the trace's
    rate, the model then only measuring link load (telemetry, congestion) -- what a comparison with
    the live server needs, whose pods run as long as their provider says and whose progress counts
    the wall-clock seconds up to a checkpoint (tests/server/test_parity.py); the report's comm
    lost_gpu_hours is then what the slowdowns would have cost."""


@dataclass(slots=True)
class _Job:
    job: TraceJob
    remaining_s: float
    rate: float = 1.0
    run_start_s: float | None = None
    run_done_s: float = 0.0
    last_update_s: float = 0.0
    kept_s: float = 0.0
    first_start_s: float | None = None
    token: int | None = None
    estimate_s: float | None = None
    attained_device_s: float = 0.0
    devices: list[tuple[int, int]] = field(default_factory=list)
    locality_wait_s: float = 0.0
    """Time held back by wait-or-spread before its first start."""
    held_since_s: float | None = None
    """The last cycle that held it back for locality (None: the last one did not)."""


class Replay:
    """One replay run; `run()` returns the metrics as a JSON-ready dict."""

    def __init__(self, config: ReplayConfig) -> None:
        self.config = config
        self.policies = config.policies
        self.view = ClusterView.empty(config.nodes, self.policies.quota, self.policies.priority_classes)
        self.loop = EventLoop()
        self.rng = random.Random(config.seed)
        self.estimator = RuntimeEstimator()
        self.jobs: dict[str, _Job] = {}
        self.pending: dict[str, _Job] = {}
        self.pending_workloads = PendingQueue()
        """The workloads of `pending`, in arrival order: the cycle's pending book reads its log of
        what joined and left instead of comparing the whole list with the last one."""
        self.device_jobs: dict[tuple[int, int], dict[str, tuple[int, int]]] = {}
        self.metrics = ReplayMetrics(self.view.state.total_device_milli, config.timeline_points)
        self.cycles = 0
        # Strict FIFO in one queue, without backfill or preemption: while its head is stuck and
        # nothing leaves, arrivals (always behind the head) change nothing, so no cycle runs.
        self.strict_alone = (
            make_ordering(self.policies.ordering, **dict(self.policies.ordering_options)).strict
            and not self.policies.backfill
            and not self.policies.preemption
            and not self.policies.quota.enabled
        )
        self.blocked = False
        self.cycle_s = 0.0
        self.meter = CostMeter(config.nodes) if config.prices is not None else None
        self.budgets = (BudgetWatch(config.budgets, config.prices)
                        if config.budgets and config.prices is not None else None)
        self.next_period_s: float | None = None
        comm = config.comm
        self.comm = CommTracker(comm.fabric, config.nodes, comm.model, comm.profiles) if comm else None
        if comm is not None:
            self.view.comm_ratio = comm.estimate_ratio
        fabric = config.fabric if config.fabric is not None else comm.fabric if comm else None
        if fabric is not None:
            self.view.set_topology(FabricView.from_fabric(fabric, config.nodes))
        self.congestion = CongestionWatch(config.congestion) if config.congestion and self.comm else None
        self.sample_at: float | None = None
        self.held: list[tuple[str, _Job]] = []
        """(id, job) of the jobs a cycle held back for locality since the last credit
        (`_credit_locality_waits`): read instead of every pending job on every cycle."""
        self.requeued_now = 0
        """Work the last applied cycle stopped and requeued (another cycle runs at once)."""
        self.waiting_now = False
        """Whether the last applied cycle left any workload waiting (not refused)."""

    # ------------------------------------------------------------------ driving

    def run(self) -> dict[str, Any]:
        started = time.perf_counter()
        for job in self.config.jobs:
            self.loop.schedule(job.submit_s, "arrive", job)
        for failure in self.config.failures:
            self.loop.schedule(failure.at_s, "fail", failure)
        for cut in self.config.link_failures:
            self.loop.schedule(cut.at_s, "link_fail", cut)
        self.loop.run(self._batch)
        result = self.metrics.summary(self.loop.clock.now_s)
        result["estimator"] = {
            "user": self.estimator.user_error.summary(),
            "history": self.estimator.history_error.summary(),
        }
        result["reservations"] = {  # how often, and how far in all, a head's reserved start moved later
            "slides": self.view.reservation_slides,
            "slid_s": self.view.reservation_slid_s,
            "preempt_slides": self.view.preempt_slides,  # of those, in cycles where work that may
            "preempt_slid_s": self.view.preempt_slid_s,  # preempt took room the head counted on
        }
        result["cycles"] = self.cycles
        result["cycle_ms_mean"] = 1000.0 * self.cycle_s / max(self.cycles, 1)
        result["unfinished"] = len(self.pending)
        if self.meter is not None and self.config.prices is not None:
            self.meter.close_all(self.loop.clock.now_s)
            result["cost"] = self.meter.report(self.config.prices)
        if self.budgets is not None:
            result["budgets"] = self.budgets.report()
        if self.comm is not None:
            span = max(self.loop.clock.now_s - (self.metrics.first_s or 0.0), 1e-9)
            total_gpus = self.view.state.total_device_milli / 1000
            result.update(self.comm.report(self.loop.clock.now_s, total_gpus, span))
        if self.congestion is not None:
            result.update(self.congestion.report())
        result["wall_s"] = time.perf_counter() - started
        return result

    def _batch(self, now_s: float, events: Sequence[Any]) -> None:
        self.metrics.advance(now_s, self.view)
        if self.comm is not None:
            self.comm.advance(now_s)
        # arrivals last: a job that ends at this instant joins the history before an arrival gets
        # its estimate from it, as the live loop reconciles pod ends before its cycle notes arrivals
        for event in sorted(events, key=lambda e: e.kind == "arrive"):
            if event.kind == "arrive":
                self._arrive(event.payload, now_s)
            elif event.kind == "finish":
                if self.jobs[event.payload].token == event.token:  # not superseded by a re-rate
                    self._finish(event.payload, now_s)
            elif event.kind == "fail":
                self.view.mark_unhealthy(event.payload.node)
                if math.isfinite(event.payload.repair_after_s):
                    self.loop.schedule(now_s + event.payload.repair_after_s, "repair", event.payload.node)
            elif event.kind == "repair":
                self.view.mark_healthy(event.payload)
            elif event.kind == "budget_period":
                self.next_period_s = None
            elif event.kind == "locality_cap":
                pass  # a held gang's max_locality_wait_s ran out: the cycle below lets it spread
            elif event.kind in ("link_fail", "link_repair"):
                self._link_event(event.payload, event.kind == "link_repair", now_s)
            elif event.kind == "congestion_sample":
                self._congestion_sample(now_s)
        if self.blocked and all(e.kind == "arrive" for e in events):
            self.metrics.observe(now_s, self.view)
            return  # new arrivals queue behind a head that still cannot start: the cycle would be a no-op
        freed = self.policies.moves is not None and any(e.kind in FREEING for e in events)
        sampled = self.view.congestion_sample is not None
        if not self.pending_workloads and not self.view.to_evict and not freed and not sampled:
            self.blocked = False
            self.metrics.observe(now_s, self.view)
            return  # nothing waits, nothing is to be evicted and nothing can move: nothing to decide
        for _ in range(MAX_CYCLES_PER_EVENT):
            tick = time.perf_counter()
            pending = self._pending_for_cycle(now_s)
            policies = self.policies if self.budgets is None else self._with_budgets(now_s)
            result = cycle_on(self.view, pending, policies, now_s, self.rng)
            self.cycle_s += time.perf_counter() - tick
            self.cycles += 1
            if self.budgets is not None:
                self._budget_waits(result, now_s)
            self._apply(result, now_s)
            if self.config.check_invariants:
                self._check(result)
            if not self.requeued_now:
                break  # requeued work gets another cycle at once (it may fit elsewhere)
        self.blocked = self.strict_alone and self.waiting_now
        self.metrics.observe(now_s, self.view)

    def _pending_for_cycle(self, now_s: float) -> Sequence[Workload]:
        """What the next cycle may admit: all pending work (sim/colocation.py holds some back)."""
        return self.pending_workloads

    def _with_budgets(self, now_s: float) -> Policies:
        """The policies with the tenants whose budget is spent."""
        assert self.budgets is not None and self.meter is not None
        return replace(self.policies, exhausted_tenants=self.budgets.exhausted(self.meter, now_s))

    def _budget_waits(self, result: CycleResult, now_s: float) -> None:
        """Count the waits; while work waits for a budget, the replay also wakes at the end of that
        tenant's period (the work may start then, with no other event)."""
        assert self.budgets is not None
        waited = self.budgets.count(result.rejected, self.pending_workloads.by_id())
        if waited and self.next_period_s is None:
            self.next_period_s = self.budgets.next_period_s(waited, now_s)
            self.loop.schedule(self.next_period_s, "budget_period")

    def _apply(self, result: CycleResult, now_s: float) -> None:
        """Every decision of the cycle, in the order made, through one match (a kind the core
        learns later fails the type check at `unhandled`, and raises there, rather than being
        dropped silently)."""
        was_held = self._credit_locality_waits(now_s)
        requeued, waiting = 0, False
        for decision in result.decisions:
            if isinstance(decision, Wait):  # most decisions on a backed-up pool: before the match, faster
                waiting = True
                if decision.reason is Reason.WAITING_FOR_LOCALITY:
                    self._held_for_locality(decision.workload_id, decision.workload_id not in was_held, now_s)
                continue
            match decision:
                case Stop(kind=EventKind.MOVE):
                    self._move(decision, now_s)
                case Stop(kind=EventKind.MIGRATE):
                    nodes = tuple(sorted({n for n, _ in self.jobs[decision.workload_id].devices}))
                    lost_device_s = self._stop(decision.workload_id, now_s, decision.kind)
                    if self.congestion is not None:
                        self.congestion.moved(decision.workload_id, nodes, lost_device_s)
                    requeued += 1
                case Stop():
                    self._stop(decision.workload_id, now_s, decision.kind)
                    requeued += 1
                case Admit():
                    self._start(decision.workload_id, now_s)
                case Refuse():
                    refused = self.pending.pop(decision.workload_id, None)
                    self.pending_workloads.pop(decision.workload_id)
                    if refused is not None:
                        self.metrics.rejected += 1
                        self.metrics.pending_change(refused.job, -1.0)
                case Reserve():
                    pass  # the view holds it; nothing runs until it starts
                case _:
                    unhandled(decision)
        self.requeued_now, self.waiting_now = requeued, waiting

    def _credit_locality_waits(self, now_s: float) -> set[str]:
        """Credit each pending job the time since the last cycle held it back for locality (only
        before its first start: the part of its queueing delay); returns those it held."""
        held: set[str] = set()
        kept: list[tuple[str, _Job]] = []
        pending = self.pending
        for wid, job in self.held:
            if job.held_since_s is None:
                continue
            if pending.get(wid) is not job:  # credited once it is pending again, as before
                kept.append((wid, job))
                continue
            job.locality_wait_s += now_s - job.held_since_s
            job.held_since_s = None
            held.add(wid)
        self.held = kept
        return held

    def _held_for_locality(self, wid: str, newly: bool, now_s: float) -> None:
        """This cycle holds the job back for locality: note since when, and wake when its cap runs out."""
        job = self.pending[wid]
        if job.first_start_s is None:
            if job.held_since_s is None:
                self.held.append((wid, job))
            job.held_since_s = now_s
        if newly:
            cap_s = self.view.locality_caps.get(wid, self.policies.max_locality_wait_s)
            if math.isfinite(cap_s):
                self.loop.schedule(self.view.locality_waits.get(wid, now_s) + cap_s, "locality_cap", wid)

    # ------------------------------------------------------------------ job life cycle

    def _arrive(self, job: TraceJob, now_s: float) -> None:
        w = job.workload
        state = _Job(job, remaining_s=job.duration_s, last_update_s=now_s)
        state.estimate_s = self.estimator.estimate_s(w)
        self.jobs[w.id] = state
        self.pending[w.id] = state
        self.pending_workloads.add(w)
        if w.runtime_estimate_s is None and state.estimate_s is not None:
            self.view.info[w.id] = WorkloadInfo(runtime_estimate_s=state.estimate_s)
        self.metrics.arrived(job)

    def _start(self, wid: str, now_s: float) -> None:
        job = self.pending.pop(wid)
        self.pending_workloads.pop(wid)
        self.metrics.pending_change(job.job, -1.0)
        job.run_start_s = job.last_update_s = now_s
        job.run_done_s = 0.0
        if job.first_start_s is None:
            job.first_start_s = now_s
            self.metrics.started(job.job, now_s, job.locality_wait_s)
        if self._run_on_placement(job, now_s):
            self._comm_rerate(now_s)
            self._sample_soon(now_s)
        if self.congestion is not None:
            self.congestion.restarted(wid, tuple(sorted({n for n, _ in job.devices})))

    def _finish(self, wid: str, now_s: float) -> None:
        job = self.jobs[wid]
        job.token = None
        self._progress(job, now_s)
        self.view.remove(wid)
        self._release_devices(job, now_s)
        if self.comm is not None and self.comm.stop(wid):
            self._comm_rerate(now_s)
        if self.meter is not None:
            self.meter.stop(wid, now_s)
        self.estimator.observe(job.job.workload, job.job.duration_s, job.estimate_s)
        self.metrics.finished(job.job, now_s, job.first_start_s or now_s)

    def _stop(self, wid: str, now_s: float, kind: EventKind) -> float:
        """Preempted, evicted or moved (the view has already let go): requeue, resuming from a
        checkpoint. Returns the device-seconds of work lost (done since that checkpoint)."""
        job = self.jobs[wid]
        lost, tracked = self._halt(job, now_s)
        job.run_start_s = None
        if tracked:
            self._comm_rerate(now_s)
        lost_device_s = lost * job.job.workload.total_device_milli / 1000
        self.metrics.stopped(kind, lost_device_s, job.job.workload.priority_class)
        self.pending[wid] = job
        self.pending_workloads.add(job.job.workload)
        self.metrics.pending_change(job.job, 1.0)
        return lost_device_s

    def _halt(self, job: _Job, now_s: float) -> tuple[float, bool]:
        """The job stops where it runs and keeps what its last checkpoint holds (the truth's
        progress, not the scheduler's estimate of it). Returns the run time lost since that
        checkpoint, and whether the communication model tracked it."""
        if job.token is not None:
            self.loop.cancel(job.token)
            job.token = None
        self._progress(job, now_s)
        done = job.kept_s + job.run_done_s
        interval = job.job.workload.checkpoint_interval_s
        kept, _ = checkpoint_split(done, interval)
        kept = max(kept, job.kept_s) if interval else 0.0
        job.kept_s = kept
        job.remaining_s = job.job.duration_s - kept
        self._release_devices(job, now_s)
        tracked = self.comm is not None and self.comm.stop(job.job.workload.id)
        if self.meter is not None:
            self.meter.stop(job.job.workload.id, now_s)
        wid = job.job.workload.id
        self.view.info[wid] = replace(  # the moves it was counted keep counting
            self.view.info.get(wid) or WorkloadInfo(),
            attained_service_s=job.attained_device_s, progress_s=kept, runtime_estimate_s=job.estimate_s,
        )
        return done - kept, tracked

    def _move(self, move: Stop, now_s: float) -> None:
        """A workload the cycle moved (`Policies.moves`; the view holds its new placement): it
        resumes at once on its new nodes from its last checkpoint (what it really kept, which the
        scheduler, counting wall time, may overestimate for a slowed gang), after `restart_s` more
        of run time."""
        assert self.policies.moves is not None
        job = self.jobs[move.workload_id]
        lost, tracked = self._halt(job, now_s)
        restart_s = self.policies.moves.restart_s
        job.remaining_s += restart_s
        gpus = job.job.workload.total_device_milli / 1000
        self.metrics.moved(move.workload_id == move.gang_id, (lost + restart_s) * gpus)
        job.run_start_s = job.last_update_s = now_s
        job.run_done_s = 0.0
        if self._run_on_placement(job, now_s) or tracked:
            self._comm_rerate(now_s)
            self._sample_soon(now_s)

    def _run_on_placement(self, job: _Job, now_s: float) -> bool:
        """The job runs on the placement the view holds for it from now; True when the truth's
        communication model tracks it (the gangs' rates are then due again)."""
        wid = job.job.workload.id
        run = self.view.running[wid]
        job.devices = [(a.node, d) for _, a in run.allocs for d in a.devices]
        if self.meter is not None:
            self.meter.start(job.job.workload, run.allocs, now_s)
        if self.policies.overcommit is not None:
            self._track_devices(job, run, add=True)
        else:
            job.rate = 1.0
            self._reschedule(job, now_s)
        gpus = job.job.workload.total_device_milli / 1000
        return self.comm is not None and self.comm.start(wid, [n for n, _ in job.devices], gpus)

    def _progress(self, job: _Job, now_s: float) -> None:
        done = (now_s - job.last_update_s) * job.rate
        job.run_done_s += done
        job.remaining_s = max(0.0, job.remaining_s - done)
        job.attained_device_s += (now_s - job.last_update_s) * job.job.workload.total_device_milli / 1000
        job.last_update_s = now_s

    def _reschedule(self, job: _Job, now_s: float) -> None:
        if job.token is not None:
            self.loop.cancel(job.token)
        job.token = self.loop.schedule(now_s + job.remaining_s / job.rate, "finish", job.job.workload.id)

    # ------------------------------------------------------------------ communication

    def _comm_rerate(self, now_s: float) -> None:
        """Multi-node gangs progress at their network-bound rate, recomputed on every change."""
        assert self.comm is not None
        rates = self.comm.rates()  # the gangs' step times too, which the link loads follow
        if not self.config.comm_slows:
            return
        for wid, rate in rates.items():
            job = self.jobs[wid]
            if job.run_start_s is None or job.rate == rate:
                continue
            self._progress(job, now_s)
            job.rate = rate
            self._reschedule(job, now_s)

    def _link_event(self, cut: LinkFailure, repaired: bool, now_s: float) -> None:
        """The truth and the scheduler's view both see the link go (and come back)."""
        if self.comm is not None:
            self.comm.set_link(cut.key, healthy=repaired)
            self._comm_rerate(now_s)
        topology = getattr(self.view, "topology", None)
        if topology is not None:
            topology.set_link(cut.key, healthy=repaired)
        if not repaired and math.isfinite(cut.repair_after_s):
            self.loop.schedule(now_s + cut.repair_after_s, "link_repair", cut)

    def _sample_soon(self, now_s: float) -> None:
        """(Re)start congestion sampling: one sample pending at a time, only while it is needed."""
        if self.congestion is not None and self.sample_at is None:
            self.sample_at = now_s + self.congestion.rule.sample_s
            self.loop.schedule(self.sample_at, "congestion_sample")

    def _congestion_sample(self, now_s: float) -> None:
        """Telemetry into the scheduler's view; with `Policies.migrate`, the gangs' bottleneck loads
        are handed to the cycle of this batch, which stops the gangs due to move (kind migrate; `_apply`
        checkpoint-requeues them) and places them again."""
        assert self.congestion is not None and self.comm is not None
        self.sample_at = None
        loads = self.congestion.sample(self.comm, self.view.topology, now_s)
        if self.policies.migrate is not None:
            self.view.congestion_sample = CongestionSample(now_s, loads)
        if self.congestion.active(self.comm):
            self._sample_soon(now_s)

    # ------------------------------------------------------------------ oversubscription

    def _track_devices(self, job: _Job, run: Any, add: bool) -> None:
        original = {p.name: p for p in job.job.workload.pods}
        defaults, nodes = self.policies.defaults, self.view.state.nodes
        for pod, alloc in run.allocs:
            burst = original[pod.name]
            for d in alloc.devices:
                # what the pod may use: its request, or the default share of this device's memory
                memory = (defaults.device_memory_mib(burst, nodes[alloc.node].devices[d])
                          if burst.is_fractional else burst.device_memory_mib)
                self.device_jobs.setdefault((alloc.node, d), {})[job.job.workload.id] = (
                    burst.device_milli,
                    memory,
                )
        self._rerate({job.job.workload.id} | self._neighbours(job), self.loop.clock.now_s)

    def _release_devices(self, job: _Job, now_s: float) -> None:
        if self.policies.overcommit is None:
            return
        wid = job.job.workload.id
        for key in job.devices:
            self.device_jobs.get(key, {}).pop(wid, None)
        self._rerate(self._neighbours(job) - {wid}, now_s)

    def _neighbours(self, job: _Job) -> set[str]:
        return {other for key in job.devices for other in self.device_jobs.get(key, {})}

    def _rerate(self, ids: set[str], now_s: float) -> None:
        assert self.policies.overcommit is not None
        penalty = self.policies.overcommit.spill_penalty
        nodes = self.view.state.nodes
        for wid in sorted(ids):
            job = self.jobs[wid]
            if job.run_start_s is None:
                continue
            self._progress(job, now_s)
            worst = 1.0
            for n, d in job.devices:
                on = self.device_jobs.get((n, d), {}).values()
                physical = nodes[n].devices[d].memory_mib
                worst = max(worst, device_slowdown([b for b, _ in on], [m for _, m in on], physical, penalty))
            job.rate = 1.0 / worst
            self._reschedule(job, now_s)

    # ------------------------------------------------------------------ checks (tests)

    def _check(self, result: CycleResult) -> None:
        self.view.state.check_invariants()
        self.view.quota.check_invariants()
        for admission in result.admitted:
            pods = self.jobs[admission.workload_id].job.workload.pods
            assert len(admission.placements) == len(pods), "a gang was partly admitted"


def replay(config: ReplayConfig) -> dict[str, Any]:
    """Run the replay protocol and return its metrics (see `ReplayMetrics.summary` for the keys)."""
    return Replay(config).run()
