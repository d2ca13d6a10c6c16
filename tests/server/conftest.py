"""Server fixtures: store URLs for SQLite and a real PostgreSQL, and an app over a test provider."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fakes import ManualProvider
from fastapi.testclient import TestClient

from factories import node
from gpupool.server.app import create_app
from gpupool.server.db import Store
from gpupool.server.runtime import Runtime
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings


@dataclass
class Server:
    """A test server: its runtime, its provider, an HTTP client and the admin token."""

    rt: Runtime
    provider: ManualProvider
    client: TestClient
    admin_token: str

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.admin_token}"}

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached in time")
            self.rt.wake.set()
            time.sleep(0.01)

    def status(self, workload_id: str, token: str | None = None) -> str:
        answer = self.client.get(f"/api/v1/workloads/{workload_id}", headers=self.headers(token))
        return str(answer.json()["status"])

    def created(self, path: str, body: dict[str, object]) -> dict[str, object]:
        """POST `body` to /api/v1`path` as the admin; asserts 201 and returns the answer."""
        answer = self.client.post(f"/api/v1{path}", json=body, headers=self.headers())
        assert answer.status_code == 201, answer.text
        return dict(answer.json())


def make_runtime(url: str, data_dir: Path, provider: ManualProvider) -> tuple[Runtime, str | None]:
    # tenants' requests not bounded: a test's loop of calls outruns any rate (test_tenant_rates.py sets one)
    settings = Settings(data_dir=data_dir, database_url=url, placement="first-fit",
                        cycle_interval_s=0.05, busy_poll_interval_s=0.01, tenant_request_rate="off")
    rt = Runtime(settings=settings, store=Store.open(url), provider=provider)
    return rt, bootstrap(rt)


def start_server(data_dir: Path, url: str = "", provider: ManualProvider | None = None) -> Server:
    url = url or f"sqlite:///{data_dir / 'store.sqlite'}"
    provider = provider or ManualProvider([node("n0", devices=8, model="H100")])
    rt, token = make_runtime(url, data_dir, provider)
    client = TestClient(create_app(rt))
    client.__enter__()
    return Server(rt=rt, provider=provider, client=client, admin_token=token or "")


def stop_server(server: Server) -> None:
    server.client.__exit__(None, None, None)
    server.rt.store.close()


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def make(url: str = "", provider: ManualProvider | None = None) -> Server:
        servers.append(start_server(tmp_path, url, provider))
        return servers[-1]

    yield make
    for server in servers:
        stop_server(server)


@pytest.fixture
def server(server_factory: Callable[..., Server]) -> Server:
    return server_factory()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for a module of tests that only read or are refused (faster than one each)."""
    server = start_server(tmp_path_factory.mktemp("shared"))
    yield server
    stop_server(server)
