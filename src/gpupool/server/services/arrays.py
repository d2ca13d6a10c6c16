"""Array throttling (`--array 0-999%50`): which pending tasks must wait because their array already
has as many tasks holding slices as its limit allows.

Two queries whatever the number of pending ids: the throttled arrays' pending tasks among those ids
(with their index), and how many tasks of those arrays hold slices now (read through the status
index, so the count costs what is admitted or running, not the size of the arrays).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection

from sqlalchemy import Connection, func, select

from gpupool.core.model import WorkloadStatus
from gpupool.server.orm import WorkloadRow

HOLDING = (WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)
"""Statuses whose tasks hold slices and count against their array's limit."""
_CHUNK = 5000
"""Ids per IN list (well under SQLite's bound on the variables of one statement)."""


def throttled(conn: Connection, pending_ids: Collection[str]) -> set[str]:
    """The ids among `pending_ids` that must not be considered this cycle: for each array with a
    limit, its pending tasks beyond the room left (limit - tasks holding slices), the lowest indexes
    staying eligible first. Ids of lone workloads, and of arrays without a limit, are never returned."""
    ids = list(pending_ids)
    by_array: dict[str, list[tuple[int, str]]] = defaultdict(list)
    limits: dict[str, int] = {}
    for start in range(0, len(ids), _CHUNK):
        for row in conn.execute(
            select(WorkloadRow.id, WorkloadRow.array_id, WorkloadRow.array_index, WorkloadRow.array_limit)
            .where(WorkloadRow.id.in_(ids[start:start + _CHUNK]), WorkloadRow.array_limit.is_not(None),
                   WorkloadRow.status == WorkloadStatus.PENDING.value)
        ):
            by_array[row.array_id].append((row.array_index, row.id))
            limits[row.array_id] = row.array_limit
    if not by_array:
        return set()
    holding: dict[str | None, int] = {array_id: count for array_id, count in conn.execute(
        select(WorkloadRow.array_id, func.count())
        .where(WorkloadRow.status.in_(HOLDING), WorkloadRow.array_id.in_(list(by_array)))
        .group_by(WorkloadRow.array_id))}
    waiting: set[str] = set()
    for array_id, tasks in by_array.items():
        room = max(0, limits[array_id] - holding.get(array_id, 0))
        tasks.sort()
        waiting.update(task_id for _, task_id in tasks[room:])
    return waiting
