"""API models for the audit log: who did what to which target, when and from where."""

from __future__ import annotations

from pydantic import Field

from gpupool.api.common import Strict


class AuditOut(Strict):
    id: int
    at_s: float
    actor: str = Field(description='"admin", a tenant name, or "" when nobody was authenticated')
    token_id: str
    action: str = Field(description="e.g. tenant.create, queue.update, token.revoke, node.cordon, "
                                    "auth.refused")
    target: str
    detail: str
    remote: str = Field(description="the client's address when known")
    count: int = Field(description="events this row stands for (refused logins are coalesced)")
