"""A real gpupool server on a free loopback port, in a thread, for client and CLI tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

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
                config: PoolConfig | None = None) -> Iterator[LiveServer]:
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
    try:
        with serving(server):
            yield LiveServer(url=f"http://127.0.0.1:{port}", admin_token=token, rt=rt)
    finally:
        rt.store.close()


@contextmanager
def serving(server: uvicorn.Server) -> Iterator[None]:
    """`server` running on a thread of its own until the block ends."""
    thread = threading.Thread(target=server.run, daemon=True)
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
