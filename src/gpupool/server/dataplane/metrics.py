"""/metrics for services: requests per second, in flight, latency and cold starts as the router sees them."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.server.dataplane.loop import DataPlaneLoop


class ServiceTrafficCollector(Collector):
    """Read from the data plane loop's last tick (never from the router at scrape time)."""

    def __init__(self, loop: DataPlaneLoop) -> None:
        self.loop = loop

    def collect(self) -> Iterator[Metric]:
        rates = dict(self.loop.rates)
        rps = GaugeMetricFamily("gpupool_service_requests_per_second",
                                "Requests answered per second over the last second, per service.",
                                labels=["service"])
        in_flight = GaugeMetricFamily("gpupool_service_requests_in_flight",
                                      "Requests at a replica, queued or held for a cold start, per service.",
                                      labels=["service"])
        latency = GaugeMetricFamily("gpupool_service_latency_seconds",
                                    "Request latency through the router: p50 and p99 of each request's time "
                                    "(HAProxy: from its request log), and HAProxy's mean of its last "
                                    "1024 requests, per service.",
                                    labels=["service", "quantile"])
        cold = CounterMetricFamily("gpupool_service_cold_starts", "Scale-from-zero cold starts, per service.",
                                   labels=["service"])
        for service, r in sorted(rates.items()):
            t = r.traffic
            rps.add_metric([service], r.requests_per_s)
            in_flight.add_metric([service], t.in_flight)
            quantiles = (("0.5", t.latency_p50_ms), ("0.99", t.latency_p99_ms), ("mean", t.latency_avg_ms))
            for q, value in quantiles:
                if value is not None:
                    latency.add_metric([service, q], value / 1000)
            cold.add_metric([service], t.cold_starts)
        yield from (rps, in_flight, latency, cold)
