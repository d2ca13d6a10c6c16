"""Remote-call routes: a tenant opens sessions and submits calls; a worker pod takes calls and answers.

Waiting is done here, on the event loop (long polls hold no thread): a route waits on an in-process
wake-up (a call submitted, answered or cancelled through this process) and looks at the store again
at least every RECHECK_S, so calls handled by another server process sharing the store are seen too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Annotated, TypeVar

from anyio import to_thread
from fastapi import APIRouter, Path, Query, Request

from gpupool.api.calls import (
    MAX_WAIT_S,
    CallCreate,
    CallOut,
    SessionCreate,
    SessionOut,
    WorkerAsk,
    WorkerWork,
)
from gpupool.api.common import ErrorBody
from gpupool.server.auth import Principal
from gpupool.server.deps import Rt, Who
from gpupool.server.runtime import Runtime
from gpupool.server.services import calls as service

RECHECK_S = 1.0
T = TypeVar("T")
_ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorBody}, 403: {"model": ErrorBody}, 404: {"model": ErrorBody}, 422: {"model": ErrorBody}
}
router = APIRouter(prefix="/calls", tags=["calls"], responses=_ERRORS)
Id = Annotated[str, Path(min_length=1, max_length=64)]
WaitS = Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="wait up to this long for the answer")]


class Wake(asyncio.Event):
    """A wake-up, with what the waker already knows (a call's final state), if anything."""

    def __init__(self) -> None:
        super().__init__()
        self.value: CallOut | None = None


class CallBroker:
    """Wake-ups for this process's long polls, keyed by ("session", id) and ("call", id)."""

    def __init__(self) -> None:
        self._waiting: dict[tuple[str, str], set[Wake]] = {}

    def listen(self, key: tuple[str, str]) -> Wake:
        event = Wake()
        self._waiting.setdefault(key, set()).add(event)
        return event

    def forget(self, key: tuple[str, str], event: Wake) -> None:
        events = self._waiting.get(key)
        if events is not None:
            events.discard(event)
            if not events:
                del self._waiting[key]

    def notify(self, key: tuple[str, str], value: CallOut | None = None) -> None:
        for event in self._waiting.get(key, ()):
            event.value = value
            event.set()


def _broker(request: Request) -> CallBroker:
    broker: CallBroker | None = getattr(request.app.state, "call_broker", None)
    if broker is None:
        broker = request.app.state.call_broker = CallBroker()
    return broker


async def _run(fn: Callable[..., T], *args: object) -> T:
    return await to_thread.run_sync(lambda: fn(*args))


async def _until(broker: CallBroker, key: tuple[str, str], wait_s: float,
                 look: Callable[[], T | None], *, event: Wake | None = None,
                 known: Callable[[Wake], T | None] = lambda _: None) -> T | None:
    """`look()` (in a thread) until it gives something or `wait_s` passed, waking on `key`. With
    `event` (listened to before what was just seen), wait on it before the first look. `known`
    takes what a wake-up brought instead of looking, when it brought enough."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        if event is None:
            event = broker.listen(key)  # before looking, so a wake-up in between is not missed
            try:
                found = await _run(look)
            except BaseException:
                broker.forget(key, event)
                raise
            remaining = deadline - loop.time()
            if found is not None or remaining <= 0:
                broker.forget(key, event)
                return found
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), max(0.0, min(deadline - loop.time(), RECHECK_S)))
        finally:
            broker.forget(key, event)
        brought = known(event)
        if brought is not None:
            return brought
        event = None


async def _call_when_final(rt: Runtime, broker: CallBroker, who: Principal, call_id: str,
                           wait_s: float, *, seen: CallOut | None = None,
                           event: Wake | None = None) -> CallOut:
    """The call once final, or as it is after wait_s. `seen` with its `event`: the call was just
    read (or made) with `event` already listening, so the first look waits for a wake-up."""
    last: list[CallOut] = [seen] if seen is not None else []

    def look() -> CallOut | None:
        out = service.get_call(rt, who, call_id)
        last[:] = [out]
        return out if out.status.is_final else None

    def brought(wake: Wake) -> CallOut | None:
        return wake.value if wake.value is not None and wake.value.status.is_final else None

    found = await _until(broker, ("call", call_id), wait_s, look, event=event, known=brought)
    return found or last[0]


# ---------------------------------------------------------------------- the tenant's routes

@router.post("/sessions", status_code=201, response_model=SessionOut,
             responses={409: {"model": ErrorBody}, 429: {"model": ErrorBody}})
async def open_session(body: SessionCreate, rt: Rt, who: Who) -> SessionOut:
    """A function workload (refused with a sentence when this client's Python differs from the pool's)."""
    return await _run(service.open_session, rt, who, body)


@router.get("/sessions/{session_id}", response_model=SessionOut)
async def get_session(session_id: Id, rt: Rt, who: Who) -> SessionOut:
    return await _run(service.get_session, rt, who, session_id)


@router.post("/sessions/{session_id}/calls", status_code=201, response_model=CallOut,
             responses={409: {"model": ErrorBody}})
async def submit_call(session_id: Id, body: CallCreate, request: Request, rt: Rt, who: Who,
                      wait_s: WaitS = 0.0) -> CallOut:
    """Queue a call on the session's worker; with wait_s, answer once it is done (or wait_s passed)."""
    out = await _run(service.submit_call, rt, who, session_id, body)
    broker = _broker(request)
    if wait_s <= 0:
        broker.notify(("session", session_id))
        return out
    answered = broker.listen(("call", out.id))  # before the worker is woken: its answer is not missed
    broker.notify(("session", session_id))
    return await _call_when_final(rt, broker, who, out.id, wait_s, seen=out, event=answered)


@router.post("/sessions/{session_id}/close", response_model=SessionOut)
async def close_session(session_id: Id, request: Request, rt: Rt, who: Who) -> SessionOut:
    """No more calls: the worker stops once the queued ones are answered."""
    out = await _run(service.close_session, rt, who, session_id)
    _broker(request).notify(("session", session_id))
    return out


@router.get("/{call_id}", response_model=CallOut)
async def get_call(call_id: Id, request: Request, rt: Rt, who: Who, wait_s: WaitS = 0.0) -> CallOut:
    """The call, with its pickled result or exception once done (waiting up to wait_s for that)."""
    return await _call_when_final(rt, _broker(request), who, call_id, wait_s)


@router.post("/{call_id}/cancel", response_model=CallOut)
async def cancel_call(call_id: Id, request: Request, rt: Rt, who: Who) -> CallOut:
    """Cancel it; a one-shot call or a running one cancels its workload too."""
    out = await _run(service.cancel_call, rt, who, call_id)
    broker = _broker(request)
    broker.notify(("call", call_id))
    broker.notify(("session", out.session_id))
    return out


# ---------------------------------------------------------------------- the worker pod's route

@router.post("/worker/next", response_model=WorkerWork, include_in_schema=False)
async def worker_next(body: WorkerAsk, request: Request, rt: Rt) -> WorkerWork:
    """For worker pods only (their call token): answer the call just run, take the next one."""
    authorization = request.headers.get("authorization")
    pod = service.known_worker_pod(rt, authorization)  # no thread hop for a pod seen just now
    if pod is None:
        pod = await _run(service.worker_pod, rt, authorization)
    broker = _broker(request)
    key = ("session", pod.session_id)
    event = broker.listen(key)  # before looking, so a call submitted meanwhile wakes it

    def answer_then_look() -> tuple[CallOut | None, WorkerWork | None]:
        answered = None if body.done is None else service.finish_call(rt, pod, body.done)
        return answered, service.next_call(rt, pod)

    try:
        answered, work = await _run(answer_then_look)
    except BaseException:
        broker.forget(key, event)
        raise
    if answered is not None:
        broker.notify(("call", answered.id), answered)  # its waiting caller needs no store read
    if work is not None or body.wait_s <= 0:
        broker.forget(key, event)
        return work or WorkerWork()
    work = await _until(broker, key, body.wait_s, lambda: service.next_call(rt, pod), event=event)
    return work or WorkerWork()
