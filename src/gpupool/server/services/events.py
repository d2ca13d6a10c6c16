"""Record workload state transitions: every change of status goes through `transition`."""

from __future__ import annotations

from sqlalchemy.orm import Session

from gpupool.server.orm import EventRow, WorkloadRow


def transition(
    session: Session, row: WorkloadRow, to_status: str, reason: str, message: str, at_s: float,
    pod_id: str = "",
) -> None:
    """Move `row` to `to_status` and append the event (in the caller's transaction)."""
    session.add(
        EventRow(
            workload_id=row.id,
            pod_id=pod_id,
            from_status=row.status,
            to_status=to_status,
            reason=reason,
            message=message[:1024],
            at_s=at_s,
        )
    )
    row.status = to_status
    row.reason = reason
    row.message = message[:1024]
