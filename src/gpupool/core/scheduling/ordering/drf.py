"""drf: dominant-resource fair share across tenants, within each priority class (progressive filling)."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from itertools import groupby
from operator import attrgetter, itemgetter
from typing import Any

from gpupool.core.model import Workload
from gpupool.core.priority import Rank
from gpupool.core.scheduling.ordering.base import (
    SHARE_RESOURCES,
    OrderingContext,
    OrderingPolicy,
    OrderStream,
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

    banded = True
    keep_order = True
    """Keep the sorted keys of the pending workloads across cycles (`ctx.memo`) and merge in what
    arrived, instead of sorting the whole queue again; False sorts afresh (the same order)."""

    def order(self, pending: Sequence[Workload], ctx: OrderingContext) -> list[Workload]:
        stream = self.stream(pending, ctx)
        out = []
        while (w := stream.next_workload()) is not None:
            out.append(w)
        return out

    def stream(self, pending: Sequence[Workload], ctx: OrderingContext) -> OrderStream:
        rank = ctx.rank
        caps = [(r, ctx.capacity[r]) for r in SHARE_RESOURCES if ctx.capacity.get(r)]
        # Each tenant's usage of the resources with a capacity, in `caps` order (the same sums,
        # in the same order, as `dominant_share` over a usage dict: the shares are identical).
        # One sort gives the priority bands, the tenants in each, and each tenant's own order.
        keyed = _sorted_keys(pending, rank, ctx.memo.setdefault(self.name, {}) if self.keep_order else {})
        tenants = {item[1] for item in keyed}
        weights = {t: _weight(ctx, t) for t in tenants}
        # Copied now (only the tenants that wait: no other share is read): the caller may change
        # the tenants' usage while it consumes the order.
        held = ctx.tenant_usage
        usage = {t: [held[t].get(r, 0.0) for r, _ in caps] for t in tenants if t in held}
        bands = [[item[1:] for item in band] for _, band in groupby(keyed, key=itemgetter(0))]
        return _DrfStream(bands, usage, caps, weights, ctx.demand)


_Key = tuple[int, str, int, float, str, Workload]


def _sorted_keys(
    pending: Sequence[Workload], rank: Callable[[Workload], Rank], memo: dict[str, Any]
) -> list[_Key]:
    """Every pending workload as (-class value, tenant, -priority, submit time, id, workload), sorted.

    The keys sorted on the last call are kept in `memo`: those still pending (the same workload
    objects) keep their order and the new ones are sorted and merged in (two sorted runs: one
    linear merge), so a queue of thousands is not sorted again for each arrival. Ids are unique,
    so the order is the one a full sort gives.
    """
    current = dict(zip(map(_id, pending), pending, strict=True))
    before: list[_Key] = memo.get("sorted", [])
    kept = [k for k in before if current.get(k[4]) is k[5]]
    if len(kept) == len(current):
        fresh: list[_Key] = []
    else:
        held = {k[4] for k in kept}
        fresh = sorted(
            (-(rk := rank(w))[0], w.tenant, -rk[1], w.submit_time_s, wid, w)
            for wid, w in current.items()
            if wid not in held
        )
    keyed = sorted(kept + fresh) if fresh and kept else kept or fresh
    memo["sorted"] = keyed
    return keyed


_id = attrgetter("id")


class _DrfStream(OrderStream):
    """Progressive filling, band by band: the tenant with the smallest weighted dominant share goes
    next, and its usage grows by what it is given (a band starts from the usage the bands before it
    reached; a skipped rest of a band adds its demand all the same)."""

    def __init__(
        self,
        bands: list[list[tuple[Any, ...]]],
        usage: dict[str, list[float]],
        caps: list[tuple[str, float]],
        weights: dict[str, float],
        demand: Callable[[Workload], Mapping[str, float]],
    ) -> None:
        self.bands = bands
        self.usage = usage
        self.caps = caps
        self.weights = weights
        self.demand = demand
        self.next_band = 0
        self.queues: dict[str, list[Workload]] = {}
        self.heap: list[tuple[float, str]] = []
        self.last: str | None = None
        """The band's last tenant with work left (its rest goes in its own order, no shares)."""

    def _add(self, tenant: str, w: Workload) -> None:
        mine = self.usage[tenant]
        asked = self.demand(w)
        for i, (r, _) in enumerate(self.caps):
            mine[i] += asked.get(r, 0.0)

    def _open_band(self) -> bool:
        if self.next_band >= len(self.bands):
            return False
        band = self.bands[self.next_band]
        self.next_band += 1
        queues: dict[str, list[Workload]] = {}
        for item in band:
            queues.setdefault(item[0], []).append(item[4])
        for q in queues.values():
            q.reverse()  # pop() from the end takes the next one
        heap = []
        for t in queues:
            mine = self.usage.setdefault(t, [0.0] * len(self.caps))
            heap.append((_share(mine, self.caps, self.weights[t]), t))
        heapq.heapify(heap)
        self.queues, self.heap, self.last = queues, heap, None
        return True

    def next_workload(self) -> Workload | None:
        while True:
            if self.last is not None:
                q = self.queues[self.last]
                if q:
                    w = q.pop()
                    self._add(self.last, w)
                    return w
                self.last = None
            if self.heap:
                _, tenant = heapq.heappop(self.heap)
                q = self.queues[tenant]
                w = q.pop()
                self._add(tenant, w)
                if q and self.heap:
                    share = _share(self.usage[tenant], self.caps, self.weights[tenant])
                    heapq.heappush(self.heap, (share, tenant))
                elif q:
                    self.last = tenant
                return w
            if not self._open_band():
                return None

    def skip_band(self) -> list[Workload]:
        rest: list[Workload] = []
        for tenant, q in self.queues.items():
            for w in reversed(q):
                self._add(tenant, w)  # integer-valued sums: exact in any order
                rest.append(w)
            q.clear()
        self.heap, self.last = [], None
        return rest


def _weight(ctx: OrderingContext, tenant: str) -> float:
    return ctx.tenant_weights.get(tenant, 1.0) or 1.0


def _share(used: list[float], caps: list[tuple[str, float]], weight: float) -> float:
    """`dominant_share` on a usage list aligned with `caps`."""
    return max([u / c for u, (_, c) in zip(used, caps, strict=True)], default=0.0) / weight
