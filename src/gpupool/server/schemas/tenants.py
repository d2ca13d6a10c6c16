"""API models for tenants, their queues (with quotas) and their bearer tokens."""

from __future__ import annotations

from pydantic import Field

from gpupool.server.schemas.common import Name, Strict


class TenantCreate(Strict):
    name: Name


class TenantOut(Strict):
    name: str
    created_s: float
    queues: list[str]


class QueueCreate(Strict):
    tenant: Name
    name: Name
    quota_gpus: float | None = Field(
        None, ge=0, le=1_000_000, description="devices its admitted work may hold at once; null = no cap"
    )


class QueueUpdate(Strict):
    quota_gpus: float | None = Field(None, ge=0, le=1_000_000)


class QueueOut(Strict):
    tenant: str
    name: str
    quota_gpus: float | None
    used_gpus: float
    pending: int
    running: int


class TokenCreate(Strict):
    tenant: Name | None = Field(None, description="the tenant it acts for; null makes an admin token")
    name: str = Field("", max_length=63, pattern=r"^[A-Za-z0-9._-]*$")


class TokenOut(Strict):
    id: str
    tenant: str | None
    name: str
    token: str = Field(description="shown once; only its hash is stored")
