"""The pool summary: capacity, allocation and utilisation by device model and by tenant."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from sqlalchemy import func, select

from gpupool.api.nodes import ModelUsage, PoolSummary, TenantUsage
from gpupool.core.model import Node, WorkloadStatus
from gpupool.core.units import MILLI
from gpupool.server.auth import Principal
from gpupool.server.orm import WorkloadRow
from gpupool.server.runtime import Runtime


@dataclass(frozen=True)
class _Capacity:
    """What a node list holds, worked out once per list (the loop replaces the list each cycle)."""

    nodes: tuple[Node, ...]
    model_of: dict[tuple[str, int], str]
    devices: Counter[str]
    simulated: dict[str, bool]


_last_capacity: list[_Capacity] = []


def _capacity(nodes: tuple[Node, ...]) -> _Capacity:
    last = _last_capacity[0] if _last_capacity else None
    if last is not None and (last.nodes is nodes or last.nodes == nodes):
        return last
    devices: Counter[str] = Counter()
    simulated: dict[str, bool] = {}
    for n in nodes:
        for d in n.devices:
            devices[d.model] += 1
            simulated[d.model] = simulated.get(d.model, False) or d.simulated
    made = _Capacity(nodes, {(n.name, slot): d.model for n in nodes for slot, d in enumerate(n.devices)},
                     devices, simulated)
    _last_capacity[:] = [made]
    return made


def summary(rt: Runtime, who: Principal) -> PoolSummary:
    """Tenants see the whole pool's capacity but only their own line of the by-tenant table.

    Allocations come from the held-pods view (only new pods are read in full); the workload
    counts are one grouped query."""
    capacity = _capacity(rt.nodes())
    with rt.store.read() as session:
        conn = session.connection()
        held = rt.held.read(conn)
        counts = conn.execute(
            select(WorkloadRow.tenant, WorkloadRow.status, func.count()).group_by(
                WorkloadRow.tenant, WorkloadRow.status)
        ).all()
    by_model_milli: Counter[str] = Counter()
    for key, milli in held.milli_by_device.items():
        by_model_milli[capacity.model_of.get(key, "unknown")] += milli
    by_tenant_milli = held.milli_by_tenant
    devices, simulated = capacity.devices, capacity.simulated
    status_counts: Counter[str] = Counter()
    per_tenant: dict[str, Counter[str]] = defaultdict(Counter)
    for tenant, status, count in counts:
        if who.may_see(tenant):
            status_counts[status] += int(count)
            per_tenant[tenant][status] += int(count)
    total = sum(devices.values())
    allocated = sum(by_model_milli.values()) / MILLI
    return PoolSummary(
        simulated=any(simulated.values()),
        nodes=len(capacity.nodes),
        devices=total,
        capacity_gpus=float(total),
        allocated_gpus=allocated,
        utilisation=allocated / total if total else 0.0,
        by_model=[
            ModelUsage(model=m, devices=devices[m], simulated=simulated[m],
                       allocated_gpus=by_model_milli[m] / MILLI,
                       utilisation=by_model_milli[m] / MILLI / devices[m] if devices[m] else 0.0)
            for m in sorted(devices)
        ],
        by_tenant=[
            TenantUsage(
                tenant=t, allocated_gpus=by_tenant_milli.get(t, 0) / MILLI,
                running=c[WorkloadStatus.RUNNING.value] + c[WorkloadStatus.ADMITTED.value],
                pending=c[WorkloadStatus.PENDING.value],
            )
            for t, c in sorted(per_tenant.items())
        ],
        workloads={s.value: status_counts[s.value] for s in WorkloadStatus},
        fabric=rt.fabric is not None,
        federation_fence_s=rt.config.federation.fence,
    )
