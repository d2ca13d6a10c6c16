"""Each service's history for its dashboard page: the sampler's points and the page's read.

Once a minute the history sampler (loops/history.py) records, per service <tenant>/<name>, its ready
and desired replicas from the store and, where a router serves (--serve-port), the requests per second,
requests in flight and latency the data plane loop saw at its last tick. Both routers time every
request (p50/p99: the in-process router itself, HAProxy through its request log, haproxy_log.py);
HAProxy's `show stat` mean of its last 1024 requests is kept too (`latency_mean_ms`), and where only
a mean is known it is shown as a mean, never as a quantile.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping

from sqlalchemy import select

from gpupool.api.services import ServiceEventOut, ServiceHistoryOut, ServiceHistorySeries, ServiceLive
from gpupool.errors import InvalidInput
from gpupool.server.auth import Principal
from gpupool.server.orm import HistoryRow, ServiceEventRow, ServiceReplicaRow, ServiceRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.history import MEAN_OF_MEASURED, RANGES, Point, bucket_means
from gpupool.server.serving.controller import FINAL
from gpupool.server.serving.services import visible

PREFIX = "svc_"
SERIES = ("ready", "desired", "requests_per_s", "in_flight", "latency_p50_ms", "latency_p99_ms",
          "latency_mean_ms")
LATENCY = MEAN_OF_MEASURED
"""Rolled up as the mean of the minutes that measured one (an idle minute has no latency, not 0)."""
EVENTS_SHOWN = 100


def points(rt: Runtime, live: Mapping[str, ServiceLive]) -> list[Point]:
    """This minute's points of every service (key <tenant>/<name>)."""
    with rt.store.read() as session:
        services = session.execute(select(ServiceRow.id, ServiceRow.tenant, ServiceRow.name,
                                          ServiceRow.desired).where(ServiceRow.state != "deleting")).all()
        ready: Counter[str] = Counter(session.scalars(
            select(ServiceReplicaRow.service_id)
            .join(WorkloadRow, WorkloadRow.id == ServiceReplicaRow.workload_id)
            .where(ServiceReplicaRow.ready == "ready", WorkloadRow.status.not_in(FINAL))))
    out: list[Point] = []
    for service_id, tenant, name, desired in sorted(services, key=lambda s: (s.tenant, s.name)):
        key = f"{tenant}/{name}"
        out += [Point(PREFIX + "ready", key, float(ready.get(service_id, 0))),
                Point(PREFIX + "desired", key, float(desired))]
        seen = live.get(key)
        if seen is None:
            continue
        out += [Point(PREFIX + "requests_per_s", key, seen.requests_per_s),
                Point(PREFIX + "in_flight", key, float(seen.in_flight))]
        latency = (("latency_p50_ms", seen.latency_p50_ms), ("latency_p99_ms", seen.latency_p99_ms),
                   ("latency_mean_ms", seen.latency_mean_ms))
        for series, value in latency:
            if value is not None:
                out.append(Point(PREFIX + series, key, value))
    return out


def query(rt: Runtime, who: Principal, name: str, tenant: str | None, range_: str, now: float,
          live: Mapping[str, ServiceLive] | None, router: str) -> ServiceHistoryOut:
    """The service page: its series over `range_`, its live numbers and its last scale events. A
    tenant reads its own services only (another's is NotFound, as everywhere)."""
    if range_ not in RANGES:
        raise InvalidInput(f"Unknown range {range_!r}; use one of {', '.join(RANGES)}.", field="range")
    span, width, step = RANGES[range_]
    since = now - span
    with rt.store.read() as session:
        row = visible(session, who, name, tenant)
        key = f"{row.tenant}/{row.name}"
        times = sorted(set(session.scalars(select(HistoryRow.at_s).where(
            HistoryRow.series == "capacity", HistoryRow.step_s == step, HistoryRow.at_s >= since))))
        found = session.execute(select(HistoryRow.series, HistoryRow.at_s, HistoryRow.value).where(
            HistoryRow.key == key, HistoryRow.series.in_([PREFIX + s for s in SERIES]),
            HistoryRow.step_s == step, HistoryRow.at_s >= since)).all()
        events = [ServiceEventOut(reason=e.reason, message=e.message, at_s=e.at_s) for e in reversed(
            session.scalars(select(ServiceEventRow).where(ServiceEventRow.service_id == row.id,
                                                          ServiceEventRow.at_s >= since)
                            .order_by(ServiceEventRow.id.desc()).limit(EVENTS_SHOWN)).all())]
    values: dict[str, dict[float, float]] = defaultdict(dict)
    for series, at_s, value in found:
        values[series][at_s] = value
    out = []
    for s in SERIES:
        by_time = values.get(PREFIX + s, {})
        if PREFIX + s in LATENCY:  # only the minutes that measured it
            out.append(ServiceHistorySeries(name=s, values=bucket_means(sorted(by_time), by_time, width)))
        elif by_time or s in ("ready", "desired"):
            out.append(ServiceHistorySeries(name=s, values=bucket_means(times, by_time, width)))
    seen = None if live is None else live.get(key)
    quantiles = any(s.name == "latency_p50_ms" and s.values for s in out)
    if seen is not None and (seen.latency_p50_ms is not None or seen.latency_mean_ms is not None):
        quantiles = seen.latency_p50_ms is not None  # what the router measures now decides
    mean_only = not quantiles and (router == "haproxy" or any(s.name == "latency_mean_ms" and s.values
                                                             for s in out))
    return ServiceHistoryOut(service=key, range=range_, step_s=width, since_s=since, now_s=now, router=router,
                             latency="mean" if mean_only else "quantiles", live=seen,
                             series=[s for s in out if s.values or s.name in ("ready", "desired")],
                             events=events)
