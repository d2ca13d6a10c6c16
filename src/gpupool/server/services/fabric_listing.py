"""What `GET /api/v1/fabric` and a workload's detail say about the fabric: tiers, switches, the
pool's nodes and their places, every cable with its state, load and gangs, and a gang's path."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from gpupool.api.fabric import (
    FabricNodeOut,
    FabricOut,
    GangPathOut,
    LevelOut,
    LinkOut,
    NetworkOut,
    PortOut,
    SwitchOut,
)
from gpupool.api.workloads import WorkloadOut
from gpupool.core.fabric.model import NodeKind
from gpupool.core.model import Node
from gpupool.server.auth import Principal
from gpupool.server.runtime import Runtime
from gpupool.server.services.fabric import Key, LiveFabric
from gpupool.server.services.fabric_links import GangPath, assess, live, running_gangs

_TIERS = ("leaf", "spine")
_HOLDING = ("admitted", "running")


def link_id(fabric: LiveFabric, key: Key) -> str:
    return f"{fabric.base.nodes[key[0]].label}:{key[1]}"


def fabric_out(rt: Runtime, who: Principal, workload_id: str | None = None) -> FabricOut:
    """The whole fabric (any token may read it); with `workload_id`, that gang's path (only a
    workload the caller may see: NotFound otherwise)."""
    fabric = live(rt)
    gang = None
    if workload_id is not None:
        from gpupool.server.services import workloads  # it shows a workload's network through this module

        detail = workloads.get(rt, who, workload_id)  # NotFound for another tenant's
        gang = gang_path(rt, fabric, detail)
    nodes = rt.nodes()
    paths = assess(fabric, nodes, running_gangs(rt))
    users = Counter(key for p in paths.values() for key in p.route.links)
    base = fabric.base
    counts = Counter(base.levels.values())
    levels = [LevelOut(level=lvl, tier=_TIERS[lvl] if lvl < len(_TIERS) else "core", switches=n)
              for lvl, n in sorted(counts.items())]
    switches = [SwitchOut(id=s, name=base.nodes[s].label, level=base.levels.get(s)) for s in base.switches]
    degraded = {lk.key for lk in base.degraded_links}
    links = [LinkOut(
        id=link_id(fabric, state.link.key), a=base.nodes[state.link.a].label, a_port=state.link.a_port,
        b=base.nodes[state.link.b].label, b_port=state.link.b_port,
        kind="switch" if base.is_switch(state.link.a) and base.is_switch(state.link.b) else "access",
        width_speed=state.link.width_speed, data_rate_gbps=round(state.link.data_rate_gbps, 3),
        failed=state.failed, degraded=state.link.key in degraded, load=round(state.load, 4),
        available_gbps=round(fabric.available_gbps(state.link.key), 3), gangs=users[state.link.key],
    ) for state in fabric.links() if base.nodes[state.link.a].kind is not NodeKind.ROUTER]
    return FabricOut(source=fabric.source, levels=levels, switches=switches, nodes=_nodes(fabric, nodes),
                     links=links, gang=gang)


def _nodes(fabric: LiveFabric, nodes: Sequence[Node]) -> list[FabricNodeOut]:
    view = fabric.scheduling_view(nodes)
    out = []
    for i, place in enumerate(view.places):
        if place is None:
            continue
        out.append(FabricNodeOut(
            node=place.node, host=place.host, leaf=view.leaf_names[int(view.leaf_id[i])],
            spine=view.spine_names[int(view.spine_id[i])],
            ports=[PortOut(hca=p.hca, port=p.port, adapter=fabric.base.nodes[p.ca].label,
                           leaf=fabric.base.nodes[p.leaf].label, rail=p.rail)
                   for p in place.ports]))
    return out


def gang_path(rt: Runtime, fabric: LiveFabric, detail: WorkloadOut) -> GangPathOut:
    """Where a workload's current pods sit and the cables between them."""
    ranked = [p.node for p in sorted(detail.pods, key=lambda p: p.rank)]
    path = _assessed(rt, fabric, detail.id, detail.tenant, ranked)
    one_node = len(set(ranked)) < 2
    return GangPathOut(
        workload_id=detail.id, nodes=ranked, domain=fabric.domain(rt.nodes(), ranked), hops=path.route.hops,
        connected=path.route.connected,
        bottleneck=None if path.bottleneck is None else link_id(fabric, path.bottleneck),
        bottleneck_gbps=None if one_node else round(path.bottleneck_gbps, 3),
        links=[link_id(fabric, key) for key in path.route.links])


def _assessed(rt: Runtime, fabric: LiveFabric, workload_id: str, tenant: str, ranked: list[str]) -> GangPath:
    """The gang's path counted with every running gang (it may not be running itself)."""
    gangs = running_gangs(rt)
    gangs.setdefault(workload_id, (tenant, tuple(ranked)))
    return assess(fabric, rt.nodes(), gangs)[workload_id]


def with_network(rt: Runtime, detail: WorkloadOut) -> WorkloadOut:
    """`detail` with its placement's domain, hops and bottleneck, when a fabric is known and it holds
    pods on several nodes."""
    fabric = rt.fabric
    if fabric is None or detail.status not in _HOLDING or len({p.node for p in detail.pods}) < 2:
        return detail
    path = gang_path(rt, fabric, detail)
    network = NetworkOut(domain=path.domain, hops=path.hops, bottleneck=path.bottleneck,
                         bottleneck_gbps=path.bottleneck_gbps, connected=path.connected)
    return detail.model_copy(update={"network": network})
