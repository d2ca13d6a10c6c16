"""What a replay's work cost: each run's held slices metered as intervals, priced by `core.metering`
(the same arithmetic as the server's bills), per tenant, pooled and on dedicated whole devices.

The meter only watches: the replay's decisions are the same with or without it.
"""

from __future__ import annotations

from typing import Any

from gpupool.core.metering import HeldSlice, PodInterval, PriceBook, UsageKey, aggregate, totals
from gpupool.core.model import Node, Workload


class CostMeter:
    """Open runs by workload; `stop` closes one into an interval (a preempted run is its own)."""

    def __init__(self, nodes: tuple[Node, ...]) -> None:
        self.nodes = nodes
        self.open: dict[str, tuple[float, Workload, tuple[tuple[str, tuple[HeldSlice, ...]], ...]]] = {}
        self.intervals: list[PodInterval] = []

    def start(self, workload: Workload, allocs: Any, now_s: float) -> None:
        held = []
        for _, alloc in allocs:
            node = self.nodes[alloc.node]
            parts = zip(alloc.devices, alloc.device_milli, alloc.device_memory_mib, strict=True)
            slices = tuple(HeldSlice(node.devices[d].model, milli, memory, max(node.devices[d].memory_mib, 0),
                                     node.devices[d].simulated) for d, milli, memory in parts)
            held.append((node.name, slices))
        self.open[workload.id] = (now_s, workload, tuple(held))

    def stop(self, workload_id: str, now_s: float) -> None:
        run = self.open.pop(workload_id, None)
        if run is None:
            return
        start, w, held = run
        for rank, (node, slices) in enumerate(held):
            self.intervals.append(PodInterval(f"{w.id}-{len(self.intervals)}-r{rank}", w.tenant, w.queue,
                                              w.priority_class, node, start, now_s, slices))

    def close_all(self, now_s: float) -> None:
        """Runs still open when the replay ends are metered to its end."""
        for workload_id in sorted(self.open):
            self.stop(workload_id, now_s)

    def report(self, book: PriceBook) -> dict[str, Any]:
        """Cost per tenant and in total: pooled (slices at their share) and exclusive (whole devices)."""
        rows = aggregate(self.intervals, book, [UsageKey.TENANT])
        total = totals(rows)

        def figures(row: Any) -> dict[str, Any]:
            return {"device_hours": round(row.device_hours, 6),
                    "memory_gib_hours": round(row.memory_gib_hours, 6),
                    "pooled_cost": round(row.cost, 4), "exclusive_cost": round(row.dedicated_cost, 4),
                    "saving": round(row.dedicated_cost - row.cost, 4), "priced": row.priced}

        by_tenant: dict[str, Any] = {}
        tenants = sorted({row.keys["tenant"] for row in rows})  # a row per simulated mark: summed
        for tenant in tenants:
            by_tenant[tenant] = figures(totals([row for row in rows if row.keys["tenant"] == tenant]))
        return {"currency": book.currency, "tenants": by_tenant, "total": figures(total)}
