"""A real gpupool server on a free loopback port, in a thread, for client and CLI tests.

While the server's thread runs, no variable may be added to the process's C environment: glibc's
setenv may move the environment's array and free the old one while the thread's getenv (a time
zone, a temporary folder, a C library's setting) is reading it, which crashes the process. Tests
that point the CLI at the server set their variables in `before_serving`, before the thread starts
(`cli_env`); a later write to a variable that exists already only replaces its value, and stays
allowed. So is pytest's PYTEST_CURRENT_TEST, which pytest deletes after each test and adds again
before the next: the array is then as long as before, and glibc's realloc to a size its block
already has keeps it in place.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from gpupool.config import PoolConfig
from gpupool.providers.base import Provider
from gpupool.server.app import create_app
from gpupool.server.connguard import guarded_protocol
from gpupool.server.db import Store
from gpupool.server.runtime import Runtime
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings
from ports import free_port


@dataclass
class LiveServer:
    url: str
    admin_token: str
    rt: Runtime


@contextmanager
def live_server(data_dir: Path, provider: Provider, database_url: str = "",
                config: PoolConfig | None = None,
                before_serving: Callable[[LiveServer], None] | None = None) -> Iterator[LiveServer]:
    """The server, serving until the block ends; `before_serving` runs before its thread starts."""
    port = free_port()
    settings = Settings(data_dir=data_dir, port=port, database_url=database_url, placement="first-fit",
                        cycle_interval_s=0.05, busy_poll_interval_s=0.01)
    rt = Runtime(settings=settings, store=Store.open(settings.resolved_database_url), provider=provider,
                 config=config or PoolConfig())
    token = bootstrap(rt) or ""
    app = create_app(rt)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           http=guarded_protocol()))  # as `gpupool up` serves it
    app.state.stopping = lambda: server.should_exit  # as `gpupool up` does: event streams end with it
    live = LiveServer(url=f"http://127.0.0.1:{port}", admin_token=token, rt=rt)
    try:
        if before_serving is not None:
            before_serving(live)
        with serving(server):
            yield live
    finally:
        rt.store.close()


def cli_env(monkeypatch: pytest.MonkeyPatch, **more: str) -> Callable[[LiveServer], None]:
    """A `before_serving` that points the CLI at the server as its admin (GPUPOOL_URL, GPUPOOL_TOKEN)
    and sets `more` (COLUMNS="200")."""
    def point(server: LiveServer) -> None:
        monkeypatch.setenv("GPUPOOL_URL", server.url)
        monkeypatch.setenv("GPUPOOL_TOKEN", server.admin_token)
        for name, value in more.items():
            monkeypatch.setenv(name, value)
    return point


@contextmanager
def serving(server: uvicorn.Server) -> Iterator[None]:
    """`server` running on a thread of its own until the block ends; meanwhile a variable added to the
    C environment is refused (see the module's docstring)."""
    thread = threading.Thread(target=server.run, daemon=True)
    saved_putenv = os.putenv
    os.putenv = _no_new_variable(saved_putenv)
    try:
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        try:
            yield
        finally:
            server.should_exit = True
            thread.join(timeout=20)
    finally:
        os.putenv = saved_putenv


def _no_new_variable(putenv: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    def guarded(key: Any, value: Any) -> None:
        name = os.fsdecode(key)
        if name not in os.environ and name != "PYTEST_CURRENT_TEST":
            raise AssertionError(
                f"{name} was added to the environment while a test server's thread runs: glibc may free "
                "the array that thread's getenv reads. Set it before the thread starts "
                "(live_server's before_serving, or cli_env).")
        putenv(key, value)
    return guarded
