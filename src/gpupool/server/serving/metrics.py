"""/metrics for inference services: replicas by readiness and desired counts, per service."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import select

from gpupool.server.orm import ServiceReplicaRow, ServiceRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.serving.controller import FINAL

READINESS = ("starting", "ready", "unready", "draining")


class ServiceCollector(Collector):
    """Computed when scraped: one row read per service and per live replica."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        replicas = GaugeMetricFamily(
            "gpupool_service_replicas", "Live replicas of each service (TENANT/NAME) by readiness: starting "
            "(no probe passed yet), ready (serving), unready (its readiness probe fails), draining.",
            labels=["service", "state"])
        desired = GaugeMetricFamily("gpupool_service_desired_replicas",
                                    "The replicas each service should have (clamped to its min and max).",
                                    labels=["service"])
        degraded = GaugeMetricFamily("gpupool_service_degraded",
                                     "1 while a service is degraded (a probe does not pass, or a replica "
                                     "cannot be created), else 0.", labels=["service"])
        with self.rt.store.read() as session:
            services = session.execute(select(ServiceRow.id, ServiceRow.tenant, ServiceRow.name,
                                              ServiceRow.desired, ServiceRow.state)).all()
            counts: Counter[tuple[str, str]] = Counter((sid, ready) for sid, ready in session.execute(
                select(ServiceReplicaRow.service_id, ServiceReplicaRow.ready)
                .join(WorkloadRow, WorkloadRow.id == ServiceReplicaRow.workload_id)
                .where(WorkloadRow.status.not_in(FINAL))))
        for service_id, tenant, name, want, state in sorted(services, key=lambda s: (s.tenant, s.name)):
            label = f"{tenant}/{name}"
            for readiness in READINESS:
                replicas.add_metric([label, readiness], counts.get((service_id, readiness), 0))
            desired.add_metric([label], want)
            degraded.add_metric([label], 1 if state == "degraded" else 0)
        yield replicas
        yield desired
        yield degraded
