"""A function made remote by `@pool.function(...)`: `remote()` on a fresh slice, `map()`, or a call."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from gpupool.remote.future import CallFuture
from gpupool.remote.options import Options
from gpupool.remote.payload import dump_call
from gpupool.remote.session import Session, map_calls

if TYPE_CHECKING:
    from gpupool.remote.pool import Pool

P = ParamSpec("P")
R = TypeVar("R")


def _itself(fn: Callable[..., Any]) -> Callable[..., Any]:
    return fn


class RemoteFunction(Generic[P, R]):
    """`fn` bound to a pool and a slice shape. Pickled (inside another remote function) it becomes
    `fn` again, so remote code calls it locally."""

    def __init__(self, pool: Pool, fn: Callable[P, R], options: Options) -> None:
        self._pool = pool
        self.local_function = fn
        self.options = options
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<RemoteFunction {getattr(self.local_function, '__qualname__', self.local_function)}>"

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Callable[P, R]]]:
        return _itself, (self.local_function,)

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> CallFuture[R]:
        """Run it once on a fresh slice (its own workload, which ends with the call); returns at once."""
        payload = dump_call(self.local_function, args, kwargs)
        session = Session(self._pool, self.options, _first=payload)
        assert session.first_call is not None
        return CallFuture(self._pool, session.first_call)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run it once on a fresh slice and return its result (raise its exception)."""
        return self.remote(*args, **kwargs).result()

    def map(self, *iterables: Iterable[Any], concurrency: int = 1) -> Iterator[R]:
        """It over the items (zipped like map()), results in input order, on `concurrency` warm
        slices (sessions) opened for this map and closed when it ends."""
        if concurrency < 1:
            from gpupool.errors import InvalidInput

            raise InvalidInput(f"concurrency must be 1 or more, got {concurrency}.")
        return self._map(iterables, concurrency)

    def _map(self, iterables: tuple[Iterable[Any], ...], concurrency: int) -> Iterator[R]:
        sessions = [Session(self._pool, self.options) for _ in range(concurrency)]
        try:
            yield from map_calls(sessions, self.local_function, *iterables)
        finally:
            for session in sessions:
                session.close()
