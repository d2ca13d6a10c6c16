"""The usage counters at /metrics: device-seconds and device memory GiB-seconds by tenant and model.

Cheap at scrape time: pods that ended before a watermark (a minute ago) are added to kept totals
once (read through the index on `pods.finished_s`), and only the pods still running or ended since
are metered afresh; so a scrape reads what changed, not the whole history.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import select

from gpupool.server.orm import PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.metering import Devices, device_map, held
from gpupool.server.states import PodState

SETTLE_S = 60.0
"""A pod that ended this long ago is in the kept totals (its row committed long since)."""
_OPEN = (PodState.LAUNCHING.value, PodState.RUNNING.value, PodState.STOPPING.value)
Key = tuple[str, str, str]
Totals = defaultdict[Key, float]


class UsageCollector(Collector):
    """gpupool_device_seconds_total and gpupool_device_memory_gib_seconds_total{tenant,model,simulated}."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._lock = threading.Lock()
        self._watermark = 0.0
        self._device_s: Totals = defaultdict(float)
        self._memory_gib_s: Totals = defaultdict(float)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        now = self.rt.clock()
        devices = device_map(self.rt.nodes())
        with self._lock:
            device_s, memory_gib_s = self._advance(now, devices)
        seconds = CounterMetricFamily("gpupool_device_seconds",
                                      "Device compute held, in whole-device seconds (a 0.25 slice for 4 s "
                                      "is 1), by tenant and device model.",
                                      labels=["tenant", "model", "simulated"])
        memory = CounterMetricFamily("gpupool_device_memory_gib_seconds",
                                     "Device memory held, in GiB-seconds, by tenant and device model.",
                                     labels=["tenant", "model", "simulated"])
        for key in sorted(device_s):
            seconds.add_metric(list(key), device_s[key])
            memory.add_metric(list(key), memory_gib_s[key])
        yield seconds
        yield memory

    def _advance(self, now: float, devices: Devices) -> tuple[Totals, Totals]:
        """Fold the pods that ended before the new watermark into the kept totals; return those totals
        plus the pods still open or ended since."""
        mark = now - SETTLE_S
        base = (select(PodRow.node, PodRow.slices, PodRow.models, PodRow.started_s, PodRow.finished_s,
                       WorkloadRow.tenant)
                .join(WorkloadRow, WorkloadRow.id == PodRow.workload_id).where(PodRow.started_s.is_not(None)))
        with self.rt.store.read() as session:
            ended: Sequence[Any] = session.execute(base.where(PodRow.finished_s > self._watermark)).all()
            still: Sequence[Any] = session.execute(
                base.where(PodRow.finished_s.is_(None), PodRow.status.in_(_OPEN))).all()
        later = []
        for node, slices, models, start, end, tenant in ended:
            if end <= mark:
                _add(self._device_s, self._memory_gib_s, tenant, node, slices, models, end - start, devices)
            else:
                later.append((node, slices, models, start, end, tenant))
        device_s, memory_gib_s = defaultdict(float, self._device_s), defaultdict(float, self._memory_gib_s)
        for node, slices, models, start, end, tenant in later:
            _add(device_s, memory_gib_s, tenant, node, slices, models, end - start, devices)
        for node, slices, models, start, _, tenant in still:
            _add(device_s, memory_gib_s, tenant, node, slices, models, now - start, devices)
        self._watermark = max(self._watermark, mark)
        return device_s, memory_gib_s


def _add(device_s: Totals, memory_gib_s: Totals, tenant: str, node: str,
         slices: list[dict[str, int]], models: list[dict[str, Any]] | None, seconds: float,
         devices: Devices) -> None:
    for s in held(node, slices, devices, models):
        key = (tenant, s.model, str(s.simulated).lower())
        device_s[key] += s.compute_milli / 1000.0 * max(0.0, seconds)
        memory_gib_s[key] += s.memory_mib / 1024.0 * max(0.0, seconds)
