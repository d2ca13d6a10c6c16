"""Node use cases: one node with its allocation and state (lost ones too), cordon, uncordon, drain
(the listing is node_listing.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.api.events import EventReason
from gpupool.api.nodes import DeviceOut, HeldSliceOut, LayerOut, NodeOut, NodeState
from gpupool.core.model import Node, WorkloadStatus
from gpupool.errors import NotFound, did_you_mean
from gpupool.providers.base import Capability
from gpupool.providers.nodespec import CONTAINERS_LABEL
from gpupool.server.auth import Principal
from gpupool.server.db import insert_ignoring
from gpupool.server.held import EMPTY_NODE, NodeHeld
from gpupool.server.orm import NodeFlagRow, PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import audit, enforcement
from gpupool.server.services.requeue import requeue, stop_after_commit
from gpupool.server.states import ACTIVE_POD_STATES


@dataclass
class NodeUse:
    """What active pods hold on one node."""

    pods: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    device_milli: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    device_memory_mib: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    held: NodeHeld = EMPTY_NODE


def node_use(held: NodeHeld) -> NodeUse:
    return NodeUse(pods=len(held.pods), cpu_milli=held.cpu_milli, memory_mib=held.memory_mib,
                   device_milli=held.device_milli(), device_memory_mib=held.device_memory_mib(), held=held)


def one_node_usage(session: Session, rt: Runtime, name: str) -> NodeUse:
    return node_use(rt.held.read(session.connection()).by_node.get(name, EMPTY_NODE))


def node_flags(session: Session) -> dict[str, NodeFlagRow]:
    return {r.name: r for r in session.scalars(select(NodeFlagRow))}


def node_state(node: Node, flags: NodeFlagRow | None, use: NodeUse) -> NodeState:
    """Broken hardware first (it is what an admin must see), then Slurm's words: a draining node
    still runs work placed before the drain; drained once none is left."""
    if not node.healthy or any(not d.healthy for d in node.devices):
        return NodeState.UNHEALTHY
    if flags is not None and flags.draining:
        return NodeState.DRAINING if use.pods else NodeState.DRAINED
    if node.cordoned or (flags is not None and flags.cordoned):
        return NodeState.CORDONED
    return NodeState.READY


def held_slices(held: NodeHeld, who: Principal) -> dict[int, list[HeldSliceOut]]:
    """The slices held on each device of a node, those of workloads `who` may see only."""
    by_device: dict[int, list[HeldSliceOut]] = defaultdict(list)
    for pod in held.pods:
        if not who.may_see(pod.tenant):
            continue
        for s in pod.slices:
            by_device[s.device_index].append(HeldSliceOut(
                workload=s.workload, name=s.name, tenant=s.tenant, compute_milli=s.compute_milli,
                memory_mib=s.memory_mib))
    return by_device


def node_out(node: Node, flags: NodeFlagRow | None, use: NodeUse,
             missing: Mapping[Capability, str], who: Principal) -> NodeOut:
    held = held_slices(use.held, who)
    failed_devices = set(flags.failed_devices) if flags is not None else set()
    return NodeOut(
        name=node.name,
        state=node_state(node, flags, use),
        cpu_milli=node.cpu_milli,
        memory_mib=node.memory_mib,
        healthy=node.healthy,
        unhealthy_devices=[d.index for d in node.devices if not d.healthy],
        injected_fault=bool(flags and flags.failed),
        cordoned=node.cordoned or bool(flags and flags.cordoned),
        draining=bool(flags and flags.draining),
        simulated=any(d.simulated for d in node.devices),
        labels=dict(node.labels),
        devices=[
            DeviceOut(
                uuid=d.uuid, model=d.model, index=d.index, memory_mib=d.memory_mib, kind=d.kind.value,
                healthy=d.healthy, simulated=d.simulated, allocated_milli=use.device_milli.get(slot, 0),
                allocated_memory_mib=use.device_memory_mib.get(slot, 0),
                injected_fault=d.index in failed_devices, held=held.get(d.index, []),
            )
            for slot, d in enumerate(node.devices)
        ],
        allocated_cpu_milli=use.cpu_milli,
        allocated_memory_mib=use.memory_mib,
        enforcement=[LayerOut(layer=state.layer, enforced=state.enforced, level=state.level.value,
                              detail=state.detail)
                     for state in enforcement.node_layers(node, missing)],
        containers=node.labels.get(CONTAINERS_LABEL) or "none: " + missing.get(
            Capability.CONTAINERS, "this node's provider does not run containers"),
    )


def lost_out(name: str, flags: NodeFlagRow | None, use: NodeUse) -> NodeOut:
    """A node the store knows (pods or flags there) that the provider no longer lists."""
    return NodeOut(
        name=name, state=NodeState.LOST, cpu_milli=0, memory_mib=0, healthy=False,
        unhealthy_devices=sorted(flags.failed_devices) if flags is not None else [],
        injected_fault=bool(flags and flags.failed), cordoned=bool(flags and flags.cordoned),
        draining=bool(flags and flags.draining), simulated=False, labels={}, devices=[],
        allocated_cpu_milli=use.cpu_milli, allocated_memory_mib=use.memory_mib,
    )


def has_flags(row: NodeFlagRow) -> bool:
    return bool(row.cordoned or row.draining or row.failed or row.failed_devices)


def find(rt: Runtime, name: str) -> Node:
    """The live node `name`, or NotFound with the closest name."""
    for node in rt.nodes():
        if node.name == name:
            return node
    names = [n.name for n in rt.nodes()]
    hint = did_you_mean(name, names) or (f" Nodes: {', '.join(names)}." if len(names) <= 10 else "")
    raise NotFound(f"No node named {name!r}.{hint} See `gpupool nodes`.", node=name)


def get_node(rt: Runtime, who: Principal, name: str) -> NodeOut:
    """A live node, or a lost one the store still knows."""
    with rt.store.read() as session:
        flags = session.get(NodeFlagRow, name)
        use = one_node_usage(session, rt, name)
    if _is_lost(rt, name, flags, use):
        return lost_out(name, flags, use)
    return node_out(find(rt, name), flags, use, rt.provider.missing_capabilities(), who)


def _is_lost(rt: Runtime, name: str, flags: NodeFlagRow | None, use: NodeUse) -> bool:
    known = use.pods > 0 or (flags is not None and has_flags(flags))
    return known and name not in {n.name for n in rt.nodes()}


def is_lost(rt: Runtime, name: str) -> bool:
    """Whether `name` is a lost node: known to the store, no longer listed by the provider."""
    with rt.store.read() as session:
        flags = session.get(NodeFlagRow, name)
        use = one_node_usage(session, rt, name)
    return _is_lost(rt, name, flags, use)


def after_change(rt: Runtime, who: Principal, name: str, lost: bool) -> NodeOut:
    """The node as it reads now; a lost node whose last flag was just cleared still answers (lost)."""
    if not lost:
        return get_node(rt, who, name)
    with rt.store.read() as session:
        flags = session.get(NodeFlagRow, name)
        use = one_node_usage(session, rt, name)
    return lost_out(name, flags, use)


def set_cordon(rt: Runtime, who: Principal, name: str, cordoned: bool) -> NodeOut:
    """Cordon: no new work lands there; uncordon also ends a drain (and clears a lost node's flags)."""
    who.require_admin()
    lost = not cordoned and is_lost(rt, name)
    if not lost:
        find(rt, name)
    with rt.store.write() as session:
        _set_flags(session, name, cordoned=cordoned, draining=False, now=rt.clock())
        audit.record(session, who, "node.cordon" if cordoned else "node.uncordon", name, rt.clock())
    rt.capacity_may_have_changed()
    return after_change(rt, who, name, lost)


def _set_flags(session: Session, name: str, *, cordoned: bool, draining: bool, now: float) -> None:
    row = locked_flags(session, name, now)
    row.cordoned, row.draining, row.updated_s = cordoned, draining, now


def locked_flags(session: Session, name: str, now: float) -> NodeFlagRow:
    """The node's flags row, locked until the transaction ends (made first, all flags off, where there
    is none): two admins changing one node at once are serialised, the second reading what the first
    wrote, and the first change of a node never fails on the other's insert."""
    conn = session.connection()
    conn.execute(insert_ignoring(conn, NodeFlagRow.__table__).values(
        name=name, cordoned=False, draining=False, updated_s=now, failed=False, failed_devices=[]))
    row = session.get(NodeFlagRow, name, with_for_update=True, populate_existing=True)
    assert row is not None  # made above
    return row


def drain(rt: Runtime, who: Principal, name: str, *, now: bool = False) -> NodeOut:
    """Cordon the node and mark it draining: the work running there finishes (the node reads
    `drained` once none is left). With `now`, every workload with a pod there is requeued at once
    (its pods are stopped)."""
    who.require_admin()
    find(rt, name)
    at = rt.clock()
    to_stop: list[str] = []
    marks: dict[str, float | None] = {}
    if now:  # asked of the provider before the transaction (never a network call inside one)
        with rt.store.read() as session:
            marks = rt.provider.checkpoint_marks(sorted(_workloads_on(session, name)))
    with rt.store.write() as session:
        _set_flags(session, name, cordoned=True, draining=True, now=at)
        audit.record(session, who, "node.drain", name, at, "now" if now else "")
        if now:
            to_stop = _requeue_all(session, name, marks, at)
    stop_after_commit(rt, to_stop, at)  # a launch no worker has begun is taken back
    rt.capacity_may_have_changed()
    return get_node(rt, who, name)


def _workloads_on(session: Session, name: str) -> set[str]:
    return set(session.scalars(
        select(PodRow.workload_id).where(PodRow.node == name, PodRow.status.in_(ACTIVE_POD_STATES))
    ))


def _requeue_all(session: Session, name: str, marks: Mapping[str, float | None], now: float) -> list[str]:
    """Stop the active pods on node `name` and requeue their workloads (the requeue service, with
    the work lost since their last checkpoint `marks` accounted; work placed there since the marks
    were read has none); returns the pods to stop. Rows are read FOR UPDATE: a cancel waits."""
    to_stop: list[str] = []
    for workload_id in sorted(_workloads_on(session, name)):
        row = session.get(WorkloadRow, workload_id, with_for_update=True)
        if row is None or WorkloadStatus(row.status).is_final:
            continue
        mark = marks.get(row.id) if row.started_s is not None else None
        to_stop += requeue(session, row, EventReason.NODE_DRAINED, f"Requeued: node {name} was drained "
                           "with --now.", now, mark=mark)
    return to_stop
