"""Build what the core cycle needs from the store: the cluster snapshot, pending work and quotas."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import select

from gpupool.core.model import (
    Allocation,
    ClusterSnapshot,
    Node,
    PodPlacement,
    Slice,
    Workload,
    WorkloadStatus,
)
from gpupool.core.quota import DEVICE_MILLI, ClusterQueue, LocalQueue, QuotaConfig, ResourceQuota
from gpupool.server.orm import NodeFlagRow, PodRow, QueueRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.schemas.workloads import WorkloadSpec
from gpupool.server.services.specs import to_workload
from gpupool.server.states import ACTIVE_POD_STATES

log = logging.getLogger("gpupool.scheduler")

MAX_PENDING_PER_CYCLE = 5000


@dataclass(frozen=True, slots=True)
class StoreView:
    snapshot: ClusterSnapshot
    pending: tuple[Workload, ...]
    quota: QuotaConfig
    unschedulable_nodes: int


class WorkloadCache:
    """Parsed core Workloads by (id, attempt): specs are immutable, so parse each once."""

    def __init__(self) -> None:
        self._items: dict[str, Workload] = {}

    def get(self, row_id: str, spec: dict[str, Any], tenant: str, priority: int, submit_s: float) -> Workload:
        found = self._items.get(row_id)
        if found is None or found.priority != priority:
            found = to_workload(row_id, WorkloadSpec.model_validate(spec), tenant, priority, submit_s)
            self._items[row_id] = found
        return found

    def keep_only(self, ids: set[str]) -> None:
        for stale in set(self._items) - ids:
            del self._items[stale]


def queue_name(tenant: str, queue: str) -> str:
    return f"{tenant}/{queue}"


def load(rt: Runtime, cache: WorkloadCache, since_s: float | None = None,
         skip: frozenset[str] = frozenset()) -> StoreView:
    """One read transaction; the provider's nodes are read first, outside it.

    With `since_s`, only pending work submitted at or after it is read (new arrivals), and of
    that only what is not in `skip` is read in full.
    """
    nodes = rt.refresh_nodes()
    pending_query = select(WorkloadRow.id, WorkloadRow.spec, WorkloadRow.tenant, WorkloadRow.priority,
                           WorkloadRow.submit_s).where(WorkloadRow.status == WorkloadStatus.PENDING.value)
    with rt.store.read() as session:
        if since_s is not None:
            recent = session.scalars(
                select(WorkloadRow.id).where(WorkloadRow.status == WorkloadStatus.PENDING.value,
                                             WorkloadRow.submit_s >= since_s)
            ).all()
            pending_query = pending_query.where(WorkloadRow.id.in_([i for i in recent if i not in skip]))
        pending_rows = session.execute(
            pending_query
            .order_by(WorkloadRow.priority.desc(), WorkloadRow.submit_s, WorkloadRow.id)
            .limit(MAX_PENDING_PER_CYCLE)
        ).all()
        active = session.execute(
            select(PodRow.workload_id, PodRow.rank, PodRow.node, PodRow.slices, WorkloadRow.spec,
                   WorkloadRow.tenant, WorkloadRow.priority, WorkloadRow.submit_s, WorkloadRow.admitted_s)
            .join(WorkloadRow, WorkloadRow.id == PodRow.workload_id)
            .where(PodRow.status.in_(ACTIVE_POD_STATES))
        ).all()
        queues = session.execute(select(QueueRow.tenant, QueueRow.name, QueueRow.quota_device_milli)).all()
        cordoned = set(session.scalars(select(NodeFlagRow.name).where(NodeFlagRow.cordoned.is_(True))))
    nodes = tuple(replace(n, cordoned=True) if n.name in cordoned and not n.cordoned else n for n in nodes)
    pending = tuple(cache.get(r.id, r.spec, r.tenant, r.priority, r.submit_s) for r in pending_rows)
    allocations = _allocations(active, nodes, cache)
    cache.keep_only({w.id for w in pending} | {a.workload.id for a in allocations})
    return StoreView(
        snapshot=ClusterSnapshot(nodes=nodes, allocations=allocations),
        pending=pending,
        quota=quota_config(queues),
        unschedulable_nodes=sum(1 for n in nodes if not n.schedulable),
    )


def _allocations(active: Any, nodes: tuple[Node, ...], cache: WorkloadCache) -> tuple[Allocation, ...]:
    known = {n.name for n in nodes}
    grouped: dict[str, list[Any]] = {}
    for row in active:
        grouped.setdefault(row.workload_id, []).append(row)
    allocations = []
    for workload_id, rows in sorted(grouped.items()):
        first = rows[0]
        workload = cache.get(workload_id, first.spec, first.tenant, first.priority, first.submit_s)
        placements = tuple(
            PodPlacement(pod=f"r{r.rank}", node=r.node, slices=tuple(Slice(**s) for s in r.slices))
            for r in sorted(rows, key=lambda r: r.rank)
            if r.node in known
        )
        if len(placements) < len(rows):
            log.warning("workload %s holds pods on nodes the provider no longer lists", workload_id)
        allocations.append(Allocation(workload=workload, placements=placements,
                                      start_time_s=first.admitted_s or 0.0))
    return tuple(allocations)


def quota_config(queues: Any) -> QuotaConfig:
    """Each queue is its own ClusterQueue; a queue with a quota caps its devices (milli)."""
    cluster_queues = []
    local_queues = []
    for tenant, name, quota in sorted(queues):
        quotas = {} if quota is None else {DEVICE_MILLI: ResourceQuota(nominal=int(quota))}
        cluster_queues.append(ClusterQueue(name=queue_name(tenant, name), quotas=quotas))
        local_queues.append(LocalQueue(tenant=tenant, name=name, cluster_queue=queue_name(tenant, name)))
    return QuotaConfig(cluster_queues=tuple(cluster_queues), local_queues=tuple(local_queues))
