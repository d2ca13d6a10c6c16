"""A real server with the local provider on simulated devices, and tenants' pools for remote calls."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpupool.client import Client
from gpupool.providers.local import LocalProvider
from live import LiveServer, live_server


@dataclass
class RemotePool:
    server: LiveServer
    admin: Client
    tokens: dict[str, str]
    """Each tenant's token (tenants alice and bob)."""


@pytest.fixture(scope="module")
def remote_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemotePool]:
    base: Path = tmp_path_factory.mktemp("remote")
    provider = LocalProvider(base / "agent", simulate="2xH100", node_name="box")
    try:
        with live_server(base, provider) as server, Client(server.url, server.admin_token) as admin:
            tokens = {}
            for tenant in ("alice", "bob"):
                admin.create_tenant(tenant)
                tokens[tenant] = admin.create_token(tenant).token
            yield RemotePool(server=server, admin=admin, tokens=tokens)
    finally:
        provider.agent.close(stop_pods=True)
