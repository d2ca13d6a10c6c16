"""History route: the pool's allocation, pending demand, per-device utilisation and per-tenant usage
over the last hour, day or week (the dashboard's charts)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from gpupool.api.common import ErrorBody
from gpupool.api.history import HistoryOut
from gpupool.server.deps import Rt, Who
from gpupool.server.services import history as service

router = APIRouter(tags=["history"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody},
                                                422: {"model": ErrorBody}})


@router.get("/history", response_model=HistoryOut)
def read_history(
    rt: Rt, who: Who,
    metric: Annotated[Literal["tenants", "allocation", "pending", "devices"], Query(description=(
        "tenants: devices allocated per tenant (a tenant's token: its own only); allocation, pending, "
        "devices: the whole pool, the admin's"))] = "tenants",
    range: Annotated[Literal["1h", "24h", "7d"], Query(description="how far back")] = "1h",
) -> HistoryOut:
    return service.query(rt, who, metric, range, rt.clock())
