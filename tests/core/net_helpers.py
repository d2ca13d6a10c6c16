"""Builders shared by the network-aware placement tests: a view on a small fat tree, gangs, busy nodes."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from factories import cluster, pod, workload
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.model import Fabric
from gpupool.core.model import Allocation, ClusterSnapshot, Node, PodPlacement, Slice, Workload, WorkloadInfo
from gpupool.core.scheduling.cycle import CycleResult, Policies, cycle_on
from gpupool.core.scheduling.topology import FabricView
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.topology_spec import parse_topology_spec


def two_level() -> Fabric:
    """4 leaves of 2 hosts (node00001-2 on leaf-0, ...), 2 spines: n000-n001 share leaf 0."""
    return fat_tree(4, levels=2)


def gang(
    pods: int, gpus: int, spec: str | None = None, wid: str = "g", estimate_s: float | None = None
) -> Workload:
    w = workload(*(pod(gpus, name=f"p{i}") for i in range(pods)), wid=wid)
    topology = None if spec is None else parse_topology_spec(spec)
    return dataclasses.replace(w, topology=topology, runtime_estimate_s=estimate_s)


def busy(node: str, gpus: int, wid: str, start_s: float = 0.0, estimate_s: float | None = None) -> Allocation:
    """A running single-pod workload holding the first `gpus` devices of `node`."""
    w = dataclasses.replace(workload(pod(gpus, name="p0"), wid=wid), runtime_estimate_s=estimate_s)
    slices = tuple(Slice(d, 1000) for d in range(gpus))
    return Allocation(w, (PodPlacement("p0", node, slices),), start_s)


def view_on(
    nodes: Sequence[Node] | None = None, running: Sequence[Allocation] = (), fabric: Fabric | None = None,
    info: dict[str, WorkloadInfo] | None = None,
) -> ClusterView:
    nodes = list(nodes) if nodes is not None else cluster(8)
    snapshot = ClusterSnapshot(tuple(nodes), tuple(running), info or {})
    view = ClusterView.from_snapshot(snapshot)
    view.set_topology(FabricView.from_fabric(fabric or two_level(), nodes))
    return view


def run(
    view: ClusterView, pending: Sequence[Workload], now_s: float = 0.0, **policies: object
) -> CycleResult:
    return cycle_on(view, pending, Policies(**policies), now_s, random.Random(0))  # type: ignore[arg-type]


def nodes_of(result: CycleResult, wid: str) -> list[str]:
    admitted = {a.workload_id: a for a in result.admitted}
    return [p.node for p in admitted[wid].placements]


def leaves_of(view: ClusterView, names: Sequence[str]) -> set[int]:
    assert view.topology is not None
    return {int(view.topology.leaf_id[view.state.node_index[n]]) for n in names}
