"""FastAPI dependencies: the runtime of this app and the caller's principal."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gpupool.server.auth import ON_BEHALF_HEADER, Principal
from gpupool.server.runtime import Runtime
from gpupool.server.services.submit_writer import SubmitWriter


# Async so FastAPI resolves them on the event loop instead of hopping to a worker thread each;
# neither blocks (token lookups are cached after the first).
async def runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


async def principal(request: Request) -> Principal:
    rt: Runtime = request.app.state.runtime
    client = request.client  # its address goes to the audit log (refusals, admin actions)
    who = rt.auth.principal(request.headers.get("authorization"), remote=client.host if client else "",
                            route=(request.method, request.url.path),
                            on_behalf=request.headers.get(ON_BEHALF_HEADER))
    request.state.principal = who  # a 403 this request ends with is audited as this caller's
    return who


async def submit_writer(request: Request) -> SubmitWriter:
    writer: SubmitWriter = request.app.state.submit_writer
    return writer


Rt = Annotated[Runtime, Depends(runtime)]
Who = Annotated[Principal, Depends(principal)]
Writer = Annotated[SubmitWriter, Depends(submit_writer)]
