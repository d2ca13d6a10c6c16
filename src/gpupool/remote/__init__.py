"""Remote functions: run Python functions on slices of the pool from any machine, GPU or not.

    import gpupool
    pool = gpupool.connect()                       # GPUPOOL_URL / GPUPOOL_TOKEN
    @pool.function(gpus=0.25, gpu_memory="8GiB", timeout="10m")
    def embed(batch): ...
    embed.remote(x).result(); list(embed.map(xs)); embed(x)
    with pool.session(gpus=0.25) as s: s.call(embed, x)

Names are imported on first use, so the worker (`python -m gpupool.remote.worker`) starts light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpupool.remote.errors import CallCancelled, RemoteCallError
    from gpupool.remote.function import RemoteFunction
    from gpupool.remote.future import CallFuture
    from gpupool.remote.pool import Pool, connect
    from gpupool.remote.session import Session

__all__ = ["CallCancelled", "CallFuture", "Pool", "RemoteCallError", "RemoteFunction", "Session", "connect"]
_WHERE = {"CallCancelled": "errors", "RemoteCallError": "errors", "RemoteFunction": "function",
          "CallFuture": "future", "Pool": "pool", "connect": "pool", "Session": "session"}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'gpupool.remote' has no attribute {name!r}")
    return getattr(importlib.import_module(f"gpupool.remote.{module}"), name)
