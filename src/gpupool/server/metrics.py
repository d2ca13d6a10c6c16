"""Prometheus metrics: pool gauges read from the store at scrape time, plus latency histograms."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from gpupool.core.model import WorkloadStatus
from gpupool.core.units import MILLI
from gpupool.server.loops.launches import MAX_STUCK
from gpupool.server.loops.store_audit import KINDS as STORE_AUDIT_KINDS
from gpupool.server.metrics_budgets import BudgetCollector
from gpupool.server.metrics_usage import UsageCollector
from gpupool.server.orm import PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.events import moves_not_made
from gpupool.server.states import ACTIVE_POD_STATES

_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    """One registry per server (so tests can run several apps in one process)."""

    def __init__(self, rt: Runtime) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.cycle_seconds = Histogram(
            "gpupool_scheduling_cycle_duration_seconds",
            "Wall time of one scheduling cycle (snapshot, decide, record).",
            buckets=_LATENCY_BUCKETS_S, registry=self.registry,
        )
        self.request_seconds = Histogram(
            "gpupool_api_request_duration_seconds",
            "Wall time of API requests by method, route template and status code.",
            ["method", "route", "status"], buckets=_LATENCY_BUCKETS_S, registry=self.registry,
        )
        self.store_view_divergence = PromCounter(
            "gpupool_store_view_divergence",
            "Differences the scheduler's store audit found between its cached placements and the "
            "store read afresh, by kind (placement, missing, status); each was logged and the cache "
            "rebuilt. Never more than 0 unless something wrote the store behind the scheduler's back.",
            ["kind"], registry=self.registry,
        )
        for kind in STORE_AUDIT_KINDS:
            self.store_view_divergence.labels(kind)
        self.reservation_slides = PromCounter(
            "gpupool_reservation_slides",
            "Times backfill's reserved start for the same head moved later from one cycle to the next "
            "(a run it waits on ran past its estimate, or work that may preempt took its room).",
            registry=self.registry,
        )
        self.reservation_slid_seconds = PromCounter(
            "gpupool_reservation_slid_seconds",
            "How far in all (seconds) those reserved starts moved later.",
            registry=self.registry,
        )
        # several servers on one store (server/leader.py)
        self.is_leader = Gauge("gpupool_is_leader", "1 while this server leads the pool (runs the control "
                               "loop), 0 while it follows; a single server always leads.",
                               registry=self.registry)
        self.is_leader.set(1)
        self.leader_changes = PromCounter(
            "gpupool_leader_changes", "Times this server took the leadership (a takeover, or its start).",
            registry=self.registry)
        self.lease_renew_seconds = Histogram(
            "gpupool_lease_renew_seconds", "Wall time of one successful take or renewal of the leader lease.",
            buckets=_LATENCY_BUCKETS_S, registry=self.registry)
        self.follower_wakes = PromCounter(
            "gpupool_follower_wakes", "Times a write answered by another server woke this leader's loop "
            "(LISTEN/NOTIFY; --ha on PostgreSQL).", registry=self.registry)
        self.registry.register(PoolCollector(rt))
        self.registry.register(UsageCollector(rt))
        self.registry.register(BudgetCollector(rt))
        self.registry.register(MovesNotMadeCollector())
        self.registry.register(LaunchCollector(rt))
        from gpupool.server.serving.metrics import ServiceCollector  # inference services' gauges

        self.registry.register(ServiceCollector(rt))


    def reservation_slid(self, seconds: float) -> None:
        """The same head's reserved start moved `seconds` later than last stored."""
        self.reservation_slides.inc()
        self.reservation_slid_seconds.inc(seconds)


class MovesNotMadeCollector(Collector):
    """State moves not made in this process (`services/events.py` `not_made`), by kind (workload,
    pod), outcome (refused: not an edge of the table; lost: a compare-and-set that lost), from, to."""

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "gpupool_state_moves_not_made",
            "Workload and pod state moves not made, by kind, outcome (refused: not an edge of the "
            "transition table, a bug; lost: its row had changed since it was read, a concurrent "
            "change won) and the from and to states. Each was logged; nothing was written for it.",
            labels=["kind", "outcome", "from_status", "to_status"])
        for (kind, outcome, from_status, to_status), count in sorted(moves_not_made().items()):
            family.add_metric([kind, outcome, from_status, to_status], count)
        yield family


class LaunchCollector(Collector):
    """The nodes' launch threads stuck past the launch deadline (loops/launches.py)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "gpupool_launch_threads_stuck",
            "Launch threads of each node whose provider call has not returned past the launch deadline "
            f"(GPUPOOL_LAUNCH_DEADLINE_S); a node with {MAX_STUCK} of them is given no more launches "
            "until one returns. Nodes that never had one are left out.",
            labels=["node"])
        launches = self.rt.launches
        for node, count in sorted((launches.stuck() if launches is not None else {}).items()):
            family.add_metric([node], count)
        yield family


class PoolCollector(Collector):
    """Capacity, allocation, queue lengths and workload counts, computed when scraped."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        nodes = self.rt.nodes()
        capacity = GaugeMetricFamily("gpupool_device_capacity_devices", "Devices in the pool by model.",
                                     labels=["model", "simulated"])
        models: Counter[tuple[str, str]] = Counter()
        model_of: dict[tuple[str, int], str] = {}
        for n in nodes:
            for slot, d in enumerate(n.devices):
                models[(d.model, str(d.simulated).lower())] += 1
                model_of[(n.name, slot)] = d.model
        for (model, simulated), count in sorted(models.items()):
            capacity.add_metric([model, simulated], count)
        yield capacity
        with self.rt.store.read() as session:
            pods = session.execute(
                select(PodRow.node, PodRow.slices, WorkloadRow.tenant)
                .join(WorkloadRow, WorkloadRow.id == PodRow.workload_id)
                .where(PodRow.status.in_(ACTIVE_POD_STATES))
            ).all()
            by_status = session.execute(
                select(WorkloadRow.tenant, WorkloadRow.queue, WorkloadRow.status, func.count(),
                       func.sum(WorkloadRow.device_milli))
                .group_by(WorkloadRow.tenant, WorkloadRow.queue, WorkloadRow.status)
            ).all()
        waiting_milli = sum(int(milli or 0) for _, _, status, _, milli in by_status
                            if status == WorkloadStatus.PENDING.value)
        yield from _allocation(pods, model_of)
        yield from _workloads(by_status)
        yield from _idle_while_waiting(nodes, pods, waiting_milli)


def _allocation(pods: Any, model_of: dict[tuple[str, int], str]) -> Iterator[Metric]:
    allocated = GaugeMetricFamily("gpupool_device_allocated_devices",
                                  "Device share held by admitted and running work, by model and tenant.",
                                  labels=["model", "tenant"])
    share: Counter[tuple[str, str]] = Counter()
    for node, slices, tenant in pods:
        for s in slices:
            share[(model_of.get((node, s["device_index"]), "unknown"), tenant)] += s["compute_milli"]
    for (model, tenant), milli in sorted(share.items()):
        allocated.add_metric([model, tenant], milli / MILLI)
    yield allocated


def _idle_while_waiting(nodes: Any, pods: Any, waiting_milli: int) -> Iterator[Metric]:
    """What pending work asks for, and the free devices left idle while it waits: free share of
    healthy devices on schedulable nodes, up to what waits (a 2-device job waiting beside 8 free
    devices leaves 2 idle). Fragmentation, quotas, locality waits and reservations raise it; the
    replay reports its mean over a trace as `idle_while_waiting`."""
    usable = {(n.name, slot) for n in nodes if n.schedulable for slot, d in enumerate(n.devices) if d.healthy}
    held = sum(s["compute_milli"] for node, slices, _ in pods for s in slices
               if (node, s["device_index"]) in usable)
    free_milli = max(len(usable) * MILLI - held, 0)
    pending = GaugeMetricFamily("gpupool_queue_pending_devices",
                                "Devices (compute share) that pending workloads ask for, all pods together.")
    pending.add_metric([], waiting_milli / MILLI)
    yield pending
    idle = GaugeMetricFamily("gpupool_devices_idle_while_waiting",
                             "Free devices on healthy, schedulable nodes while work is pending, up to the "
                             "devices pending work asks for: 0 when nothing waits or nothing is free.")
    idle.add_metric([], min(free_milli, waiting_milli) / MILLI if waiting_milli else 0.0)
    yield idle


def _workloads(by_status: Any) -> Iterator[Metric]:
    states = GaugeMetricFamily("gpupool_workloads", "Workloads by status.", labels=["status"])
    queued = GaugeMetricFamily("gpupool_queue_pending_workloads", "Pending workloads by tenant and queue.",
                               labels=["tenant", "queue"])
    totals: Counter[str] = Counter()
    for tenant, queue, status, count, _ in by_status:
        totals[status] += int(count)
        if status == WorkloadStatus.PENDING.value:
            queued.add_metric([tenant, queue], int(count))
    for status in WorkloadStatus:
        states.add_metric([status.value], totals[status.value])
    yield states
    yield queued


def _full_template(scope: Any, template: str) -> str:
    """The route template with the prefixes of the routers it was included through."""
    path: str = scope.get("path", "")
    depth = template.count("/")
    parts = path.split("/")
    prefix = "/".join(parts[: max(0, len(parts) - depth)])
    return prefix + template


class RequestTimer:
    """Pure ASGI middleware timing every HTTP request by its route template."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None)
            template = "unmatched" if template is None else _full_template(scope, template)
            self.metrics.request_seconds.labels(scope["method"], template, str(status["code"])).observe(
                time.perf_counter() - start
            )
