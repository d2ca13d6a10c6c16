"""The pool summary: capacity, allocation and utilisation by device model and by tenant."""

from __future__ import annotations

from collections import Counter, defaultdict

from sqlalchemy import func, select

from gpupool.core.model import WorkloadStatus
from gpupool.core.units import MILLI
from gpupool.server.auth import Principal
from gpupool.server.orm import PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.schemas.nodes import ModelUsage, PoolSummary, TenantUsage
from gpupool.server.states import ACTIVE_POD_STATES


def summary(rt: Runtime, who: Principal) -> PoolSummary:
    """Tenants see the whole pool's capacity but only their own line of the by-tenant table."""
    nodes = rt.nodes()
    model_of = {(n.name, slot): d.model for n in nodes for slot, d in enumerate(n.devices)}
    with rt.store.read() as session:
        pods = session.execute(
            select(PodRow.node, PodRow.slices, WorkloadRow.tenant)
            .join(WorkloadRow, WorkloadRow.id == PodRow.workload_id)
            .where(PodRow.status.in_(ACTIVE_POD_STATES))
        ).all()
        counts = session.execute(
            select(WorkloadRow.tenant, WorkloadRow.status, func.count()).group_by(
                WorkloadRow.tenant, WorkloadRow.status)
        ).all()
    by_model_milli: Counter[str] = Counter()
    by_tenant_milli: Counter[str] = Counter()
    for node, slices, tenant in pods:
        for s in slices:
            by_model_milli[model_of.get((node, s["device_index"]), "unknown")] += s["compute_milli"]
            by_tenant_milli[tenant] += s["compute_milli"]
    devices: Counter[str] = Counter()
    simulated: dict[str, bool] = {}
    for n in nodes:
        for d in n.devices:
            devices[d.model] += 1
            simulated[d.model] = simulated.get(d.model, False) or d.simulated
    status_counts: Counter[str] = Counter()
    per_tenant: dict[str, Counter[str]] = defaultdict(Counter)
    for tenant, status, count in counts:
        if who.may_see(tenant):
            status_counts[status] += int(count)
            per_tenant[tenant][status] += int(count)
    capacity = sum(devices.values())
    allocated = sum(by_model_milli.values()) / MILLI
    return PoolSummary(
        simulated=any(simulated.values()),
        nodes=len(nodes),
        devices=capacity,
        capacity_gpus=float(capacity),
        allocated_gpus=allocated,
        utilisation=allocated / capacity if capacity else 0.0,
        by_model=[
            ModelUsage(model=m, devices=devices[m], simulated=simulated[m],
                       allocated_gpus=by_model_milli[m] / MILLI,
                       utilisation=by_model_milli[m] / MILLI / devices[m] if devices[m] else 0.0)
            for m in sorted(devices)
        ],
        by_tenant=[
            TenantUsage(
                tenant=t, allocated_gpus=by_tenant_milli[t] / MILLI,
                running=c[WorkloadStatus.RUNNING.value] + c[WorkloadStatus.ADMITTED.value],
                pending=c[WorkloadStatus.PENDING.value],
            )
            for t, c in sorted(per_tenant.items())
        ],
        workloads={s.value: status_counts[s.value] for s in WorkloadStatus},
    )
