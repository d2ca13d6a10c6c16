"""drf: dominant-resource fair share across tenants, within each priority class (progressive filling)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import groupby

from gpupool.core.model import Workload
from gpupool.core.scheduling.ordering.base import (
    SHARE_RESOURCES,
    OrderingContext,
    OrderingPolicy,
    demand_of,
    fifo_key,
    register_ordering,
)


def dominant_share(usage: dict[str, float], ctx: OrderingContext, tenant: str) -> float:
    weight = ctx.tenant_weights.get(tenant, 1.0) or 1.0
    shares = [usage.get(r, 0.0) / ctx.capacity[r] for r in SHARE_RESOURCES if ctx.capacity.get(r)]
    return max(shares, default=0.0) / weight


@register_ordering
class Drf(OrderingPolicy):
    name = "drf"
    needs_usage = True
    summary = (
        "Dominant Resource Fairness: within a priority class, the tenant with the smallest weighted "
        "dominant share goes next; its share grows with each workload it is given."
    )

    def order(self, pending: Sequence[Workload], ctx: OrderingContext) -> list[Workload]:
        usage = {t: dict(u) for t, u in ctx.tenant_usage.items()}
        result: list[Workload] = []
        by_class = sorted(pending, key=lambda w: (-ctx.rank(w)[0], w.tenant, fifo_key(w)))
        for _, band in groupby(by_class, key=lambda w: ctx.rank(w)[0]):
            queues: dict[str, list[Workload]] = {}
            for w in band:
                queues.setdefault(w.tenant, []).append(w)
            for q in queues.values():
                q.sort(key=lambda w: (-ctx.rank(w)[1], *fifo_key(w)))
                q.reverse()  # pop() from the end takes the next one
            heap = [(dominant_share(usage.get(t, {}), ctx, t), t) for t in queues]
            heapq.heapify(heap)
            while heap:
                _, tenant = heapq.heappop(heap)
                w = queues[tenant].pop()
                result.append(w)
                mine = usage.setdefault(tenant, {})
                for r, a in demand_of(w).items():
                    mine[r] = mine.get(r, 0.0) + a
                if queues[tenant]:
                    heapq.heappush(heap, (dominant_share(mine, ctx, tenant), tenant))
        return result
