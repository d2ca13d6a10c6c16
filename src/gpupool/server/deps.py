"""FastAPI dependencies: the runtime of this app and the caller's principal."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gpupool.server.auth import Principal
from gpupool.server.runtime import Runtime


def runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


def principal(request: Request) -> Principal:
    rt: Runtime = request.app.state.runtime
    return rt.auth.principal(request.headers.get("authorization"))


Rt = Annotated[Runtime, Depends(runtime)]
Who = Annotated[Principal, Depends(principal)]
