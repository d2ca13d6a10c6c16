"""The scheduling configuration the running pool uses (admin only: it names every tenant's queues)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gpupool.api.common import ErrorBody
from gpupool.server.deps import Rt, Who

router = APIRouter(tags=["config"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}})


@router.get("/config")
def get_config(rt: Rt, who: Who) -> dict[str, Any]:
    """The pool's effective configuration (its file's values over the defaults), as `gpupool config
    show` prints it; `scheduling.placement` is what `gpupool up --policy` chose when it was given."""
    who.require_admin()
    effective = rt.config.model_dump(mode="json")
    if rt.settings.placement:
        effective["scheduling"]["placement"] = rt.settings.placement
        effective["scheduling"]["placement_options"] = {}
    return effective
