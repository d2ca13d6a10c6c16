"""The servers sharing this pool's store and which one leads (admin only: it names addresses)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from sqlalchemy import select

import gpupool
from gpupool.api.common import ErrorBody
from gpupool.api.servers import ServerOut, ServersOut
from gpupool.server.deps import Rt, Who
from gpupool.server.leader import LEASE_ID, Leadership
from gpupool.server.orm import LeaderLeaseRow, ServerRow

router = APIRouter(tags=["servers"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}})


@router.get("/servers", response_model=ServersOut)
def list_servers(request: Request, rt: Rt, who: Who) -> ServersOut:
    """Every server that heartbeats into this store, the leader first (`gpupool server ls`). A
    single server (no --ha) lists itself, always the leader."""
    who.require_admin()
    leadership: Leadership | None = getattr(request.app.state, "leadership", None)
    if leadership is None:
        now = rt.clock()
        address = f"{rt.settings.host}:{rt.settings.port}"
        me = ServerOut(id="single", address=address, leader=True, epoch=None, lease_age_s=None,
                       version=gpupool.__version__, started_s=now, last_seen_s=now, this=True)
        return ServersOut(ha=False, leader=me.id, epoch=None, lease_expires_in_s=None, servers=[me])
    with rt.store.read() as session:
        lease = session.get(LeaderLeaseRow, LEASE_ID)
        rows = session.scalars(select(ServerRow).order_by(ServerRow.started_s)).all()
    # the clock read after the store: a lease renewed while the rows were read is not in the future
    return servers_out(lease, list(rows), rt.clock(), leadership.server_id)


def servers_out(lease: LeaderLeaseRow | None, rows: list[ServerRow], now: float, this_id: str) -> ServersOut:
    """The answer for servers sharing a store: the lease's holder leads while the lease runs. Ages
    are never negative: another server's clock may run a little ahead of this one's, so the lease
    it renewed can read as renewed a moment from now (said as just now)."""
    holder = lease.holder if lease is not None and lease.expires_s >= now else None
    age_s = max(0.0, round(now - lease.renewed_s, 3)) if lease is not None else None
    servers = [ServerOut(
        id=row.id, address=row.address, leader=row.id == holder,
        epoch=lease.epoch if lease is not None and row.id == holder else None,
        lease_age_s=age_s if row.id == holder else None,
        version=row.version, started_s=row.started_s, last_seen_s=row.seen_s,
        this=row.id == this_id) for row in rows]
    servers.sort(key=lambda s: not s.leader)
    return ServersOut(ha=True, leader=holder, epoch=lease.epoch if lease is not None else None,
                      lease_expires_in_s=round(lease.expires_s - now, 3) if lease is not None else None,
                      servers=servers)
