"""Event stream route: the events of the caller's workloads as server-sent events (`gpupool events -f`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.sse import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from gpupool.api.common import ErrorBody
from gpupool.errors import InvalidInput
from gpupool.server.deps import Rt, Who
from gpupool.server.runtime import Runtime
from gpupool.server.services import event_stream as service
from gpupool.server.services.event_tail import EventTail

router = APIRouter(prefix="/events", tags=["events"], responses={
    401: {"model": ErrorBody}, 404: {"model": ErrorBody}, 422: {"model": ErrorBody}})

POLL_S = 0.1
"""How often a following stream looks for new events; the server's streams share one read of the
table per interval (services/event_tail.py)."""


async def _filter(
    rt: Rt, who: Who,
    tenant: Annotated[str | None, Query(max_length=63, description=(
        "admin: only this tenant's events; a tenant token always sees only its own"))] = None,
    workload: Annotated[list[str] | None, Query(max_length=service.MAX_WORKLOADS, description=(
        "only these workloads' events (repeatable)"))] = None,
) -> service.StreamFilter:
    """Checked before the stream starts, so a bad filter is an ordinary 404/422 answer."""
    return await run_in_threadpool(service.stream_filter, rt, who, tenant, workload or [])


async def _resume(
    after: Annotated[int | None, Query(ge=0, le=2**62, description=(
        "send events with a larger id (the SSE Last-Event-ID header wins); default: every stored "
        "event, or with follow only new ones"))] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=40)] = None,
) -> int | None:
    """The id to resume after, checked before the stream starts (None: the route's default)."""
    if last_event_id is None:
        return after
    try:
        return max(0, int(last_event_id.strip()))
    except ValueError:
        raise InvalidInput(f"Last-Event-ID {last_event_id[:40]!r} is not an event id; resume with the id "
                           "of the last event received.") from None


def _tail(request: Request, rt: Runtime) -> EventTail:
    """The server's one tail of new events, which its following streams share."""
    tail: EventTail | None = getattr(request.app.state, "event_tail", None)
    if tail is None:
        tail = request.app.state.event_tail = EventTail(rt, max_age_s=POLL_S)
    return tail


@router.get("/stream", response_class=EventSourceResponse)
async def stream(
    request: Request, rt: Rt,
    wanted: Annotated[service.StreamFilter, Depends(_filter)],
    start: Annotated[int | None, Depends(_resume)],
    follow: Annotated[bool, Query(description=(
        "keep the stream open and send new events as they are stored; false: end after those stored "
        "now"))] = False,
) -> AsyncIterator[ServerSentEvent]:
    """Workload events as server-sent events, oldest first: `id` is the event's id, `event` its new
    status, `data` the event (as `GET /workloads/{id}/events` gives it). A tenant token sees only
    its tenant's events. Reconnect with Last-Event-ID to resume without a gap or a repeat."""
    if start is None:
        start = await run_in_threadpool(service.newest_id, rt) if follow else 0
    stopping: Callable[[], bool] = request.app.state.stopping
    cursor = service.Cursor(done=start)
    yield ServerSentEvent(id=str(start), comment="start")  # where a reconnect resumes before any event
    tail = _tail(request, rt) if follow else None
    while not stopping():  # the server's shutdown ends every stream within POLL_S
        before = cursor.done
        if tail is not None:
            await tail.refresh()
        page = tail.page(wanted, cursor.done) if tail is not None else None
        if page is None:  # a backlog (or a finite stream): from the table itself
            page = await run_in_threadpool(service.read_after, rt, wanted, cursor.done)
        for event in cursor.take(page, time.time()):
            yield ServerSentEvent(id=str(event.id), event=event.to_status or "event",
                                  raw_data=event.model_dump_json())
        if len(page.events) == service.PAGE and cursor.done > before:
            continue  # more stored: no wait
        if not follow and not cursor.gaps:
            return
        await anyio.sleep(POLL_S)
