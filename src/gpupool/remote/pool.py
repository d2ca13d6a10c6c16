"""A connection to a pool for remote functions: `gpupool.connect()`, `@pool.function`, `pool.session()`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar, overload

from gpupool.client import Client
from gpupool.remote.function import RemoteFunction
from gpupool.remote.options import Options
from gpupool.remote.session import Session

P = ParamSpec("P")
R = TypeVar("R")
HTTP_TIMEOUT_S = 60.0
"""Longer than the longest wait the server holds a request for (60 s)."""


class Pool:
    """The pool at GPUPOOL_URL with GPUPOOL_TOKEN (or the arguments, or the config file, as the CLI).
    Safe to share between threads; close it (or use `with`) when done."""

    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        self.client = Client(url, token, timeout_s=HTTP_TIMEOUT_S)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()

    @overload
    def function(self, fn: Callable[P, R], /) -> RemoteFunction[P, R]: ...

    @overload
    def function(self, fn: None = None, /, *, gpus: float = 0, gpu_memory: str | int | None = None,
                 cpu: str | float = 0, memory: str | int = 0, models: Sequence[str] = (),
                 timeout: str | float | None = None, queue: str = "default", priority: int = 0,
                 priority_class: str | None = None, tenant: str | None = None, name: str = "",
                 env: Mapping[str, str] | None = None, image: str | None = None
                 ) -> Callable[[Callable[P, R]], RemoteFunction[P, R]]: ...

    def function(self, fn: Callable[P, R] | None = None, /, *, gpus: float = 0,
                 gpu_memory: str | int | None = None, cpu: str | float = 0, memory: str | int = 0,
                 models: Sequence[str] = (), timeout: str | float | None = None, queue: str = "default",
                 priority: int = 0, priority_class: str | None = None, tenant: str | None = None,
                 name: str = "", env: Mapping[str, str] | None = None, image: str | None = None
                 ) -> RemoteFunction[P, R] | Callable[[Callable[P, R]], RemoteFunction[P, R]]:
        """Make `fn` run on a slice of the pool: `gpus` (0.25, or whole devices), `gpu_memory`
        ('8GiB'), host `cpu` and `memory`, allowed device `models`, `timeout` (its workload's time
        limit: 90, '10m', '2h'), and the `queue`, `priority`, `priority_class` it is submitted with.
        `env` adds variables to its pod; `image` runs it in a container of that image of the pool
        (`gpupool image ls`), which must hold the pool's Python (same minor version). Each `remote()`
        call runs on a fresh slice (its own workload); `map()` and `pool.session()` keep one warm for
        many calls."""
        options = Options.make(gpus=gpus, gpu_memory=gpu_memory, cpu=cpu, memory=memory, models=models,
                               timeout=timeout, queue=queue, priority=priority,
                               priority_class=priority_class, tenant=tenant, name=name, env=env,
                               image=image)

        def wrap(target: Callable[P, R]) -> RemoteFunction[P, R]:
            return RemoteFunction(self, target, options.named(getattr(target, "__name__", "function")))

        return wrap if fn is None else wrap(fn)

    def session(self, *, gpus: float = 0, gpu_memory: str | int | None = None, cpu: str | float = 0,
                memory: str | int = 0, models: Sequence[str] = (), timeout: str | float | None = None,
                idle_timeout: str | float | None = "5m", queue: str = "default", priority: int = 0,
                priority_class: str | None = None, tenant: str | None = None, name: str = "session",
                env: Mapping[str, str] | None = None, image: str | None = None) -> Session:
        """One warm slice for many calls (`s.call(fn, x)`, `s.submit`, `s.map`), run one after the
        other by one worker process. Opened at once (its workload is submitted now); closed when the
        `with` block ends, or after `idle_timeout` without a call; `timeout` bounds its whole life."""
        options = Options.make(gpus=gpus, gpu_memory=gpu_memory, cpu=cpu, memory=memory, models=models,
                               timeout=timeout, idle_timeout=idle_timeout, queue=queue, priority=priority,
                               priority_class=priority_class, tenant=tenant, name=name, env=env,
                               image=image)
        return Session(self, options)

    # ------------------------------------------------------------------ the routes (used by the others)

    def _open_session(self, body: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = self.client.request("POST", "/calls/sessions", json=body)
        return answer

    def _submit_call(self, session_id: str, payload: str, wait_s: float) -> dict[str, Any]:
        answer: dict[str, Any] = self.client.request("POST", f"/calls/sessions/{session_id}/calls",
                                                   json={"payload": payload}, params={"wait_s": wait_s})
        return answer

    def _get_call(self, call_id: str, wait_s: float) -> dict[str, Any]:
        answer: dict[str, Any] = self.client.request("GET", f"/calls/{call_id}", params={"wait_s": wait_s})
        return answer

    def _cancel_call(self, call_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = self.client.request("POST", f"/calls/{call_id}/cancel")
        return answer

    def _close_session(self, session_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = self.client.request("POST", f"/calls/sessions/{session_id}/close")
        return answer


def connect(url: str | None = None, token: str | None = None) -> Pool:
    """The pool at `url` (default GPUPOOL_URL, then the config file) with `token` (GPUPOOL_TOKEN...)."""
    return Pool(url, token)
