"""The federated replay: one trace over several member pools, each placed by a policy at arrival.

Every member is a full replay (`sim/replay.py`: the same core scheduler cycle the server runs) on
its own nodes; the driver steps them together in time. At each arrival the hub asks every member
for its state (up, free devices, queued and running work), ranks them with `core.federation.rank`
and dispatches MultiKueue-style: offered in rank order to the members whose free devices cover it,
the first whose cycle starts it keeps it (the others never see it); when none starts it now it
queues at the first choice. A workload is in exactly one member at a time; `check_single` verifies
from the members' metered run intervals that none ever ran in two.

A failing member goes down for a while: its pending work is offered elsewhere at once, its
running work is stopped, keeps what its last checkpoint holds, and is offered elsewhere after the
grace; while down it takes nothing. Data sets are fetched over the WAN before a job starts in a
member that lacks them (staged while it queues; with `cache` the member keeps the copy).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpupool.core.federation import Choice, FedRequest, Member, MemberState, Policy, rank, reoffer
from gpupool.core.metering import PriceBook as MeterBook
from gpupool.core.metering import PriceVersion
from gpupool.core.model import Node
from gpupool.core.scheduling.cycle import Policies
from gpupool.core.scheduling.preemption import checkpoint_split
from gpupool.sim.engine import EventLoop
from gpupool.sim.federation_config import FedSpec
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import Replay, ReplayConfig

_METER = MeterBook((PriceVersion(0.0, {}, fallback_price=1.0),))
"""The members' meters only record run intervals; the federation prices them (time of day)."""


class _SteppedLoop(EventLoop):
    """An event loop the driver advances up to a time."""

    def peek_s(self) -> float:
        """The time of the next live event (inf: none)."""
        heap = self._heap
        while heap and heap[0][1] in self._cancelled:
            self._cancelled.discard(heapq.heappop(heap)[1])
        return heap[0][0] if heap else math.inf

    def pending_arrivals(self) -> list[tuple[int, TraceJob]]:
        """(token, job) of the arrivals scheduled and not fired yet (jobs whose data is on its way)."""
        return sorted((token, ev.payload) for _, token, ev in self._heap
                      if ev.kind == "arrive" and token not in self._cancelled)


class MemberReplay(Replay):
    """A member pool's replay, driven from outside: offered jobs, withdrawn jobs, its state."""

    def __init__(self, config: ReplayConfig, name: str,
                 on_run: Callable[[str, str, str, float], None]) -> None:
        super().__init__(config)
        self.loop: _SteppedLoop = _SteppedLoop()
        self.name = name
        self.on_run = on_run
        self.queued_device_s = 0.0

    def advance_to(self, t_s: float) -> None:
        """Fire every event at or before `t_s`."""
        while (at := self.loop.peek_s()) <= t_s and math.isfinite(at):
            batch = self.loop.next_batch()
            if batch:
                self._batch(self.loop.clock.now_s, batch)

    def offer(self, job: TraceJob, now_s: float) -> bool:
        """The job arrives here now; True when this member's cycle started it at once."""
        self.loop.schedule(now_s, "arrive", job)
        self.queued_device_s += job.workload.total_device_milli / 1000 * job.duration_s
        self.advance_to(now_s)
        wid = job.workload.id
        return wid in self.jobs and wid not in self.pending

    def withdraw(self, wid: str, now_s: float) -> float:
        """Take the job out of this member (queued, or running: stopped, keeping its last
        checkpoint); returns the run time it still needs."""
        job = self.jobs.pop(wid)
        if wid in self.pending:
            del self.pending[wid]
            self.pending_workloads.pop(wid)
            self.metrics.pending_change(job.job, -1.0)
            self.queued_device_s -= job.job.workload.total_device_milli / 1000 * job.remaining_s
        elif job.run_start_s is not None:
            self._halt(job, now_s)
            self.view.remove(wid)
            job.run_start_s = None
            self.on_run(self.name, wid, "stop", now_s)
        self.view.info.pop(wid, None)
        self.view.locality_waits.pop(wid, None)
        return job.remaining_s

    def _start(self, wid: str, now_s: float) -> None:
        remaining = self.jobs[wid].remaining_s
        super()._start(wid, now_s)
        self.queued_device_s -= self.jobs[wid].job.workload.total_device_milli / 1000 * remaining
        self.on_run(self.name, wid, "start", now_s)

    def _finish(self, wid: str, now_s: float) -> None:
        super()._finish(wid, now_s)
        self.jobs.pop(wid).run_start_s = None  # done here: no longer this member's work
        self.on_run(self.name, wid, "finish", now_s)

    def _stop(self, wid: str, now_s: float, kind: Any) -> float:
        lost = super()._stop(wid, now_s, kind)
        job = self.jobs[wid]
        self.queued_device_s += job.job.workload.total_device_milli / 1000 * job.remaining_s
        self.on_run(self.name, wid, "stop", now_s)
        return lost

    def state(self, up: bool, now_s: float) -> MemberState:
        st = self.view.state
        schedulable = st.schedulable
        free = float(st.dev_milli_free[schedulable].sum()) / 1000
        capacity = float(st.dev_milli_cap.sum()) / 1000
        running = 0.0
        for job in self.jobs.values():
            if job.run_start_s is not None:
                left = job.remaining_s - (now_s - job.last_update_s) * job.rate
                running += max(0.0, left) * job.job.workload.total_device_milli / 1000
        return MemberState(up, {"gpu": free}, {"gpu": capacity}, max(0.0, self.queued_device_s), running)


@dataclass(slots=True)
class FedJob:
    """A workload as the hub tracks it across members."""

    job: TraceJob
    home: str
    dataset: str
    dataset_gb: float
    member: str | None = None
    first_start_s: float | None = None
    finished_s: float | None = None
    failure_moves: int = 0
    lost_s: float = 0.0
    data_gb: float = 0.0
    egress_cost: float = 0.0
    queued_s: float | None = None
    """When it was last given to its member (the age the re-offer measures)."""
    reoffer_moves: int = 0


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    policy: Policy
    failure: bool = False


@dataclass
class FedSetup:
    spec: FedSpec
    nodes: dict[str, tuple[Node, ...]]
    """Member -> its nodes."""
    jobs: tuple[TraceJob, ...]
    policies: Policies
    seed: int = 0
    dataset_gb: dict[str, float] = field(default_factory=dict)
    holders: dict[str, frozenset[str]] = field(default_factory=dict)
    """Data set -> the members that hold it at the start."""
    job_dataset: dict[str, str] = field(default_factory=dict)


def draw_datasets(spec: FedSpec, jobs: Sequence[TraceJob],
                  seed: int) -> tuple[dict[str, float], dict[str, frozenset[str]], dict[str, str]]:
    """Each tenant's data sets (sizes lognormal, seeded), who holds them, and each job's set."""
    rng = random.Random(f"datasets:{seed}")
    d = spec.datasets
    sizes: dict[str, float] = {}
    holders: dict[str, frozenset[str]] = {}
    per_job: dict[str, str] = {}
    for tenant in sorted({j.workload.tenant for j in jobs}):
        home = spec.homes.get(tenant, spec.default_home)
        for k in range(d.per_tenant):
            name = f"{tenant}/ds{k}"
            sizes[name] = min(d.max_gb, d.median_gb * math.exp(rng.gauss(0.0, d.sigma)))
            held = {home}
            if d.replicated_to is not None and rng.random() < d.replicated_share:
                held.add(d.replicated_to)
            holders[name] = frozenset(held)
    for job in jobs:
        per_job[job.workload.id] = f"{job.workload.tenant}/ds{rng.randrange(d.per_tenant)}"
    return sizes, holders, per_job


class Federation:
    """One variant's run over all members; `run()` returns its metrics."""

    def __init__(self, setup: FedSetup, variant: Variant) -> None:
        self.setup, self.variant, self.spec = setup, variant, setup.spec
        self.base_members = {m.name: m for m in self.spec.core_members()}
        self.held: dict[str, set[str]] = {name: set(m.datasets) for name, m in self.base_members.items()}
        for ds, members in setup.holders.items():
            for m in members:
                self.held[m].add(ds)
        self.members: dict[str, MemberReplay] = {}
        for name in self.base_members:
            config = ReplayConfig(setup.nodes[name], (), setup.policies, seed=setup.seed, prices=_METER)
            self.members[name] = MemberReplay(config, name, self._on_run)
        self.up = {name: True for name in self.members}
        self.jobs: dict[str, FedJob] = {}
        self.running_in: dict[str, str] = {}
        self.moved_by_failure = 0
        self.lost_device_s = 0.0
        self.unplaced: list[tuple[str, float]] = []
        """(workload, remaining run time) held at the hub while no member can take it."""
        self.refused = 0
        self.moves: list[tuple[float, str, str, str, str]] = []
        """(when, workload, from, to, why) of every re-offer move."""

    # ------------------------------------------------------------------ bookkeeping

    def _on_run(self, member: str, wid: str, what: str, now_s: float) -> None:
        fed = self.jobs[wid]
        if what == "start":
            other = self.running_in.get(wid)
            assert other is None, f"{wid} starts in {member} while running in {other}"
            self.running_in[wid] = member
            if fed.first_start_s is None:
                fed.first_start_s = now_s
            return
        self.running_in.pop(wid, None)
        if what == "finish":
            fed.finished_s = now_s

    def _member_views(self) -> list[Member]:
        return [replace(m, datasets=frozenset(self.held[name])) for name, m in self.base_members.items()]

    def _request(self, fed: FedJob, runtime_s: float) -> FedRequest:
        devices = fed.job.workload.total_device_milli / 1000
        return FedRequest(tenant=fed.job.workload.tenant, home=fed.home, devices=devices, runtime_s=runtime_s,
                          dataset=fed.dataset, dataset_gb=fed.dataset_gb,
                          wait_price_per_h=self.spec.wait_price_per_device_hour * devices)

    # ------------------------------------------------------------------ dispatch

    def _place(self, wid: str, runtime_s: float, now_s: float) -> None:
        """Rank the members for the job and offer it down the list (see the module docstring)."""
        fed = self.jobs[wid]
        states = {name: r.state(self.up[name], now_s) for name, r in self.members.items()}
        request = self._request(fed, runtime_s)
        ranking = rank(request, self._member_views(), states, self.variant.policy, now_s)
        if not ranking.choices:
            if not all(self.up.values()):
                self.unplaced.append((wid, runtime_s))  # a member that is down may take it once back
            else:
                self.refused += 1
            return
        job = replace(fed.job, duration_s=runtime_s)
        devices = fed.job.workload.total_device_milli / 1000
        for choice in ranking.choices:
            if states[choice.member].free.get("gpu", 0.0) < devices:
                continue  # it could not start there now
            if choice.transfer_s > 0:  # room now: it is sent there, to start once its data set is in
                self._stage(job, choice, now_s)
                return
            if self.members[choice.member].offer(job, now_s):
                self._commit(fed, choice.member, choice.transfer_gb, choice.egress_cost, now_s)
                return
            self.members[choice.member].withdraw(wid, now_s)
        first = ranking.choices[0]  # nobody starts it now: it queues at the first choice
        if first.transfer_s > 0:
            self._stage(job, first, now_s)
        else:
            self.members[first.member].offer(job, now_s)
            self._commit(fed, first.member, first.transfer_gb, first.egress_cost, now_s)

    def _stage(self, job: TraceJob, choice: Choice, now_s: float) -> None:
        """The job arrives at the member once its data set has (the transfer's seconds from now)."""
        target = self.members[choice.member]
        target.loop.schedule(now_s + choice.transfer_s, "arrive", job)
        target.queued_device_s += job.workload.total_device_milli / 1000 * job.duration_s
        self._commit(self.jobs[job.workload.id], choice.member, choice.transfer_gb, choice.egress_cost, now_s)

    def _commit(self, fed: FedJob, member: str, gb: float, egress: float, now_s: float) -> None:
        fed.member = member
        fed.queued_s = now_s
        fed.data_gb += gb
        fed.egress_cost += egress
        if gb and self.spec.datasets.cache:
            self.held[member].add(fed.dataset)

    # ------------------------------------------------------------------ re-offer

    def _reoffer(self, now_s: float) -> None:
        """Re-rank the work queued at its member for at least `reoffer_after_s`; move each job that
        another member starts now and sooner by the policy's measure (core.federation.reoffer). Its
        wait where it is counts the work queued there before it (not all of that member's queue). The
        old copy is withdrawn (and checked gone) before the new one is offered: never two copies."""
        if self.variant.policy is Policy.HOME:
            return
        states = {name: r.state(self.up[name], now_s) for name, r in self.members.items()}
        views = self._member_views()
        queued = sorted((fed.queued_s or 0.0, wid, name) for name, member in self.members.items()
                        if self.up[name] for wid in member.pending
                        if (fed := self.jobs[wid]).queued_s is not None
                        and now_s - fed.queued_s >= self.spec.reoffer_after_s)
        ahead: dict[str, float] = {}  # the work queued at its member before it (its wait there)
        for member in self.members.values():
            total = 0.0
            for _, wid in sorted((self.jobs[w].queued_s or 0.0, w) for w in member.pending):
                ahead[wid] = total
                total += member.jobs[wid].remaining_s * self.jobs[wid].job.workload.total_device_milli / 1000
        for _, wid, name in queued:
            member, fed = self.members[name], self.jobs[wid]
            remaining = member.jobs[wid].remaining_s
            here = replace(states[name], queued_device_s=ahead[wid])
            found = reoffer(self._request(fed, remaining), name, views, {**states, name: here},
                            self.variant.policy, now_s)
            if found is None:
                continue
            choice, why = found
            left = member.withdraw(wid, now_s)
            assert wid not in member.jobs, f"{wid} still in {name} after its withdrawal"
            job = replace(fed.job, duration_s=left)
            if choice.transfer_s > 0:
                self._stage(job, choice, now_s)
            else:
                self.members[choice.member].offer(job, now_s)
                self._commit(fed, choice.member, choice.transfer_gb, choice.egress_cost, now_s)
            fed.reoffer_moves += 1
            self.moves.append((now_s, wid, name, choice.member, why))
            for changed in (name, choice.member):
                states[changed] = self.members[changed].state(self.up[changed], now_s)
            if choice.transfer_gb:
                views = self._member_views()

    # ------------------------------------------------------------------ failures

    def _fail(self, name: str, now_s: float, grace_s: float) -> list[tuple[float, str, float]]:
        """The member stops answering: withdraw all it has; returns (when, job, run time) to re-place."""
        self.up[name] = False
        member = self.members[name]
        again: list[tuple[float, str, float]] = []
        for wid in sorted(member.jobs):
            running = member.jobs[wid].run_start_s is not None
            job = member.jobs[wid]
            if running:
                member._progress(job, now_s)
                done = job.kept_s + job.run_done_s
                kept, _ = checkpoint_split(done, job.job.workload.checkpoint_interval_s)
                gpus = job.job.workload.total_device_milli / 1000
                self.lost_device_s += (done - max(kept, job.kept_s)) * gpus
            if wid in member.pending or running:
                remaining = member.withdraw(wid, now_s)
                fed = self.jobs[wid]
                fed.failure_moves += 1
                fed.member = None
                self.moved_by_failure += 1
                again.append((now_s + (grace_s if running else 0.0), wid, remaining))
        for token, staged in member.loop.pending_arrivals():  # jobs whose data set is on its way
            member.loop.cancel(token)
            member.queued_device_s -= staged.workload.total_device_milli / 1000 * staged.duration_s
            self.jobs[staged.workload.id].failure_moves += 1
            self.moved_by_failure += 1
            again.append((now_s, staged.workload.id, staged.duration_s))
        return again

    # ------------------------------------------------------------------ driving

    def run(self) -> dict[str, Any]:
        import heapq

        events: list[tuple[float, int, str, Any]] = []
        seq = 0
        for job in self.setup.jobs:
            wid = job.workload.id
            home = self.spec.homes.get(job.workload.tenant, self.spec.default_home)
            ds = self.setup.job_dataset.get(wid, "")
            self.jobs[wid] = FedJob(job, home, ds, self.setup.dataset_gb.get(ds, 0.0))
            events.append((job.submit_s, seq, "arrive", (wid, job.duration_s)))
            seq += 1
        failure = self.spec.failure if self.variant.failure else None
        start_s = min((j.submit_s for j in self.setup.jobs), default=0.0)
        if failure is not None:
            at = start_s + failure.at_h * 3600
            events.append((at, -2, "fail", failure.member))  # before arrivals at the same instant
            events.append((at + failure.for_h * 3600, -1, "return", failure.member))
        every = self.spec.reoffer_every_s
        if every > 0:
            events.append((start_s + every, -3, "reoffer", None))
        heapq.heapify(events)
        while events:
            at, _, kind, payload = heapq.heappop(events)
            for member in self.members.values():
                member.advance_to(at)
            if kind == "arrive":
                self._place(payload[0], payload[1], at)
            elif kind == "fail":
                assert failure is not None
                for when, wid, remaining in self._fail(payload, at, failure.grace_s):
                    seq += 1
                    heapq.heappush(events, (when, seq, "arrive", (wid, remaining)))
            elif kind == "reoffer":
                self._reoffer(at)
                if any(e[2] != "reoffer" for e in events) or any(
                        m.pending and math.isfinite(m.loop.peek_s()) for m in self.members.values()):
                    heapq.heappush(events, (at + every, -3, "reoffer", None))
            elif kind == "return":
                self.up[payload] = True
                held, self.unplaced = self.unplaced, []
                for wid, remaining in held:
                    self._place(wid, remaining, at)
        for member in self.members.values():
            member.advance_to(math.inf)
        return self.report(start_s)

    # ------------------------------------------------------------------ results

    def report(self, start_s: float) -> dict[str, Any]:
        end_s = max((f.finished_s or 0.0 for f in self.jobs.values()), default=start_s)
        check_single(self.members)
        compute = 0.0
        per_member: dict[str, Any] = {}
        for name, member in self.members.items():
            assert member.meter is not None
            member.meter.close_all(end_s)
            book = self.base_members[name].prices
            used_s = cost = 0.0
            for iv in member.meter.intervals:
                devices = sum(s.compute_milli for s in iv.slices) / 1000
                used_s += devices * (iv.end_s - iv.start_s)
                cost += book.cost("gpu", devices, iv.start_s, iv.end_s)
            capacity = member.view.state.total_device_milli / 1000
            span = max(end_s - start_s, 1e-9)
            per_member[name] = {"gpus": capacity, "utilisation_pct": 100 * used_s / (capacity * span),
                                "compute_cost": cost,
                                "jobs": sum(1 for f in self.jobs.values() if f.member == name)}
            compute += cost
        done = [f for f in self.jobs.values() if f.finished_s is not None]
        jct = sorted(f.finished_s - f.job.submit_s for f in done)  # type: ignore[operator]
        queue = [f.first_start_s - f.job.submit_s for f in done if f.first_start_s is not None]
        egress = sum(f.egress_cost for f in self.jobs.values())
        remote = sum(1 for f in self.jobs.values() if f.member is not None and f.member != f.home)
        return {
            "variant": self.variant.name, "policy": self.variant.policy.value, "jobs": len(self.jobs),
            "finished": len(done), "refused": self.refused,
            "total_cost": compute + egress, "compute_cost": compute, "egress_cost": egress,
            "data_moved_gb": sum(f.data_gb for f in self.jobs.values()),
            "jct_mean_s": sum(jct) / len(jct) if jct else 0.0,
            "jct_p95_s": jct[min(len(jct) - 1, int(0.95 * len(jct)))] if jct else 0.0,
            "queue_mean_s": sum(queue) / len(queue) if queue else 0.0,
            "remote_share": remote / max(len(self.jobs), 1),
            "moved_by_failure": self.moved_by_failure,
            "moved_by_reoffer": len(self.moves),
            "failure_lost_gpu_hours": self.lost_device_s / 3600,
            "members": per_member,
            "single_member_checked": True,
        }


def check_single(members: dict[str, MemberReplay]) -> None:
    """No workload ever ran in two members at once: its run intervals, over all members, never overlap."""
    runs: dict[str, list[tuple[float, float, str]]] = {}
    for name, member in members.items():
        assert member.meter is not None
        seen: set[tuple[str, float, float]] = set()
        for iv in member.meter.intervals:
            wid = iv.pod_id.rsplit("-", 2)[0]
            key = (wid, iv.start_s, iv.end_s)
            if key not in seen:
                seen.add(key)
                runs.setdefault(wid, []).append((iv.start_s, iv.end_s, name))
        for wid, (start, _, _held) in member.meter.open.items():
            runs.setdefault(wid, []).append((start, math.inf, name))
    for wid, spans in runs.items():
        spans.sort()
        for (_, end_a, a), (start_b, _, b) in itertools.pairwise(spans):
            if start_b < end_a - 1e-9:
                raise AssertionError(f"workload {wid} ran in {a} and {b} at once")


def run_variants(setup: FedSetup, variants: Sequence[Variant]) -> list[dict[str, Any]]:
    return [Federation(setup, v).run() for v in variants]
