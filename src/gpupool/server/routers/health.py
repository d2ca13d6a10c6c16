"""GET /api/v1/health: is the server up, what provider, is the pool simulated (no token needed)."""

from __future__ import annotations

from fastapi import APIRouter

import gpupool
from gpupool.api.common import Health
from gpupool.server.deps import Rt

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health)
def health(rt: Rt) -> Health:
    return Health(status="ok", version=gpupool.__version__, provider=rt.provider.name,
                  simulated=rt.simulated, database=rt.store.engine.dialect.name)
