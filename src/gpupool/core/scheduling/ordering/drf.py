"""drf: dominant-resource fair share across tenants, within each priority class (progressive filling)."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import add, truediv

from gpupool.core.model import Workload
from gpupool.core.priority import Rank
from gpupool.core.scheduling.ordering.base import (
    SHARE_RESOURCES,
    OrderingContext,
    OrderingPolicy,
    OrderStream,
    PendingChanges,
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
        caps = [(r, ctx.capacity[r]) for r in SHARE_RESOURCES if ctx.capacity.get(r)]
        # Each tenant's usage of the resources with a capacity, in `caps` order (the same sums,
        # in the same order, as `dominant_share` over a usage dict: the shares are identical).
        # The book gives the priority bands, the tenants in each, and each tenant's own order.
        book = ctx.memo.setdefault(self.name, {}).setdefault("book", _Book()) if self.keep_order else _Book()
        book.update(pending, ctx.rank, ctx.demand, ctx.changes)
        bands = [book.bands[b] for b in sorted(book.bands)]
        tenants = {t for band in bands for t in band}
        weights = {t: _weight(ctx, t) for t in tenants}
        # Copied now (only the tenants that wait: no other share is read): the caller may change
        # the tenants' usage while it consumes the order.
        held = ctx.tenant_usage
        usage = {t: [held[t].get(r, 0.0) for r, _ in caps] for t in tenants if t in held}
        index = [SHARE_RESOURCES.index(r) for r, _ in caps]
        return _DrfStream(bands, usage, caps, weights, ctx.demand, index)


_Key = tuple[int, float, str]
"""A workload's place in its tenant's queue within a band: (-priority, submit time, id)."""


@dataclass(slots=True)
class _TenantQueue:
    """One tenant's waiting workloads of one band, in order, and the sum of their demands."""

    keys: list[_Key] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)
    asked: list[list[float]] = field(default_factory=list)
    """Each one's demand per `SHARE_RESOURCES` (aligned with `workloads`)."""
    total: list[float] = field(default_factory=lambda: [0.0] * len(SHARE_RESOURCES))
    """Per `SHARE_RESOURCES`: integer-valued sums, exact whatever the order of additions."""


@dataclass(slots=True)
class _Book:
    """The pending workloads by band (-class value) and tenant, each queue sorted: what a full sort
    of (-class value, tenant, -priority, submit time, id) gives, kept across cycles.

    `update` compares the pending list with the one before by identity (in C) and moves only the
    arrivals and departures, so a queue of thousands is not sorted (nor walked) again per event.
    Ids are unique in a pending list, so the order is the full sort's.
    """

    bands: dict[int, dict[str, _TenantQueue]] = field(default_factory=dict)
    held: dict[int, tuple[Workload, int, str, _Key, list[float]]] = field(default_factory=dict)
    """By `id()`: each workload listed last, with its band, tenant, key and demand."""
    serial: int = -1
    """The `PendingChanges.serial` of the list the book holds (-1: none known)."""

    def update(
        self,
        pending: Sequence[Workload],
        rank: Callable[[Workload], Rank],
        demand: Callable[[Workload], Mapping[str, float]],
        changes: PendingChanges | None = None,
    ) -> None:
        """Hold `pending`: moved by `changes` when they follow the list held, else by comparing."""
        held = self.held
        if changes is not None and changes.serial == self.serial + 1:
            gone_ids = [id(w) for w in changes.departed]
            current = {id(w): w for w in changes.arrived}
        else:
            current = dict(zip(map(id, pending), pending, strict=True))
            gone_ids = list(held.keys() - current.keys())
        self.serial = -1 if changes is None else changes.serial
        for gone in gone_ids:
            w, band, tenant, key, asked = held.pop(gone)
            queue = self.bands[band][tenant]
            at = bisect.bisect_left(queue.keys, key)
            while queue.workloads[at] is not w:
                at += 1
            del queue.keys[at]
            del queue.workloads[at]
            del queue.asked[at]
            if not queue.keys:
                del self.bands[band][tenant]
                if not self.bands[band]:
                    del self.bands[band]
                continue
            total = queue.total
            for i, a in enumerate(asked):
                total[i] -= a
        arrived = []
        # those not held yet: a few arrivals are looked up one by one, rather than by a set
        # difference that walks every workload held (the order is the sort's below either way)
        few = len(current) < len(held)
        fresh = [k for k in current if k not in held] if few else current.keys() - held.keys()
        for new in fresh:
            w = current[new]
            rk = rank(w)
            arrived.append((-rk[0], w.tenant, (-rk[1], w.submit_time_s, w.id), new, w))
        arrived.sort()  # in order, so a queue built from nothing grows at its end
        for band, tenant, key, new, w in arrived:
            found = demand(w)
            asked = [found.get(r, 0.0) for r in SHARE_RESOURCES]
            held[new] = (w, band, tenant, key, asked)
            tenants = self.bands.setdefault(band, {})
            into = tenants.get(tenant)
            if into is None:
                into = tenants[tenant] = _TenantQueue()
            at = bisect.bisect_right(into.keys, key)
            into.keys.insert(at, key)
            into.workloads.insert(at, w)
            into.asked.insert(at, asked)
            total = into.total
            for i, a in enumerate(asked):
                total[i] += a


class _DrfStream(OrderStream):
    """Progressive filling, band by band: the tenant with the smallest weighted dominant share goes
    next, and its usage grows by what it is given (a band starts from the usage the bands before it
    reached; a skipped rest of a band adds its demand all the same)."""

    unroll = True
    """With every share resource's capacity known, add a demand and compute the share on three
    names rather than through `_add` and `_share` (the same floats, faster: False keeps the calls)."""

    def __init__(
        self,
        bands: list[dict[str, _TenantQueue]],
        usage: dict[str, list[float]],
        caps: list[tuple[str, float]],
        weights: dict[str, float],
        demand: Callable[[Workload], Mapping[str, float]],
        index: list[int],
    ) -> None:
        self.bands = bands
        self.usage = usage
        self.caps = caps
        self.weights = weights
        self.demand = demand
        self.index = index
        """Where each of `caps` is in `SHARE_RESOURCES` (a `_TenantQueue.total`)."""
        self.next_band = 0
        self.queues: dict[str, list[Workload]] = {}
        self.asks: dict[str, list[list[float]]] = {}
        """Each one's demand per `SHARE_RESOURCES`, aligned with `queues`."""
        self.limits = [c for _, c in caps]
        self.whole = index == list(range(len(SHARE_RESOURCES)))
        """Whether every share resource has a capacity (then a demand adds as it is)."""
        self.three = self.whole and len(SHARE_RESOURCES) == 3 and self.unroll
        """Whether `next_workload` may add and divide the three resources unrolled."""
        self.opened: dict[str, list[float]] = {}
        """Each tenant's usage when the band opened (its usage once the band is given out:
        this plus the band's total demand)."""
        self.band: dict[str, _TenantQueue] = {}
        self.heap: list[tuple[float, str]] = []
        self.last: str | None = None
        """The band's last tenant with work left (its rest goes in its own order, no shares)."""

    def _add(self, tenant: str, asked: list[float]) -> None:
        mine = self.usage[tenant]
        if self.whole:
            mine[:] = map(add, mine, asked)
        else:
            for k, i in enumerate(self.index):
                mine[k] += asked[i]

    def _share(self, tenant: str) -> float:
        """`dominant_share` on the tenant's usage list (the same divisions, in C)."""
        return max(map(truediv, self.usage[tenant], self.limits), default=0.0) / self.weights[tenant]

    def _open_band(self) -> bool:
        if self.next_band >= len(self.bands):
            return False
        band = self.band = self.bands[self.next_band]
        self.next_band += 1
        # each tenant's queue reversed (pop() from the end takes the next one), tenants in order
        queues = {t: band[t].workloads[::-1] for t in sorted(band)}
        self.asks = {t: band[t].asked[::-1] for t in queues}
        heap = []
        opened = {}
        for t in queues:
            mine = self.usage.setdefault(t, [0.0] * len(self.caps))
            opened[t] = list(mine)
            heap.append((self._share(t), t))
        heapq.heapify(heap)
        self.queues, self.heap, self.last, self.opened = queues, heap, None, opened
        return True

    def next_workload(self) -> Workload | None:
        while True:
            last = self.last
            if last is not None:
                q = self.queues[last]
                if q:
                    w = q.pop()
                    self._add(last, self.asks[last].pop())
                    return w
                self.last = None
            heap = self.heap
            if heap:
                tenant = heap[0][1]
                q = self.queues[tenant]
                w = q.pop()
                if q and len(heap) > 1:  # back in line by its new share (one sift: the same heap order)
                    if self.three:  # `_add` and `_share` unrolled: the same additions and divisions
                        mine = self.usage[tenant]
                        a0, a1, a2 = self.asks[tenant].pop()
                        u0, u1, u2 = mine[0] + a0, mine[1] + a1, mine[2] + a2
                        mine[0], mine[1], mine[2] = u0, u1, u2
                        l0, l1, l2 = self.limits
                        share = max(u0 / l0, u1 / l1, u2 / l2) / self.weights[tenant]
                    else:
                        self._add(tenant, self.asks[tenant].pop())
                        share = self._share(tenant)
                    heapq.heapreplace(heap, (share, tenant))
                else:
                    self._add(tenant, self.asks[tenant].pop())
                    heapq.heappop(heap)
                    if q:
                        self.last = tenant
                return w
            if not self._open_band():
                return None

    def skip_band(self) -> list[Workload]:
        rest: list[Workload] = []
        for tenant, q in self.queues.items():
            if not q:
                continue
            rest.extend(reversed(q))
            q.clear()
            self.asks[tenant].clear()
            # what adding each one's demand gives (integer-valued sums: exact in any order)
            mine, before, total = self.usage[tenant], self.opened[tenant], self.band[tenant].total
            for k, i in enumerate(self.index):
                mine[k] = before[k] + total[i]
        self.heap, self.last = [], None
        return rest


def _weight(ctx: OrderingContext, tenant: str) -> float:
    return ctx.tenant_weights.get(tenant, 1.0) or 1.0
