"""The order in which a transaction takes row locks: a workload's row before its pods' rows.

A cancel (and a drain, a time limit, a requeue) locks the workload's row first and then stops its
pods. A transaction of the control loop that writes pods first and their workloads after (a launch
recorded, pods settled from the provider's poll, waiting pods promoted, lost nodes) would take the
same two locks the other way round; on PostgreSQL, where both run at once, each then waits for the
other and the database aborts one of them ("deadlock detected": a 503 for the user's cancel, or the
loop's whole write undone). Such a transaction locks the workloads' rows first, with
`lock_workloads`, in id order (the order `cancel_array` takes them in). SQLite writes one
transaction at a time and ignores the lock clause.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import ColumnElement, Connection, Select, bindparam, select
from sqlalchemy.orm import InstrumentedAttribute

from gpupool.server.orm import WorkloadRow

if TYPE_CHECKING:
    from gpupool.server.auth import Principal

Q = TypeVar("Q", bound=Select[*tuple[Any, ...]])

_LOCK = (select(WorkloadRow.id).where(WorkloadRow.id.in_(bindparam("ids", expanding=True)))
         .order_by(WorkloadRow.id).with_for_update(key_share=True))
"""Built once: the control loop locks at every write, and building a statement costs more CPU than
running this one."""


def lock_workloads(conn: Connection, workload_ids: Collection[str]) -> None:
    """Lock these workloads' rows (FOR NO KEY UPDATE, in id order) until the transaction ends."""
    if workload_ids:
        conn.execute(_LOCK, {"ids": sorted(workload_ids)})


def own_rows(query: Q, who: Principal, tenant: ColumnElement[str] | InstrumentedAttribute[str]) -> Q:
    """`query` limited to the rows of `who`'s tenant where `who` is a tenant (the admin's: as it is),
    for a locking read by an id the caller gave: another tenant's id then locks nothing of its
    owner's (on PostgreSQL a row lock holds up every writer of the row, the scheduler's included)."""
    return query if who.is_admin else query.where(tenant == who.tenant)
