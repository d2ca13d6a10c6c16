"""A tenant's secrets: create, list (names and keys only) and delete; no route ever returns a value."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from gpupool.api.common import NAME_PATTERN, ErrorBody
from gpupool.api.secrets import SecretCreate, SecretDeleted, SecretOut
from gpupool.server.deps import Rt, Who
from gpupool.server.services import secrets as service

router = APIRouter(tags=["secrets"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody},
                                                422: {"model": ErrorBody}})
NameParam = Annotated[str, Path(min_length=1, max_length=63, pattern=NAME_PATTERN)]
TenantQuery = Annotated[str | None, Query(max_length=63, description="admin only: whose secrets")]


@router.post("/secrets", status_code=201, response_model=SecretOut,
             responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
def create_secret(body: SecretCreate, rt: Rt, who: Who) -> SecretOut:
    """Store a secret of the caller's tenant (the admin: of `tenant`), sealed with the pool's key."""
    return service.create(rt, who, body)


@router.get("/secrets", response_model=list[SecretOut])
def list_secrets(rt: Rt, who: Who, tenant: TenantQuery = None) -> list[SecretOut]:
    """The caller's secrets (names, keys, times); the admin's: every tenant's, or `tenant`'s."""
    return service.list_secrets(rt, who, tenant)


@router.delete("/secrets/{name}", response_model=SecretDeleted, responses={404: {"model": ErrorBody}})
def delete_secret(name: NameParam, rt: Rt, who: Who, tenant: TenantQuery = None) -> SecretDeleted:
    """Delete one of the caller's secrets (the admin: of `tenant`, default `default`); pods already
    started keep what they were given."""
    return service.delete_secret(rt, who, name, tenant)
