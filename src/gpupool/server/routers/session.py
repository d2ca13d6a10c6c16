"""GET /api/v1/whoami: what the caller's token is, so a client (the dashboard) need not probe."""

from __future__ import annotations

from fastapi import APIRouter

from gpupool.api.common import ErrorBody
from gpupool.api.session import WhoAmI
from gpupool.server.deps import Who

router = APIRouter(tags=["session"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}})


@router.get("/whoami", response_model=WhoAmI)
async def whoami(who: Who) -> WhoAmI:
    return WhoAmI(admin=who.is_admin, tenant=who.tenant, token_id=who.token_id)
