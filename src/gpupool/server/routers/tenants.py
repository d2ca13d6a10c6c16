"""Admin routes: tenants, queues with quotas and cohorts, tokens (tenants list and revoke their own)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from gpupool.api.common import NAME_PATTERN, ErrorBody
from gpupool.api.tenants import (
    QueueCreate,
    QueueOut,
    QueueUpdate,
    TenantCreate,
    TenantDeleted,
    TenantOut,
    TenantUpdate,
    TokenCreate,
    TokenInfo,
    TokenOut,
)
from gpupool.server.deps import Rt, Who
from gpupool.server.services import tenants as service
from gpupool.server.services import tokens

router = APIRouter(tags=["tenants"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody},
                                                422: {"model": ErrorBody}})
NameParam = Annotated[str, Path(min_length=1, max_length=63, pattern=NAME_PATTERN)]


@router.post("/tenants", status_code=201, response_model=TenantOut, responses={409: {"model": ErrorBody}})
def create_tenant(body: TenantCreate, rt: Rt, who: Who) -> TenantOut:
    return service.create_tenant(rt, who, body)


@router.patch("/tenants/{name}", response_model=TenantOut, responses={404: {"model": ErrorBody}})
def update_tenant(name: NameParam, body: TenantUpdate, rt: Rt, who: Who) -> TenantOut:
    return service.update_tenant(rt, who, name, body)


@router.delete("/tenants/{name}", response_model=TenantDeleted,
               responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
def delete_tenant(name: NameParam, rt: Rt, who: Who) -> TenantDeleted:
    """Delete a tenant with nothing unfinished (409 with what still runs): its queues, tokens and
    finished workloads, and the pool's Unix account of it on the nodes."""
    return service.delete_tenant(rt, who, name)


@router.get("/tenants", response_model=list[TenantOut])
def list_tenants(rt: Rt, who: Who) -> list[TenantOut]:
    return service.list_tenants(rt, who)


@router.post("/queues", status_code=201, response_model=QueueOut,
             responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
def create_queue(body: QueueCreate, rt: Rt, who: Who) -> QueueOut:
    return service.create_queue(rt, who, body)


@router.get("/queues", response_model=list[QueueOut], responses={404: {"model": ErrorBody}})
def list_queues(
    rt: Rt, who: Who, tenant: Annotated[str | None, Query(max_length=63)] = None
) -> list[QueueOut]:
    return service.list_queues(rt, who, tenant)


@router.patch("/queues/{tenant}/{name}", response_model=QueueOut, responses={404: {"model": ErrorBody}})
def update_queue(tenant: NameParam, name: NameParam, body: QueueUpdate, rt: Rt, who: Who) -> QueueOut:
    return service.update_queue(rt, who, tenant, name, body)


@router.post("/tokens", status_code=201, response_model=TokenOut,
             responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
def create_token(body: TokenCreate, rt: Rt, who: Who) -> TokenOut:
    return tokens.create_token(rt, who, body)


@router.get("/tokens", response_model=list[TokenInfo])
def list_tokens(
    rt: Rt, who: Who, tenant: Annotated[str | None, Query(max_length=63)] = None
) -> list[TokenInfo]:
    return tokens.list_tokens(rt, who, tenant)


@router.delete("/tokens/{token_id}", response_model=TokenInfo,
               responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
def revoke_token(token_id: Annotated[str, Path(min_length=1, max_length=64)], rt: Rt, who: Who) -> TokenInfo:
    return tokens.revoke_token(rt, who, token_id)
