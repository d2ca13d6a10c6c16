"""The contract between the services' controller and their data plane (the router, the autoscaler):
where a service's ready replicas answer, and the one way to change how many it should have.

Both take the caller's session, so a reader joins its own transaction; `set_desired` is a
compare-and-set on the service row's version (concurrent writers on PostgreSQL: one wins, the
others are told and read again).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpupool.core.model import WorkloadStatus
from gpupool.server.orm import ServiceEventRow, ServiceReplicaRow, ServiceRow, WorkloadRow

READY = "ready"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One ready replica: the workload that runs it and where it answers."""

    workload_id: str
    host: str
    port: int


def ready_endpoints(session: Session, service_id: str) -> list[Endpoint]:
    """The replicas of the service whose readiness probe passes and whose workload runs, by workload
    id (a stable order for the router's backends). Empty for an unknown service."""
    rows = session.execute(
        select(ServiceReplicaRow.workload_id, ServiceReplicaRow.host, ServiceReplicaRow.port)
        .join(WorkloadRow, WorkloadRow.id == ServiceReplicaRow.workload_id)
        .where(ServiceReplicaRow.service_id == service_id, ServiceReplicaRow.ready == READY,
               ServiceReplicaRow.host != "", WorkloadRow.status == WorkloadStatus.RUNNING.value)
        .order_by(ServiceReplicaRow.workload_id))
    return [Endpoint(workload_id=w, host=h, port=p) for w, h, p in rows]


def clamp(n: int, low: int, high: int) -> int:
    return max(low, min(high, n))


def set_desired(session: Session, service_id: str, n: int, reason: str, expected_version: int,
                *, now: float | None = None) -> bool:
    """Set the service's desired replicas to `n` clamped to its [min, max], only if its row is still
    at `expected_version` (it then moves to the next version); writes the event `scaled A → B:
    <reason>` when the count changes. False when the row moved on (or the service is gone): read it
    again and decide anew. Nothing is written then."""
    row = session.execute(select(ServiceRow.desired, ServiceRow.min_replicas, ServiceRow.max_replicas,
                                 ServiceRow.version, ServiceRow.state)
                          .where(ServiceRow.id == service_id)).first()
    if row is None or row.version != expected_version or row.state == "deleting":
        return False
    target = clamp(n, row.min_replicas, row.max_replicas)
    if target == row.desired:
        return True
    at = now if now is not None else _now()
    changed = session.connection().execute(
        update(ServiceRow).where(ServiceRow.id == service_id, ServiceRow.version == expected_version)
        .values(desired=target, version=expected_version + 1, updated_s=at)).rowcount
    if changed != 1:
        return False
    message = f"scaled {row.desired} → {target}: {reason}" if reason else f"scaled {row.desired} → {target}"
    session.add(ServiceEventRow(service_id=service_id, reason="scaled", message=message[:1024], at_s=at))
    return True


def _now() -> float:
    import time

    return time.time()
