"""The usage counters at /metrics: device-seconds and device memory GiB-seconds by tenant and model.

Cheap at scrape time: pods that ended before a watermark (a minute ago) are added to kept totals
once (read through the index on `pods.finished_s`), and only the pods still running or ended since
are metered afresh; so a scrape reads what changed, not the whole history.

A pod may be closed late, at an end already behind the watermark: recovery (after a restart, or a
takeover in a follower's running process, scraped all along) closes a stopping pod at the time the
provider says it ended. So the collector remembers the pods it read running, and reads again by id
those no longer running: each joins the kept totals once at its recorded end, whatever that end.

A counter never goes down (a decrease reads as a reset): a pod closed late at an end before the
last scrape was counted up to that scrape, more than it held, and that cannot be taken back. Each
series says the largest figure it has said, so it holds still until the usage metered from the pod
rows (what `gpupool usage` bills) passes that figure, and from then on says the metered usage again.
The same holds when a series' pods leave the pod rows (a deleted tenant's last pods).
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
        self._open_ids: frozenset[str] = frozenset()
        """The pods read running at the last scrape (any closed since is read again by id)."""
        self._said: dict[Key, tuple[float, float]] = {}
        """Each series' largest figures said so far (device-seconds, GiB-seconds): never less again."""

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        now = self.rt.clock()
        devices = device_map(self.rt.nodes())
        with self._lock:
            device_s, memory_gib_s = self._never_less(*self._advance(now, devices))
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
        """Fold the pods that ended before the new watermark (and those read running last time that
        were closed behind it) into the kept totals; return those totals plus the pods still running
        or ended since."""
        mark = now - SETTLE_S
        with self.rt.store.read() as session:
            # the running ones first, so a pod closed between the reads is never missed: it is in both
            # (the later reading wins), or read running now and read again by id next time
            still: Sequence[Any] = session.execute(
                _ROWS.where(PodRow.finished_s.is_(None), PodRow.status.in_(_OPEN))).all()
            ended = list(session.execute(_ROWS.where(PodRow.finished_s > self._watermark)).all())
            closed = sorted(self._open_ids - {row.id for row in still})
            for at in range(0, len(closed), IDS_PER_QUERY):
                ended += session.execute(_ROWS.where(PodRow.id.in_(closed[at:at + IDS_PER_QUERY]),
                                                     PodRow.finished_s <= self._watermark)).all()
        later = []
        for row in ended:
            if row.finished_s <= mark:
                _add(self._device_s, self._memory_gib_s, row, row.finished_s - row.started_s, devices)
            else:
                later.append(row)
        device_s, memory_gib_s = defaultdict(float, self._device_s), defaultdict(float, self._memory_gib_s)
        for row in later:
            _add(device_s, memory_gib_s, row, row.finished_s - row.started_s, devices)
        gone = {row.id for row in ended}
        running = [row for row in still if row.id not in gone]
        for row in running:
            _add(device_s, memory_gib_s, row, now - row.started_s, devices)
        self._open_ids = frozenset(row.id for row in running)
        self._watermark = max(self._watermark, mark)
        return device_s, memory_gib_s

    def _never_less(self, device_s: Totals, memory_gib_s: Totals) -> tuple[Totals, Totals]:
        """The metered totals, each series kept at least at what it said before (module docstring)."""
        for key in device_s.keys() | self._said.keys():
            said = self._said.get(key, (0.0, 0.0))
            self._said[key] = (max(device_s[key], said[0]), max(memory_gib_s[key], said[1]))
            device_s[key], memory_gib_s[key] = self._said[key]
        return device_s, memory_gib_s


_ROWS = (select(PodRow.id, PodRow.node, PodRow.slices, PodRow.models, PodRow.started_s, PodRow.finished_s,
                WorkloadRow.tenant)
         .join(WorkloadRow, WorkloadRow.id == PodRow.workload_id).where(PodRow.started_s.is_not(None)))
IDS_PER_QUERY = 500


def _add(device_s: Totals, memory_gib_s: Totals, row: Any, seconds: float, devices: Devices) -> None:
    for s in held(row.node, row.slices, devices, row.models):
        key = (row.tenant, s.model, str(s.simulated).lower())
        device_s[key] += s.compute_milli / 1000.0 * max(0.0, seconds)
        memory_gib_s[key] += s.memory_mib / 1024.0 * max(0.0, seconds)
