"""A service replica's port is open to the pool's own identity (its probes) and its router's account
(HAProxy's workers) and to no other process on the node: another user's process is refused as
another tenant's pod is.

Runs for real as root with iproute2, nftables and setpriv; elsewhere it skips with the reason.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.test_pod_network import launch, nodes, wait_output
from gpupool.agent import netns
from gpupool.agent.identity import router_account
from gpupool.agent.netns import NetnsMode, NetworkSettings
from gpupool.providers.localpool import LocalPool
from netns_scripts import connect, listen

WHY = netns.probe()
SETPRIV = shutil.which("setpriv")
pytestmark = [
    pytest.mark.skipif(bool(WHY), reason=f"network namespaces cannot be made here: {WHY}"),
    pytest.mark.skipif(SETPRIV is None or os.geteuid() != 0,
                       reason="needs root and setpriv (util-linux) to connect as another user"),
]
NETWORK = ipaddress.IPv4Network("10.243.0.0/16")
"""This file's own pod network: test files that run at once never share one."""
NOBODY = 65534


@pytest.fixture
def pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalPool]:
    monkeypatch.setattr(netns, "KEPT", 0)
    settings = NetworkSettings(mode=NetnsMode.ON, pod_network=NETWORK)
    made = LocalPool(nodes(1), tmp_path / "pool", network=settings)
    yield made
    made.close(stop_pods=True)


def connect_as(uid: int, address: str) -> str:
    assert SETPRIV is not None
    result = subprocess.run([SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable,
                             "-c", connect(address)], env={}, capture_output=True, text=True, timeout=30)
    return result.stdout.strip()


def test_only_the_pools_identity_reaches_a_replicas_port(pool: LocalPool) -> None:
    launch(pool, "replica", "n0", "bob", listen("secret of bob"), serve_port=7000)
    address = wait_output(pool, "replica", "address").split("address", 1)[1].split()[0]
    with socket.create_connection((address, 7000), timeout=5) as conn:  # the pool: its probes, its router
        assert conn.recv(100) == b"secret of bob"
    # the same identity in another process, then another user of the node
    assert connect_as(os.geteuid(), address) == "reached secret of bob"
    assert connect_as(NOBODY, address).startswith("blocked")
    # HAProxy's workers run as the router's own account (the data plane, where the pool is root)
    router = router_account()
    assert router is not None
    assert connect_as(router.uid, address) == "reached secret of bob"
