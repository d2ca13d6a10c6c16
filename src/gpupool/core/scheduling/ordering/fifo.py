"""fifo: strict first-in first-out; a head that cannot start blocks its ClusterQueue."""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.core.model import Workload
from gpupool.core.scheduling.ordering.base import (
    OrderingContext,
    OrderingPolicy,
    fifo_key,
    register_ordering,
)


@register_ordering
class Fifo(OrderingPolicy):
    name = "fifo"
    summary = "Strict FIFO by submit time: nothing passes a stuck head except by backfill (Slurm-like)."
    strict = True

    def order(self, pending: Sequence[Workload], ctx: OrderingContext) -> list[Workload]:
        return sorted(pending, key=fifo_key)
