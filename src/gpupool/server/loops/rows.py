"""The reads the loop's parts share: workload states, tenants' Unix accounts, devices still held."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Row, bindparam, select

from gpupool.server.orm import Base, TenantRow
from gpupool.server.services.tenants import share_accounts
from gpupool.server.states import PodState

W = Base.metadata.tables["workloads"]
E = Base.metadata.tables["events"]
P = Base.metadata.tables["pods"]

# Built once (the loop reads them at every step; building a statement costs more than running these)
_STATES = select(W.c.id, W.c.status, W.c.attempt, W.c.reason, W.c.tenant).where(
    W.c.id.in_(bindparam("ids", expanding=True)))
_STATES_AND_SPECS = _STATES.add_columns(W.c.spec)
_UNIX_USERS = select(TenantRow.name, TenantRow.unix_user).where(
    TenantRow.name.in_(bindparam("tenants", expanding=True)))
_STOPPING = select(P.c.node, P.c.slices).where(P.c.status == PodState.STOPPING.value)


def states(conn: Connection, ids: Sequence[str], *, with_spec: bool) -> dict[str, Row[Any]]:
    """id, status, attempt, reason and tenant (and the spec, for launches) of the workloads `ids`,
    in one query."""
    if not ids:
        return {}
    query = _STATES_AND_SPECS if with_spec else _STATES
    return {r.id: r for r in conn.execute(query, {"ids": sorted(set(ids))})}


def unix_users(conn: Connection, tenants: set[str]) -> dict[str, str | None]:
    """The Unix account the admin mapped to each of `tenants` (None: the pool's own account), for
    pods this transaction writes: read under the accounts lock, shared (`share_accounts`), so that no
    change of a mapping commits between this read and the pods' commit."""
    if not tenants:
        return {}
    share_accounts(conn)
    return dict(conn.execute(_UNIX_USERS, {"tenants": sorted(tenants)}).all())


def busy_devices(conn: Connection) -> set[tuple[str, int]]:
    """(node, device index) of every device a stopping pod still holds."""
    busy: set[tuple[str, int]] = set()
    for node, slices in conn.execute(_STOPPING):
        busy.update((node, s["device_index"]) for s in slices)
    return busy
