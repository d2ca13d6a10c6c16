"""priority-fifo: highest priority class first, then oldest first; a stuck workload is skipped."""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.core.model import Workload
from gpupool.core.scheduling.ordering.base import OrderingContext, OrderingPolicy, register_ordering


@register_ordering
class PriorityFifo(OrderingPolicy):
    name = "priority-fifo"
    banded = True
    summary = "Priority class, then priority, then submit time; workloads that do not fit are skipped."

    def order(self, pending: Sequence[Workload], ctx: OrderingContext) -> list[Workload]:
        rank = ctx.rank
        return sorted(pending, key=lambda w: (-rank(w)[0], -rank(w)[1], w.submit_time_s, w.id))
