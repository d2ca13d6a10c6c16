"""A remote function whose worker pod has its own network namespace still reaches the API server:
its GPUPOOL_URL names the node's gateway, which DNAT takes to the server on loopback. Needs root,
iproute2 and nftables (elsewhere it skips with the reason)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import gpupool
from gpupool.agent import netns
from gpupool.client import Client
from gpupool.providers.local import LocalProvider
from live import live_server

WHY = netns.probe()
NETWORK = ipaddress.IPv4Network("10.235.0.0/16")
"""This file's own pod network (test files that run at once never share one)."""


def where_am_i() -> dict[str, str]:
    import os

    return {"address": os.environ.get("GPUPOOL_POD_ADDRESS", ""), "url": os.environ.get("GPUPOOL_URL", "")}


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[LocalProvider]:
    p = LocalProvider(tmp_path / "agent", simulate="2xH100", node_name="box",
                      network=netns.NetworkSettings(mode=netns.NetnsMode.ON, pod_network=NETWORK))
    yield p
    p.close(stop_pods=True)


@pytest.mark.skipif(bool(WHY), reason=f"no pod network namespaces here: {WHY}")
def test_a_remote_function_in_its_own_namespace_reaches_the_api_server(provider: LocalProvider,
                                                                       tmp_path: Path) -> None:
    with live_server(tmp_path, provider) as server, Client(server.url, server.admin_token) as admin:
        provider.agent.network.publish([("127.0.0.1", urlsplit(server.url).port or 0)])
        admin.create_tenant("alice")
        token = admin.create_token("alice").token
        with gpupool.connect(server.url, token) as pool:
            inside = pool.function(where_am_i, gpus=0.25, timeout="5m").remote().result(timeout=120)
    assert ipaddress.IPv4Address(inside["address"]) in NETWORK  # it ran in its own namespace
    assert urlsplit(inside["url"]).hostname == provider.agent.network.gateway  # and called back through it
