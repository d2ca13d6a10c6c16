"""Audit route: read who did what and every refused authentication (admin)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gpupool.api.audit import AuditOut
from gpupool.api.common import ErrorBody
from gpupool.server.deps import Rt, Who
from gpupool.server.services import audit as service

router = APIRouter(tags=["audit"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody},
                                              422: {"model": ErrorBody}})


@router.get("/audit", response_model=list[AuditOut])
def list_audit(
    rt: Rt, who: Who,
    since_s: Annotated[float | None, Query(ge=0, le=1e11, description="epoch seconds")] = None,
    limit: Annotated[int, Query(ge=1, le=service.MAX_LIMIT)] = 100,
) -> list[AuditOut]:
    return service.entries(rt, who, since_s, limit)
