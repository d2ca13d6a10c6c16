"""Usage route: metered slice-hours and their cost, grouped (admin: every tenant; a tenant: its own)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gpupool.api.common import ErrorBody
from gpupool.api.usage import UsageOut
from gpupool.server.deps import Rt, Who
from gpupool.server.services import usage as service

router = APIRouter(tags=["usage"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody},
                                              422: {"model": ErrorBody}})


@router.get("/usage", response_model=UsageOut, responses={404: {"model": ErrorBody}})
def get_usage(
    rt: Rt, who: Who,
    tenant: Annotated[str | None, Query(max_length=63,
                                        description="a tenant token may name only itself")] = None,
    since_s: Annotated[float | None, Query(ge=0, le=1e11,
                                           description="epoch seconds; default until - 30 days")] = None,
    until_s: Annotated[float | None, Query(ge=0, le=1e11, description="epoch seconds; default now")] = None,
    by: Annotated[str, Query(max_length=200, description="comma-separated: tenant, queue, model, "
                                                         "priority_class, node, day")] = "tenant",
) -> UsageOut:
    return service.usage(rt, who, tenant=tenant, since_s=since_s, until_s=until_s, by=by)
