"""What the tests' live pools read back from the store: a workload's row, pods and events, each
read afresh in its own transaction (never through the loop's caches)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from gpupool.server.orm import EventRow, PodRow, WorkloadRow


class StoreReads:
    """Mixed into a test's pool, which sets `self.rt` (a server Runtime)."""

    rt: Any

    def row(self, workload_id: str) -> WorkloadRow:
        with self.rt.store.read() as session:
            row = session.get(WorkloadRow, workload_id)
            assert row is not None
            session.expunge(row)
            return row

    def pods(self, workload_id: str) -> list[PodRow]:
        with self.rt.store.read() as session:
            rows = list(session.scalars(select(PodRow).where(PodRow.workload_id == workload_id)))
            for row in rows:
                session.expunge(row)
            return rows

    def events(self, workload_id: str) -> list[tuple[str, str, str]]:
        """(to_status, reason, message) of each event, oldest first."""
        with self.rt.store.read() as session:
            return [(e.to_status, e.reason, e.message) for e in session.scalars(
                select(EventRow).where(EventRow.workload_id == workload_id).order_by(EventRow.id))]

    def last_event(self, workload_id: str) -> tuple[str, str, str]:
        events = self.events(workload_id)
        assert events, f"no events of {workload_id}"
        return events[-1]
