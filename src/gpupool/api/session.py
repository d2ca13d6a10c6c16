"""API model for the caller's own identity (what a token is: the admin's or one tenant's)."""

from __future__ import annotations

from pydantic import Field

from gpupool.api.common import Strict


class WhoAmI(Strict):
    admin: bool = Field(description="true for an admin token: it sees and manages the whole pool")
    tenant: str | None = Field(description="the tenant a tenant token acts for; null for the admin")
    token_id: str = Field(description="the id of the token used (never its secret)")
