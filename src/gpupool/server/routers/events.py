"""Event stream route: the events of the caller's workloads as server-sent events (`gpupool events -f`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from gpupool.api.common import ErrorBody
from gpupool.errors import InvalidInput
from gpupool.server.deps import Rt, Who
from gpupool.server.runtime import Runtime
from gpupool.server.services import event_stream as service
from gpupool.server.services.event_tail import EventTail
from gpupool.server.serving import event_stream as service_events

router = APIRouter(prefix="/events", tags=["events"], responses={
    401: {"model": ErrorBody}, 404: {"model": ErrorBody}, 422: {"model": ErrorBody}})

KEEPALIVE_S = 15.0
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


MAX_EVENT_ID = 2**62
"""The largest id a stream resumes after (?after= and Last-Event-ID alike): within SQLite's INTEGER."""


async def _resume(
    after: Annotated[int | None, Query(ge=0, le=MAX_EVENT_ID, description=(
        "send events with a larger id (the SSE Last-Event-ID header wins); default: every stored "
        "event, or with follow only new ones"))] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=40)] = None,
) -> int | None:
    """The id to resume after, checked before the stream starts (None: the route's default)."""
    if last_event_id is None:
        return after
    try:
        resume = max(0, int(last_event_id.strip()))
    except ValueError:
        raise InvalidInput(f"Last-Event-ID {last_event_id[:40]!r} is not an event id; resume with the id "
                           "of the last event received.") from None
    if resume > MAX_EVENT_ID:
        raise InvalidInput(f"Last-Event-ID {last_event_id.strip()[:40]!r} is larger than any event id "
                           f"(at most {MAX_EVENT_ID}); resume with the id of the last event received.")
    return resume


def _tail(request: Request, rt: Runtime) -> EventTail:
    """The server's one tail of new events, which its following streams share."""
    tail: EventTail | None = getattr(request.app.state, "event_tail", None)
    if tail is None:
        tail = request.app.state.event_tail = EventTail(rt, max_age_s=POLL_S)
    return tail


@router.get("/stream", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}, "description": (
                "server-sent events: id (the event's), event (its new status), data (the event)")}})
async def stream(
    request: Request, rt: Rt,
    wanted: Annotated[service.StreamFilter, Depends(_filter)],
    start: Annotated[int | None, Depends(_resume)],
    follow: Annotated[bool, Query(description=(
        "keep the stream open and send new events as they are stored; false: end after those stored "
        "now"))] = False,
) -> StreamingResponse:
    """Workload events as server-sent events, oldest first: `id` is the event's id, `event` its new
    status, `data` the event (as `GET /workloads/{id}/events` gives it). A tenant token sees only
    its tenant's events. Reconnect with Last-Event-ID to resume without a gap or a repeat."""
    if start is None:
        start = await run_in_threadpool(service.newest_id, rt) if follow else 0
    tail = _tail(request, rt) if follow else None
    body = _events(rt, wanted, start, tail, request.app.state.stopping)
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _more_stored(page: service.Page[Any], before: int, cursor: service.Cursor) -> bool:
    """Whether more is stored past this read: it was a full page, or it stopped at its SCAN of ids (a
    tenant's events may lie past many ids of others', and a finite stream must not end before them)."""
    full = len(page.events) == service.PAGE
    return cursor.done > before and (full or page.scanned_to >= before + service.SCAN)


async def _events(rt: Runtime, wanted: service.StreamFilter, start: int, tail: EventTail | None,
                  stopping: Callable[[], bool]) -> AsyncIterator[bytes]:
    """The stream's bytes: each page's new events in one chunk (one send, however many events),
    a keep-alive comment after KEEPALIVE_S of silence; ends with a finite stream or the server."""
    cursor = service.Cursor(done=start)
    yield f": start\nid: {start}\n\n".encode()  # where a reconnect resumes before any event
    quiet_since = time.monotonic()
    while not stopping():  # the server's shutdown ends every stream within POLL_S
        before = cursor.done
        if tail is not None:
            await tail.refresh()
        page = tail.page(wanted, cursor.done) if tail is not None else None
        if page is None:  # a backlog (or a finite stream): from the table itself
            page = await run_in_threadpool(service.read_after, rt, wanted, cursor.done)
        fresh = cursor.take(page, time.time())
        if fresh:
            yield b"".join(tail.encoded(e) if tail is not None else service.encode(e) for e in fresh)
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= KEEPALIVE_S:
            yield b": keep-alive\n\n"  # proxies keep the connection; a gone client is noticed
            quiet_since = time.monotonic()
        if _more_stored(page, before, cursor):
            continue  # no wait
        if tail is None and not cursor.gaps:
            return
        await anyio.sleep(POLL_S)


# --- service events (`gpupool events --services`): a stream of their own, with its own ids ---
SERVICE_POLL_S = 0.5
"""Service events are rare (scale decisions, replacements): each following stream reads on its own."""


async def _service_filter(
    rt: Rt, who: Who,
    tenant: Annotated[str | None, Query(max_length=63, description=(
        "admin: only this tenant's services; a tenant token always sees only its own"))] = None,
    service_name: Annotated[list[str] | None, Query(alias="service", max_length=service_events.MAX_SERVICES,
                                                    description="only these services' events (repeatable)")]
    = None,
) -> service_events.ServiceFilter:
    return await run_in_threadpool(service_events.stream_filter, rt, who, tenant, service_name or [])


@router.get("/services/stream", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}, "description": (
                "server-sent events: id (the service event's), event `service`, data (the event)")}})
async def service_stream(
    request: Request, rt: Rt,
    wanted: Annotated[service_events.ServiceFilter, Depends(_service_filter)],
    start: Annotated[int | None, Depends(_resume)],
    follow: Annotated[bool, Query(description="keep the stream open and send new events as they are "
                                  "stored; false: end after those stored now")] = False,
) -> StreamingResponse:
    """Service events (scaled, cold starts, replicas replaced, rollout steps, degraded) as server-sent
    events, oldest first; a tenant token sees only its tenant's services. Ids are the service events'
    own (not the workload stream's): reconnect with Last-Event-ID to resume without a gap or repeat."""
    if start is None:
        start = await run_in_threadpool(service_events.newest_id, rt) if follow else 0
    body = _service_events(rt, wanted, start, follow, request.app.state.stopping)
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _service_events(rt: Runtime, wanted: service_events.ServiceFilter, start: int, follow: bool,
                          stopping: Callable[[], bool]) -> AsyncIterator[bytes]:
    cursor = service.Cursor(done=start)
    yield f": start\nid: {start}\n\n".encode()
    quiet_since = time.monotonic()
    while not stopping():
        before = cursor.done
        page = await run_in_threadpool(service_events.read_after, rt, wanted, cursor.done)
        fresh = cursor.take(page, time.time())
        if fresh:
            yield b"".join(service_events.encode(e) for e in fresh)
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= KEEPALIVE_S:
            yield b": keep-alive\n\n"
            quiet_since = time.monotonic()
        if _more_stored(page, before, cursor):
            continue
        if not follow and not cursor.gaps:
            return
        await anyio.sleep(SERVICE_POLL_S if follow else POLL_S)
