"""A warm slice for many calls: one function workload whose worker runs the calls one after another."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from gpupool.remote.future import POLL_S, CallFuture
from gpupool.remote.options import Options
from gpupool.remote.payload import dump_call

if TYPE_CHECKING:
    from gpupool.remote.pool import Pool

R = TypeVar("R")
MAP_WINDOW = 64
"""map() keeps at most this many calls queued ahead of the results it has handed back."""


def plain(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The Python function itself (a RemoteFunction's, or `fn`)."""
    return getattr(fn, "local_function", fn)


class Session:
    """Opened on creation (its workload is submitted: the slice warms up while you prepare calls);
    `id` is its workload's id (`gpupool logs ID`, `gpupool show ID`). Close it, or use `with`."""

    def __init__(self, pool: Pool, options: Options, *, _first: str | None = None) -> None:
        self._pool = pool
        opened = pool._open_session(options.session_body(one_shot=_first is not None, payload=_first))
        self.id: str = opened["id"]
        self.first_call: dict[str, Any] | None = opened.get("call")
        self.closed = False

    @property
    def workload_id(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"<Session {self.id}{' closed' if self.closed else ''}>"

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> CallFuture[R]:
        """Queue `fn(*args, **kwargs)` on this session's worker; returns at once."""
        call = self._pool._submit_call(self.id, dump_call(plain(fn), args, kwargs), 0.0)
        return CallFuture(self._pool, call)

    def call(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        """Run `fn(*args, **kwargs)` on this session's worker and return what it returns (raise
        what it raises): one request when the answer comes within POLL_S."""
        call = self._pool._submit_call(self.id, dump_call(plain(fn), args, kwargs), POLL_S)
        return CallFuture[R](self._pool, call).result()

    def map(self, fn: Callable[..., R], *iterables: Iterable[Any]) -> Iterator[R]:
        """fn over the items (zipped like map()), results in input order, MAP_WINDOW calls ahead."""
        return map_calls([self], fn, *iterables)

    def logs(self) -> str:
        """What its worker wrote so far (stdout and stderr)."""
        return self._pool.client.logs(self.id).text

    def close(self) -> None:
        """No more calls: its worker stops once the queued ones are answered (idempotent)."""
        if not self.closed:
            self.closed = True
            self._pool._close_session(self.id)


def map_calls(sessions: list[Session], fn: Callable[..., R], *iterables: Iterable[Any]) -> Iterator[R]:
    """Calls spread round-robin over `sessions`, results yielded in input order; leaving early
    cancels the calls not yet answered."""
    pending: deque[CallFuture[R]] = deque()
    finished = False
    try:
        for index, args in enumerate(zip(*iterables, strict=False)):
            pending.append(sessions[index % len(sessions)].submit(fn, *args))
            while len(pending) >= MAP_WINDOW * len(sessions):
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
        finished = True
    finally:
        if not finished:
            for future in pending:
                if future.status == "queued":
                    future.cancel()
