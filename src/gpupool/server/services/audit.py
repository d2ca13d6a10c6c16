"""The audit log: record an admin action in the transaction that makes it, and read the log back."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.api.audit import AuditOut
from gpupool.providers.base import Capability
from gpupool.server.auth import Principal
from gpupool.server.orm import AuditRow
from gpupool.server.runtime import Runtime

MAX_LIMIT = 10_000
UNENFORCED_ACTION = "isolation.unenforced"
START_ACTOR = Principal(token_id="", tenant=None, remote="start-up")
_LAYERS = {Capability.USER_ISOLATION: "accounts", Capability.MPS: "device_limits",
           Capability.CGROUPS: "host_limits", Capability.HIDDEN_PROCESSES: "proc",
           Capability.NETWORK_ISOLATION: "network"}
"""The isolation layers of `gpupool node ls` a provider can lack, by the capability that holds them."""


def record(session: Session, who: Principal, action: str, target: str, now: float, detail: str = "") -> None:
    """Add one audit row for `who` doing `action` to `target` (committed with the change itself)."""
    session.add(AuditRow(at_s=now, actor=who.actor, token_id=who.token_id, action=action,
                         target=target[:255], detail=detail[:1024], remote=who.remote[:64], count=1))


def record_unenforced_layers(rt: Runtime) -> list[str]:
    """At start-up: one `isolation.unenforced` row per isolation layer the pool's nodes do not
    enforce (target: the layer as `gpupool node ls` names it; detail: why), so the log keeps what
    the pool could not hold while it ran. Returns the layers recorded."""
    missing = rt.provider.missing_capabilities()
    if Capability.REAL_PROCESSES in missing:
        rows = [("all", missing[Capability.REAL_PROCESSES])]
    else:
        rows = [(layer, missing[cap]) for cap, layer in _LAYERS.items() if cap in missing]
    if rows:
        now = rt.clock()
        with rt.store.write() as session:
            for layer, why in rows:
                record(session, START_ACTOR, UNENFORCED_ACTION, layer, now, why)
    return [layer for layer, _ in rows]


def entries(rt: Runtime, who: Principal, since_s: float | None, limit: int) -> list[AuditOut]:
    """The newest `limit` rows at or after `since_s`, newest first (admin only)."""
    who.require_admin()
    rt.auth.flush()  # refused logins still held in memory are part of the answer
    query = select(AuditRow).order_by(AuditRow.at_s.desc(), AuditRow.id.desc()).limit(limit)
    if since_s is not None:
        query = query.where(AuditRow.at_s >= since_s)
    with rt.store.read() as session:
        return [AuditOut(id=r.id, at_s=r.at_s, actor=r.actor, token_id=r.token_id, action=r.action,
                         target=r.target, detail=r.detail, remote=r.remote, count=r.count)
                for r in session.scalars(query)]
