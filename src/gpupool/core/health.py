"""Which placed pods sit on unhealthy devices or nodes: the eviction candidates, with reasons.

The scheduler decides what to do with them (evict, requeue); this only finds them. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.core.model import ClusterSnapshot, Reason


@dataclass(frozen=True, slots=True)
class Eviction:
    """One pod that should leave its node, and why."""

    workload_id: str
    pod: str
    node: str
    device_uuids: tuple[str, ...]
    reason: Reason
    message: str


def unhealthy_evictions(snapshot: ClusterSnapshot) -> list[Eviction]:
    """Every placed pod whose node is unhealthy or that holds a slice of an unhealthy device,
    in allocation order. A pod on a healthy device of a node with another unhealthy device stays."""
    nodes = snapshot.node_by_name()
    evictions: list[Eviction] = []
    for allocation in snapshot.allocations:
        for placement in allocation.placements:
            node = nodes.get(placement.node)
            if node is None:
                evictions.append(Eviction(allocation.workload.id, placement.pod, placement.node, (),
                                          Reason.EVICTED_UNHEALTHY, f"node {placement.node} is gone"))
                continue
            by_index = {d.index: d for d in node.devices}
            held = [by_index[s.device_index] for s in placement.slices if s.device_index in by_index]
            if not node.healthy:
                evictions.append(Eviction(allocation.workload.id, placement.pod, node.name,
                                          tuple(d.uuid for d in held), Reason.EVICTED_UNHEALTHY,
                                          f"node {node.name} is unhealthy"))
                continue
            bad = [d for d in held if not d.healthy]
            if bad:
                names = ", ".join(f"{d.uuid} (index {d.index})" for d in bad)
                evictions.append(Eviction(allocation.workload.id, placement.pod, node.name,
                                          tuple(d.uuid for d in bad), Reason.EVICTED_UNHEALTHY,
                                          f"device {names} on node {node.name} is unhealthy"))
    return evictions
