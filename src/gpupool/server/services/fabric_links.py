"""Link changes on the live fabric and what they do to running gangs: a gang two of whose nodes lost
every route is requeued (`link_lost`), one left with less bandwidth is told its new bottleneck
(`link_degraded`), and with `fabric.migrate_on_congestion` each telemetry sample's bottleneck
loads go to the scheduler's next cycle, which stops and requeues (`congestion_moved`, kind
migrate) a gang whose bottleneck stayed above the threshold for `congestion_for`, to be placed away
from it (`core.scheduling.congestion.MigrateRule`, the rule `sim replay --config` applies too).

A gang's bottleneck is the slowest cable on its routes (`LiveFabric.route`): its data rate left by
the measured load, shared equally by the gangs routed over it; 0 when it failed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.api.events import EventReason
from gpupool.config import FabricConfig
from gpupool.core.fabric.telemetry import PortLoad
from gpupool.core.model import Node, WorkloadStatus
from gpupool.core.scheduling.congestion import CongestionSample
from gpupool.errors import Conflict
from gpupool.server.auth import Principal
from gpupool.server.orm import EventRow, PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import audit
from gpupool.server.services.fabric import Key, LiveFabric, Route
from gpupool.server.services.requeue import requeue, stop_each_after_commit
from gpupool.server.states import ACTIVE_POD_STATES

_RUNNING = (WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)


def live(rt: Runtime) -> LiveFabric:
    """The server's fabric; Conflict (409) when it runs without one."""
    if rt.fabric is None:
        raise Conflict("This pool runs without a fabric; start it with `gpupool up --fabric FILE` "
                       "(ibnetdiscover output or a `gpupool fabric generate` file).")
    return rt.fabric


@dataclass(frozen=True, slots=True)
class GangPath:
    """One running gang on the fabric: its route and what that gives it now."""

    workload_id: str
    tenant: str
    nodes: tuple[str, ...]
    route: Route
    bottleneck: Key | None
    bottleneck_gbps: float
    """inf for a gang on one node (it needs no fabric)."""
    sharing: int = 0
    """Gangs routed over its bottleneck cable (itself included)."""


def running_gangs(rt: Runtime) -> dict[str, tuple[str, tuple[str, ...]]]:
    """workload -> (tenant, its pods' nodes in rank order), for work holding pods on several nodes."""
    with rt.store.read() as session:
        rows = session.execute(
            select(PodRow.workload_id, PodRow.rank, PodRow.node, WorkloadRow.tenant)
            .join(WorkloadRow, WorkloadRow.id == PodRow.workload_id)
            .where(PodRow.status.in_(ACTIVE_POD_STATES), WorkloadRow.status.in_(_RUNNING))
            .order_by(PodRow.workload_id, PodRow.rank)).all()
    gangs: dict[str, tuple[str, list[str]]] = {}
    for workload_id, _, node, tenant in rows:
        gangs.setdefault(workload_id, (tenant, []))[1].append(node)
    return {w: (t, tuple(n)) for w, (t, n) in gangs.items() if len(set(n)) > 1}


def assess(fabric: LiveFabric, nodes: Sequence[Node],
           gangs: Mapping[str, tuple[str, tuple[str, ...]]]) -> dict[str, GangPath]:
    """Each gang's route and bottleneck, counting every gang routed over each cable."""
    routes = {w: fabric.route(nodes, gang_nodes) for w, (_, gang_nodes) in gangs.items()}
    users = Counter(key for route in routes.values() for key in route.links)
    out: dict[str, GangPath] = {}
    for workload_id, route in routes.items():
        tenant, gang_nodes = gangs[workload_id]
        best: tuple[float, Key] | None = None
        for key in route.links:
            share = fabric.available_gbps(key) / max(1, users[key])
            if best is None or share < best[0]:
                best = (share, key)
        gbps = 0.0 if not route.connected else (best[0] if best is not None else float("inf"))
        out[workload_id] = GangPath(workload_id, tenant, gang_nodes, route, best[1] if best else None, gbps,
                                    users[best[1]] if best else 0)
    return out


@dataclass
class Effects:
    """What one change did: gangs requeued (cut off) and gangs told; the congested ones are the
    next cycle's to judge."""

    requeued: list[str] = field(default_factory=list)
    slowed: dict[str, str] = field(default_factory=dict)
    """workload -> the event's message naming its new bottleneck."""
    congested: list[str] = field(default_factory=list)
    """Gangs whose bottleneck cable is above the congestion threshold at this sample (moved by the
    scheduler once congested for `congestion_for`)."""


def describe(fabric: LiveFabric, path: GangPath) -> str:
    if path.bottleneck is None:
        return "no fabric link"
    return (f"{fabric.label(path.bottleneck)} at {path.bottleneck_gbps:.0f} Gb/s"
            + (f", shared by {path.sharing} gangs" if path.sharing > 1 else ""))


def compare(fabric: LiveFabric, before: Mapping[str, GangPath], after: Mapping[str, GangPath],
            cause: str) -> Effects:
    """The gangs cut off by a change, and those left with less bandwidth."""
    effects = Effects()
    for workload_id, now in sorted(after.items()):
        was = before.get(workload_id)
        if not now.route.connected:
            effects.requeued.append(workload_id)
        elif was is not None and now.bottleneck_gbps < was.bottleneck_gbps - 1e-6:  # lost bandwidth
            effects.slowed[workload_id] = (
                f"{cause}: its bottleneck is now {describe(fabric, now)} (was "
                f"{was.bottleneck_gbps:.0f} Gb/s).")
    return effects


Gangs = Mapping[str, tuple[str, tuple[str, ...]]]
"""workload -> (tenant, its pods' nodes in rank order): what `running_gangs` read."""


def carry_out(rt: Runtime, effects: Effects, cause: str, now: float,
              who: Principal | None = None, action: str = "", target: str = "",
              assessed: Gangs | None = None) -> None:
    """Requeue the cut-off gangs (their pods stop with their class's grace, the work since their
    checkpoint accounted) and record the others' events, in one transaction. `assessed`: the gangs'
    nodes the effects were judged on; a gang that holds other nodes by the time its row is locked
    (the scheduler moved it meanwhile) is left to the next assessment."""
    to_stop: list[tuple[str, float]] = []
    stopping = effects.requeued
    marks = rt.provider.checkpoint_marks(stopping) if stopping else {}  # before the transaction
    with rt.store.write() as session:
        if who is not None:
            audit.record(session, who, action, target, now)
        for workload_id in effects.requeued:
            judged = assessed[workload_id][1] if assessed is not None and workload_id in assessed else None
            to_stop += _requeue(rt, session, workload_id, EventReason.LINK_LOST, f"Requeued: {cause}, and "
                                "some of its nodes had no route left to each other.", marks, now, judged)
        for workload_id, message in effects.slowed.items():
            row = session.get(WorkloadRow, workload_id)
            if row is not None and row.status in _RUNNING:
                session.add(EventRow(
                    workload_id=workload_id, from_status=row.status, to_status=row.status,
                    reason=EventReason.LINK_DEGRADED.value, message=message[:1024], at_s=now))
    stop_each_after_commit(rt, to_stop, now)  # a launch no worker has begun is taken back
    if to_stop:
        rt.capacity_may_have_changed()


def _requeue(rt: Runtime, session: Session, workload_id: str, reason: EventReason, message: str,
             marks: Mapping[str, float | None], now: float,
             judged: tuple[str, ...] | None = None) -> list[tuple[str, float]]:
    row = session.get(WorkloadRow, workload_id, with_for_update=True)  # a cancel waits for the commit
    if row is None or row.status not in _RUNNING:
        return []
    if judged is not None and _gang_nodes(session, workload_id) != judged:
        return []  # placed elsewhere since it was judged cut off (a move, a requeue and a new start)
    grace = rt.config.grace_s(str(row.spec.get("priority_class") or ""))
    mark = marks.get(row.id) if row.started_s is not None else None
    pods = requeue(session, row, reason, message, now, mark=mark)
    return [(pod_id, grace) for pod_id in pods]


def _gang_nodes(session: Session, workload_id: str) -> tuple[str, ...]:
    """The nodes of the workload's active pods in rank order (as `running_gangs` reads them)."""
    return tuple(session.scalars(select(PodRow.node).where(
        PodRow.workload_id == workload_id, PodRow.status.in_(ACTIVE_POD_STATES)).order_by(PodRow.rank)))


# ------------------------------------------------------------------ the changes


@dataclass(frozen=True, slots=True)
class LinkChange:
    """The answer to fail-link / heal-link / telemetry."""

    links: tuple[Key, ...]
    changed: bool
    effects: Effects


def set_link(rt: Runtime, who: Principal, ref: str, *, failed: bool) -> LinkChange:
    """Fail or heal one cable (admin): routes recomputed, the scheduler's view updated, and the
    running gangs it touches requeued or told."""
    who.require_admin()
    fabric = live(rt)
    link = fabric.find_link(ref)
    nodes, gangs = rt.nodes(), running_gangs(rt)
    before = assess(fabric, nodes, gangs)
    changed = fabric.fail_link(link) if failed else fabric.heal_link(link)
    cause = f"link {fabric.label(link.key)} {'failed' if failed else 'came back'}"
    effects = compare(fabric, before, assess(fabric, nodes, gangs), cause) if changed else Effects()
    carry_out(rt, effects, cause, rt.clock(), who, "fabric.fail_link" if failed else "fabric.heal_link",
              fabric.label(link.key), assessed=gangs)
    rt.capacity_may_have_changed()  # the scheduler's view takes the change at its next cycle
    return LinkChange((link.key,), changed, effects)


def hand_congestion(fabric: LiveFabric, config: FabricConfig, paths: Mapping[str, GangPath],
                    now: float) -> list[str]:
    """With fabric.migrate_on_congestion: the bottleneck load of each gang that moving could
    relieve, handed to the scheduler's next cycle (which judges it: `Policies.migrate`); returns the
    gangs above the threshold now, sorted. Without it: nothing handed, none returned."""
    rule = config.migrate_rule()
    if rule is None:
        return []
    loads = {w: fabric.load(p.bottleneck) for w, p in paths.items()
             if p.bottleneck is not None and _relievable(fabric, p)}
    fabric.hand_congestion_sample(CongestionSample(now, loads))
    return sorted(w for w, load in loads.items() if load > rule.threshold)


def _relievable(fabric: LiveFabric, path: GangPath) -> bool:
    """Whether moving the gang could cool its bottleneck: a cable between switches, or a host's own
    cable that another gang also uses. A host cable the gang has to itself carries its own traffic
    wherever it goes; moving it for that would move it again and again (the replay's rule too)."""
    key = path.bottleneck
    if key is None:
        return False
    between_switches = fabric.current.is_switch(key[0]) and fabric.current.is_switch(key[2])
    return between_switches or path.sharing > 1


def telemetry(rt: Runtime, who: Principal, loads: Mapping[tuple[str, int], PortLoad]) -> LinkChange:
    """Port loads and errors from the fabric's counters (admin): link load and health updated, a
    link whose end saw link_downed failed; gangs cut off requeued, slowed ones told, and the
    congestion sample handed to the scheduler's next cycle where the pool moves gangs off it."""
    who.require_admin()
    fabric = live(rt)
    nodes, gangs = rt.nodes(), running_gangs(rt)
    before = assess(fabric, nodes, gangs)
    downed = fabric.apply_loads(loads)
    after = assess(fabric, nodes, gangs)
    now = rt.clock()
    cause = ("link " + ", ".join(fabric.label(lk.key) for lk in downed) + " went down") if downed \
        else "the fabric's load changed"
    effects = compare(fabric, before, after, cause)
    if not downed:
        effects.slowed.clear()  # load moves all the time: only failures are told
    staying = {w: p for w, p in after.items() if w not in effects.requeued}
    effects.congested = hand_congestion(fabric, rt.config.fabric, staying, now)
    carry_out(rt, effects, cause, now, who, "fabric.telemetry", f"{len(loads)} ports", assessed=gangs)
    rt.capacity_may_have_changed()
    return LinkChange(tuple(lk.key for lk in downed), bool(loads), effects)
