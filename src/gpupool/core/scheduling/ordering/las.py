"""las: least attained service first (Tiresias' discretised 2D-LAS), within each priority class."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from gpupool.core.model import Workload
from gpupool.core.scheduling.ordering.base import (
    OrderingContext,
    OrderingPolicy,
    fifo_key,
    register_ordering,
)

DEFAULT_THRESHOLDS_DEVICE_S = (3_600.0, 36_000.0)
"""Queue boundaries in device-seconds of attained service (1 and 10 device-hours)."""


@register_ordering
class LeastAttainedService(OrderingPolicy):
    name = "las"
    banded = True
    summary = (
        "Tiresias-style: workloads that have received the least device-time so far go first, "
        "bucketed into queues (1 and 10 device-hours) with FIFO inside a queue."
    )

    def __init__(self, thresholds_device_s: Sequence[float] = DEFAULT_THRESHOLDS_DEVICE_S) -> None:
        self.thresholds = sorted(thresholds_device_s)

    def queue_of(self, w: Workload, ctx: OrderingContext) -> int:
        return bisect.bisect_right(self.thresholds, ctx.attained_service_s(w))

    def order(self, pending: Sequence[Workload], ctx: OrderingContext) -> list[Workload]:
        return sorted(pending, key=lambda w: (-ctx.rank(w)[0], self.queue_of(w, ctx), *fifo_key(w)))
