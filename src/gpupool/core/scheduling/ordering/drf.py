"""drf: dominant-resource fair share across tenants, within each priority class (progressive filling)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import groupby
from operator import itemgetter

from gpupool.core.model import Workload
from gpupool.core.scheduling.ordering.base import (
    SHARE_RESOURCES,
    OrderingContext,
    OrderingPolicy,
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
        rank = ctx.rank
        demand = ctx.demand
        caps = [(r, ctx.capacity[r]) for r in SHARE_RESOURCES if ctx.capacity.get(r)]
        # Each tenant's usage of the resources with a capacity, in `caps` order (the same sums,
        # in the same order, as `dominant_share` over a usage dict: the shares are identical).
        usage = {t: [u.get(r, 0.0) for r, _ in caps] for t, u in ctx.tenant_usage.items()}
        # One sort gives the priority bands, the tenants in each, and each tenant's own order.
        keyed = sorted(
            (-(rk := rank(w))[0], w.tenant, -rk[1], w.submit_time_s, w.id, w) for w in pending
        )
        result: list[Workload] = []
        for _, band in groupby(keyed, key=itemgetter(0)):
            queues: dict[str, list[Workload]] = {}
            for item in band:
                queues.setdefault(item[1], []).append(item[5])
            for q in queues.values():
                q.reverse()  # pop() from the end takes the next one
            heap = []
            for t in queues:
                mine = usage.setdefault(t, [0.0] * len(caps))
                heap.append((_share(mine, caps, _weight(ctx, t)), t))
            heapq.heapify(heap)
            while heap:
                _, tenant = heapq.heappop(heap)
                q = queues[tenant]
                w = q.pop()
                result.append(w)
                mine = usage[tenant]
                asked = demand(w)
                for i, (r, _) in enumerate(caps):
                    mine[i] += asked.get(r, 0.0)
                if q and heap:
                    heapq.heappush(heap, (_share(mine, caps, _weight(ctx, tenant)), tenant))
                elif q:  # the last tenant of the band: the rest is its own order (shares unneeded)
                    heap.append((0.0, tenant))
        return result


def _weight(ctx: OrderingContext, tenant: str) -> float:
    return ctx.tenant_weights.get(tenant, 1.0) or 1.0


def _share(used: list[float], caps: list[tuple[str, float]], weight: float) -> float:
    """`dominant_share` on a usage list aligned with `caps`."""
    return max([u / c for u, (_, c) in zip(used, caps, strict=True)], default=0.0) / weight
