"""What a replay measures: allocation over time, queueing delay, JCT, lost work, per-tenant fairness.

Fair share: at every moment the pool's devices are divided max-min fairly (water-filling) among
the tenants that want any, each capped at its demand (running plus pending milli-devices). A
tenant's `fair_share` is its time integral of that division over the integral of all tenants';
its `share` is the same ratio for what it actually held. `fairness_jain` is Jain's index of
share / fair_share over tenants (1.0 = everyone got exactly their fair share).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpupool.core.scheduling.cycle import EventKind
from gpupool.core.scheduling.view import ClusterView
from gpupool.sim.jobs import TraceJob


def waterfill(capacity: float, demands: dict[str, float]) -> dict[str, float]:
    """Max-min fair division of `capacity` among demands (nobody gets more than it asks)."""
    out: dict[str, float] = {}
    left = capacity
    ordered = sorted(demands.items(), key=lambda kv: (kv[1], kv[0]))
    for i, (tenant, demand) in enumerate(ordered):
        give = min(demand, left / (len(ordered) - i))
        out[tenant] = give
        left -= give
    return out


GANG_BUCKETS = ("1", "2-8", "9-32", ">32")
"""Gang sizes by the GPUs a workload asks for (a fraction of one device counts as 1)."""


def gang_bucket(gpus: float) -> str:
    whole = math.ceil(gpus - 1e-9)
    if whole <= 1:
        return "1"
    if whole <= 8:
        return "2-8"
    return "9-32" if whole <= 32 else ">32"


MULTI_POD = "multi-pod"


def _gang_keys(job: TraceJob) -> tuple[str, ...]:
    bucket = gang_bucket(job.workload.total_device_milli / 1000)
    return (bucket, MULTI_POD) if len(job.workload.pods) > 1 else (bucket,)


def _stats4(values: list[float]) -> dict[str, float]:
    """mean, p50, p95 and p99 (zeros when empty)."""
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0}
    arr = np.asarray(values, dtype=float)
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return {"mean": float(arr.mean()), "p50": float(p50), "p95": float(p95), "p99": float(p99)}


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    arr = np.asarray(values, dtype=float)
    return {
        "mean": float(arr.mean()),
        "p50": float(np.percentile(arr, 50)),
        "p99": float(np.percentile(arr, 99)),
    }


@dataclass(slots=True)
class ReplayMetrics:
    total_milli: int
    points: int
    first_s: float | None = None
    last_s: float = 0.0
    alloc_integral: float = 0.0
    current_pct: float = 0.0
    timeline: list[tuple[float, float]] = field(default_factory=list)
    queue_delays: list[float] = field(default_factory=list)
    jcts: list[float] = field(default_factory=list)
    tenant_delays: dict[str, list[float]] = field(default_factory=dict)
    tenant_used: dict[str, float] = field(default_factory=dict)
    tenant_fair: dict[str, float] = field(default_factory=dict)
    tenant_pending_milli: dict[str, float] = field(default_factory=dict)
    jobs: int = 0
    finished_jobs: int = 0
    rejected: int = 0
    preemptions: int = 0
    evictions: int = 0
    lost_device_s: float = 0.0
    moved_gangs: int = 0
    """Gangs moved into one leaf (`Policies.moves`), and the single-node workloads moved for them."""
    moved_others: int = 0
    move_cost_device_s: float = 0.0
    """What the moves cost: work since the last checkpoint done again, plus restarts."""
    last_finish_s: float = 0.0
    last_arrival_s: float = 0.0
    fair_for: tuple[dict[str, float], dict[str, float]] = ({}, {})
    """The last demands water-filled and their division (reused while the demands hold)."""
    class_delays: dict[str, list[float]] = field(default_factory=dict)
    class_jcts: dict[str, list[float]] = field(default_factory=dict)
    class_preempted: dict[str, list[float]] = field(default_factory=dict)
    """By priority class: queueing delays, JCTs, and the device-seconds each preemption of its work lost."""
    gang_delays: dict[str, list[float]] = field(default_factory=dict)
    gang_jcts: dict[str, list[float]] = field(default_factory=dict)
    gang_locality: dict[str, list[float]] = field(default_factory=dict)
    """By gang-size bucket; the key "multi-pod" also collects every workload of more than one pod."""
    locality_wait_total_s: float = 0.0
    locality_waited: int = 0
    current_free_milli: float = 0.0
    idle_waiting_integral: float = 0.0
    """Device-milli-seconds free while work waited, at most what waited (min(free, waiting))."""
    waiting_s: float = 0.0
    """Seconds during which some work waited."""
    idle_waiting_at_arrival: tuple[float, float] = (0.0, 0.0)
    """(idle_waiting_integral, waiting_s) at the latest arrival: their values over the arrival window."""

    def arrived(self, job: TraceJob) -> None:
        self.jobs += 1
        self.last_arrival_s = max(self.last_arrival_s, job.submit_s)
        if self.first_s is None:
            self.first_s = self.last_s = job.submit_s
        self.idle_waiting_at_arrival = (self.idle_waiting_integral, self.waiting_s)
        self.pending_change(job, 1.0)

    def pending_change(self, job: TraceJob, sign: float) -> None:
        t = job.workload.tenant
        self.tenant_pending_milli[t] = self.tenant_pending_milli.get(t, 0.0) + sign * (
            job.workload.total_device_milli
        )

    def started(self, job: TraceJob, now_s: float, locality_wait_s: float = 0.0) -> None:
        """A job's first start; `locality_wait_s`: the part of its queueing delay wait-or-spread
        held it back for a domain of its own."""
        delay = now_s - job.submit_s
        self.queue_delays.append(delay)
        self.tenant_delays.setdefault(job.workload.tenant, []).append(delay)
        self.class_delays.setdefault(job.workload.priority_class, []).append(delay)
        for key in _gang_keys(job):
            self.gang_delays.setdefault(key, []).append(delay)
            self.gang_locality.setdefault(key, []).append(locality_wait_s)
        self.locality_wait_total_s += locality_wait_s
        self.locality_waited += int(locality_wait_s > 0)

    def finished(self, job: TraceJob, now_s: float, first_start_s: float) -> None:
        self.finished_jobs += 1
        self.jcts.append(now_s - job.submit_s)
        self.class_jcts.setdefault(job.workload.priority_class, []).append(now_s - job.submit_s)
        for key in _gang_keys(job):
            self.gang_jcts.setdefault(key, []).append(now_s - job.submit_s)
        self.last_finish_s = max(self.last_finish_s, now_s)

    def moved(self, gang: bool, cost_device_s: float) -> None:
        if gang:
            self.moved_gangs += 1
        else:
            self.moved_others += 1
        self.move_cost_device_s += cost_device_s

    def stopped(self, kind: EventKind, lost_device_s: float, priority_class: str = "") -> None:
        if kind == EventKind.EVICT:
            self.evictions += 1
        elif kind == EventKind.PREEMPT:
            self.preemptions += 1
            self.class_preempted.setdefault(priority_class, []).append(lost_device_s)
        self.lost_device_s += lost_device_s

    def advance(self, now_s: float, view: ClusterView) -> None:
        """Integrate what held between the previous event and now."""
        if self.first_s is None:
            return
        dt = now_s - self.last_s
        if dt > 0:
            self.alloc_integral += self.current_pct * dt
            waiting = sum(self.tenant_pending_milli.values())
            if waiting > 0.5:  # milli-GPUs; the sums are of integers
                self.waiting_s += dt
                self.idle_waiting_integral += min(self.current_free_milli, waiting) * dt
            demand: dict[str, float] = {}
            for tenant, usage in view.tenant_usage.items():
                held = usage.get("device_milli", 0.0)
                self.tenant_used[tenant] = self.tenant_used.get(tenant, 0.0) + held * dt
                demand[tenant] = held
            for tenant, waiting in self.tenant_pending_milli.items():
                demand[tenant] = demand.get(tenant, 0.0) + waiting
            demand = {t: d for t, d in demand.items() if d > 0}
            if demand != self.fair_for[0]:  # the division changes only with the demands
                self.fair_for = (demand, waterfill(float(self.total_milli), demand))
            for tenant, fair in self.fair_for[1].items():
                self.tenant_fair[tenant] = self.tenant_fair.get(tenant, 0.0) + fair * dt
        self.last_s = now_s

    def observe(self, now_s: float, view: ClusterView) -> None:
        """Record the allocation after the cycle at `now_s`."""
        state = view.state
        allocated = state.allocated_device_milli
        self.current_pct = 100.0 * allocated / max(self.total_milli, 1)
        self.current_free_milli = float(self.total_milli - allocated)
        if self.timeline and self.timeline[-1][0] == now_s:
            self.timeline[-1] = (now_s, self.current_pct)
        else:
            self.timeline.append((now_s, self.current_pct))

    def summary(self, end_s: float) -> dict[str, Any]:
        start = self.first_s if self.first_s is not None else 0.0
        span = max(end_s - start, 1e-9)
        used_total = sum(self.tenant_used.values()) or 1.0
        fair_total = sum(self.tenant_fair.values()) or 1.0
        per_tenant: dict[str, dict[str, float]] = {}
        ratios = []
        for tenant in sorted(set(self.tenant_used) | set(self.tenant_fair) | set(self.tenant_delays)):
            share = self.tenant_used.get(tenant, 0.0) / used_total
            fair = self.tenant_fair.get(tenant, 0.0) / fair_total
            delays = self.tenant_delays.get(tenant, [])
            per_tenant[tenant] = {
                "share": share,
                "fair_share": fair,
                "mean_queue_delay_s": float(np.mean(delays)) if delays else 0.0,
                "jobs_started": len(delays),
            }
            if fair > 0:
                ratios.append(share / fair)
        jain = (sum(ratios) ** 2 / (len(ratios) * sum(r * r for r in ratios))) if ratios else 1.0
        return {
            "jobs": self.jobs,
            "finished": self.finished_jobs,
            "rejected": self.rejected,
            "gpu_alloc_pct_mean": self.alloc_integral / span,
            "gpu_alloc_pct_mean_arrivals": self._mean_until(start, self.last_arrival_s),
            "gpu_alloc_pct_timeline": self._sampled(start, end_s),
            "idle_while_waiting": self._idle_while_waiting(start),
            "queue_delay_s": _stats(self.queue_delays),
            "jct_s": _stats(self.jcts),
            "makespan_s": max(self.last_finish_s, end_s) - start,
            "preemptions": self.preemptions,
            "evictions": self.evictions,
            "lost_gpu_hours": self.lost_device_s / 3600.0,
            "moves": {"gangs": self.moved_gangs, "others": self.moved_others,
                      "cost_gpu_hours": self.move_cost_device_s / 3600.0},
            "per_tenant": per_tenant,
            "fairness_jain": jain,
            "by_gang_size": self.by_gang_size(),
            "by_priority_class": self.by_priority_class(),
            "multi_pod_gangs": self._gang_stats(MULTI_POD),
            "locality_wait_s_total": self.locality_wait_total_s,
            "locality_waited_jobs": self.locality_waited,
        }

    def _idle_while_waiting(self, start: float) -> dict[str, float]:
        """GPUs left free while work waited, counted up to what waited (a queue of one 2-GPU job
        beside 8 free GPUs leaves 2 idle), over the arrival window like `gpu_alloc_pct_mean_arrivals`:
        `pct` is their mean in points of the pool, `gpu_hours` their integral, `waiting_share` the
        share of the window in which anything waited. A policy that holds work back (a locality
        wait, a reservation, fragmentation) raises it; one whose work merely ends sooner does not."""
        integral, waiting_s = self.idle_waiting_at_arrival
        window = self.last_arrival_s - start
        if window <= 0:
            return {"pct": 0.0, "gpu_hours": 0.0, "waiting_share": 0.0}
        return {"pct": 100.0 * integral / (max(self.total_milli, 1) * window),
                "gpu_hours": integral / 1000.0 / 3600.0,
                "waiting_share": waiting_s / window}

    def by_priority_class(self) -> dict[str, dict[str, Any]]:
        """Per priority class: workloads started and finished, their queueing delay (first start) and
        JCT, and how often its work was preempted with the GPU-hours that lost."""
        classes = sorted(set(self.class_delays) | set(self.class_jcts) | set(self.class_preempted))
        return {c: {"started": len(self.class_delays.get(c, [])),
                    "finished": len(self.class_jcts.get(c, [])),
                    "queue_delay_s": _stats4(self.class_delays.get(c, [])),
                    "jct_s": _stats4(self.class_jcts.get(c, [])),
                    "preempted": len(self.class_preempted.get(c, [])),
                    "lost_gpu_hours": sum(self.class_preempted.get(c, [])) / 3600.0}
                for c in classes}

    def by_gang_size(self) -> dict[str, dict[str, Any]]:
        """Per gang-size bucket: workloads finished, their JCT, queueing delay (first start) and the
        part of it spent waiting for locality."""
        return {bucket: self._gang_stats(bucket) for bucket in GANG_BUCKETS}

    def _gang_stats(self, key: str) -> dict[str, Any]:
        return {
            "count": len(self.gang_jcts.get(key, [])),
            "jct_s": _stats4(self.gang_jcts.get(key, [])),
            "queue_delay_s": _stats4(self.gang_delays.get(key, [])),
            "locality_wait_s": _stats4(self.gang_locality.get(key, [])),
        }

    def _mean_until(self, start: float, end: float) -> float:
        """Mean allocation % from the first to the last arrival (the load the trace offers)."""
        if not self.timeline or end <= start:
            return self.current_pct
        times = np.asarray([t for t, _ in self.timeline] + [end])
        values = np.asarray([v for _, v in self.timeline])
        spans = np.clip(np.minimum(times[1:], end) - np.maximum(times[:-1], start), 0.0, None)
        return float((spans * values).sum() / (end - start))

    def _sampled(self, start: float, end: float) -> list[list[float]]:
        """The step function of allocation %, sampled at `points` evenly spaced times."""
        if not self.timeline:
            return []
        times = np.asarray([t for t, _ in self.timeline])
        values = [v for _, v in self.timeline]
        n = max(2, self.points)
        out = []
        for k in range(n):
            t = start + (end - start) * k / (n - 1)
            i = int(np.searchsorted(times, t, side="right")) - 1
            out.append([round(t - start, 3), round(values[i], 3) if i >= 0 else 0.0])
        return out if math.isfinite(end) else []
