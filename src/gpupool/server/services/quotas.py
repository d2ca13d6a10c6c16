"""The queues' quotas as the core sees them: each stored queue is one ClusterQueue (`tenant/queue`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from gpupool.core.quota import DEVICE_MILLI, ClusterQueue, LocalQueue, QuotaConfig, ResourceQuota
from gpupool.server.orm import QueueRow


def queue_name(tenant: str, queue: str) -> str:
    return f"{tenant}/{queue}"


def read_quota(conn: Connection) -> QuotaConfig:
    """The quota configuration of every stored queue (one read)."""
    rows = conn.execute(select(QueueRow.tenant, QueueRow.name, QueueRow.quota_device_milli)).all()
    return quota_config(rows)


def quota_config(queues: Any) -> QuotaConfig:
    """Each queue is its own ClusterQueue; a queue with a quota caps its devices (milli)."""
    cluster_queues = []
    local_queues = []
    for tenant, name, quota in sorted(queues):
        quotas = {} if quota is None else {DEVICE_MILLI: ResourceQuota(nominal=int(quota))}
        cluster_queues.append(ClusterQueue(name=queue_name(tenant, name), quotas=quotas))
        local_queues.append(LocalQueue(tenant=tenant, name=name, cluster_queue=queue_name(tenant, name)))
    return QuotaConfig(cluster_queues=tuple(cluster_queues), local_queues=tuple(local_queues))
