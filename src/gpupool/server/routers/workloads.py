"""Workload routes: submit, list, get, cancel, events, logs."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from gpupool.api.common import ErrorBody
from gpupool.api.workloads import (
    ArrayCancelled,
    EventOut,
    LogsOut,
    WorkloadCreated,
    WorkloadOut,
    WorkloadPage,
    WorkloadSpec,
    WorkloadUpdate,
)
from gpupool.errors import TooLarge
from gpupool.providers.base import MAX_CHECKPOINT_BYTES as MAX_ARCHIVE_BYTES
from gpupool.server.bodylimit import CHECKPOINT_BODY_BYTES
from gpupool.server.deps import Rt, Who, Writer
from gpupool.server.services import jobs, listing
from gpupool.server.services import logs as logs_service
from gpupool.server.services import workloads as service

_ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorBody}, 403: {"model": ErrorBody}, 422: {"model": ErrorBody}
}
router = APIRouter(prefix="/workloads", tags=["workloads"], responses=_ERRORS)
_ANY_CASE = "any case; several values or a comma list select any of them"
_KNOWN = _ANY_CASE + "; naming one that does not exist is 404"
WorkloadId = Annotated[str, Path(min_length=1, max_length=64)]


@router.post("", status_code=201, response_model=WorkloadCreated,
             responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
async def submit(spec: WorkloadSpec, rt: Rt, who: Who, writer: Writer, hold: Annotated[bool, Query(
        description="store it held (sbatch --hold): it waits until released")] = False) -> WorkloadCreated:
    # The hot path: validated here, stored by the group-commit writer thread (services/submit_writer.py)
    # so the event loop never waits on the store.
    return await service.submit_grouped(rt, writer, who, spec, hold=hold)


@router.get("", response_model=WorkloadPage, responses={404: {"model": ErrorBody}})
def list_workloads(
    rt: Rt, who: Who,
    status: Annotated[list[str] | None, Query(max_length=6, description=_ANY_CASE)] = None,
    tenant: Annotated[list[str] | None, Query(max_length=64, description=_KNOWN)] = None,
    queue: Annotated[list[str] | None, Query(max_length=64, description=_KNOWN)] = None,
    since_s: Annotated[float | None, Query(ge=0, le=1e11, description="submitted since (epoch)")] = None,
    fields: Annotated[Literal["all", "id"], Query(description="id: ids only, up to 10000 a page")] = "all",
    limit: Annotated[int, Query(ge=1, le=listing.MAX_ID_PAGE)] = 100,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
    id_prefix: Annotated[str | None, Query(max_length=64, description="ids starting with this")] = None,
    name: Annotated[str | None, Query(max_length=63, description="this exact name")] = None,
    array_id: Annotated[list[str] | None, Query(max_length=64, description=(
        "the tasks of these arrays, in index order (several values or a comma list)"))] = None,
    workload_id: Annotated[list[str] | None, Query(max_length=64, description=(
        "these workloads (with array_id: these and the arrays' tasks)"))] = None,
    full: Annotated[bool, Query(description=(
        "whole workloads, with their specs (command, environment); default: summaries"))] = False,
) -> WorkloadPage:
    return listing.list_workloads(rt, who, status=status or (), tenant=tenant or (), queue=queue or (),
                                  since_s=since_s, id_prefix=id_prefix or "", name=name, limit=limit,
                                  offset=offset, ids_only=fields == "id", array_id=array_id or (),
                                  workload_id=workload_id or (), full=full)


@router.post("/arrays/{array_id}/cancel", response_model=ArrayCancelled,
             responses={404: {"model": ErrorBody}})
def cancel_array(array_id: WorkloadId, rt: Rt, who: Who) -> ArrayCancelled:
    """Cancel every unfinished task of an array in one transaction (finished ones are left as they are)."""
    return service.cancel_array(rt, who, array_id)


@router.get("/{workload_id}", response_model=WorkloadOut, responses={404: {"model": ErrorBody}})
def get(workload_id: WorkloadId, rt: Rt, who: Who) -> WorkloadOut:
    return service.get(rt, who, workload_id)


@router.post("/{workload_id}/cancel", response_model=WorkloadOut,
             responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
def cancel(workload_id: WorkloadId, rt: Rt, who: Who) -> WorkloadOut:
    return service.cancel(rt, who, workload_id)


@router.post("/{workload_id}/hold", response_model=WorkloadOut,
             responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
def hold(workload_id: WorkloadId, rt: Rt, who: Who) -> WorkloadOut:
    """Keep a pending workload from being placed until it is released."""
    return jobs.hold(rt, who, workload_id)


@router.post("/{workload_id}/release", response_model=WorkloadOut,
             responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
def release(workload_id: WorkloadId, rt: Rt, who: Who) -> WorkloadOut:
    """Let a held workload be placed (a hold the admin set only the admin releases)."""
    return jobs.release(rt, who, workload_id)


@router.patch("/{workload_id}", response_model=WorkloadOut,
              responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
def update(workload_id: WorkloadId, change: WorkloadUpdate, rt: Rt, who: Who) -> WorkloadOut:
    """Change a pending workload's priority, time limit, gpus or replicas (409 once admitted)."""
    return jobs.update(rt, who, workload_id, change)


@router.post("/{workload_id}/requeue", response_model=WorkloadOut,
             responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
def requeue(
    workload_id: WorkloadId, rt: Rt, who: Who,
    hold: Annotated[bool, Query(description="wait held once back in pending")] = False,
) -> WorkloadOut:
    """Stop an admitted or running workload and send it back to pending."""
    return jobs.requeue(rt, who, workload_id, hold_after=hold)


@router.get("/{workload_id}/checkpoint", responses={404: {"model": ErrorBody}, 413: {"model": ErrorBody},
                                                   429: {"model": ErrorBody}},
            response_class=Response)
def read_checkpoint(
    workload_id: WorkloadId, rt: Rt, who: Who,
    since_s: Annotated[float | None, Query(ge=0, le=1e11, description="304 unless marked after it")] = None,
    max_bytes: Annotated[int, Query(ge=1, le=MAX_ARCHIVE_BYTES)] = MAX_ARCHIVE_BYTES,
) -> Response:
    """Its checkpoint directory as a tar (files and directories; links left out), the mark's time in
    X-Gpupool-Checkpoint-Mark; 204 when it has none. A federation hub carries it to another member."""
    found = jobs.read_checkpoint(rt, who, workload_id, since_s, max_bytes)
    if found is None:
        return Response(status_code=204)
    mark, data = found
    if data is None:
        return Response(status_code=304)
    return Response(data, media_type="application/x-tar",
                    headers={"X-Gpupool-Checkpoint-Mark": "" if mark is None else repr(mark)})


async def read_bounded(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) past `limit` bytes before more is read."""
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"A checkpoint may hold at most {limit / 2**20:g} MiB.")
        parts.append(chunk)
    return b"".join(parts)


@router.put("/{workload_id}/checkpoint", response_model=WorkloadOut,
            responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}, 413: {"model": ErrorBody},
                       429: {"model": ErrorBody}})
async def seed_checkpoint(workload_id: WorkloadId, rt: Rt, who: Who, request: Request) -> WorkloadOut:
    """Fill the checkpoint directory of a held workload that never ran with a tar from GET .../checkpoint
    (a federation hub resumes work moved off another member from it); 409 once it ran or has one."""
    await run_in_threadpool(jobs.check_seedable, rt, who, workload_id)  # before a byte of the archive
    give_back = jobs.checkpoint_slot(rt, who)
    try:
        data = await read_bounded(request, CHECKPOINT_BODY_BYTES)
        return await run_in_threadpool(jobs.seed_checkpoint, rt, who, workload_id, data)
    finally:
        give_back()


@router.get("/{workload_id}/events", response_model=list[EventOut], responses={404: {"model": ErrorBody}})
def events(workload_id: WorkloadId, rt: Rt, who: Who) -> list[EventOut]:
    return service.events(rt, who, workload_id)


@router.get("/{workload_id}/logs", response_model=LogsOut, responses={404: {"model": ErrorBody}})
def logs(
    workload_id: WorkloadId, rt: Rt, who: Who,
    rank: Annotated[int, Query(ge=0, le=100_000)] = 0,
    offset: Annotated[int, Query(ge=0, le=2**53)] = 0,
    stream: Annotated[Literal["stdout", "stderr", "notes"], Query(
        description="notes: what the pool says about the pod (where it runs, and why)")] = "stdout",
    attempt: Annotated[int | None, Query(ge=1, le=2**31, description=(
        "which attempt's log (default: the newest); each attempt keeps its own"))] = None,
    all_attempts: Annotated[bool, Query(description=(
        "every attempt's log from its start, in `parts`, oldest first (the newest 16)"))] = False,
) -> LogsOut:
    """A pod's log from `offset`: its newest attempt's, or `attempt`'s, or with `all_attempts` each one's."""
    return logs_service.read(rt, who, workload_id, rank=rank, offset=offset, stream=stream, attempt=attempt,
                             all_attempts=all_attempts)
