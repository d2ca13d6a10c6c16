"""A service replica in its own network namespace: the node's own processes (the pool's probes and
router) open connections to its serve_port at the address the provider reports, another tenant's
pods still cannot, and the opening goes with the pod.

Runs for real as root with iproute2 and nftables; elsewhere it skips with the reason.
"""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.test_pod_network import launch, nodes, wait_final, wait_output
from gpupool.agent import netns
from gpupool.agent.netns import NetnsMode, NetworkSettings
from gpupool.providers.localpool import LocalPool
from netns_scripts import connect, listen

WHY = netns.probe()
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"network namespaces cannot be made here: {WHY}")
NETWORK = ipaddress.IPv4Network("10.245.0.0/16")
"""This file's own pod network: test files that run at once never share one."""


@pytest.fixture
def pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalPool]:
    monkeypatch.setattr(netns, "KEPT", 0)
    settings = NetworkSettings(mode=NetnsMode.ON, pod_network=NETWORK)
    made = LocalPool(nodes(2), tmp_path / "pool", network=settings)
    yield made
    made.close(stop_pods=True)


def serve_ports() -> str:
    return subprocess.run(["nft", "list", "set", "inet", netns.TABLE, "serve_ports"], capture_output=True,
                          text=True, check=True).stdout


def test_the_node_reaches_a_replicas_port_and_another_tenant_does_not(pool: LocalPool) -> None:
    launch(pool, "replica", "n0", "bob", listen("secret of bob"), serve_port=7000)
    out = wait_output(pool, "replica", "address")
    address = out.split("address", 1)[1].split()[0]
    assert pool.pod_address("n0", "replica") == address != "127.0.0.1"
    with socket.create_connection((address, 7000), timeout=5) as conn:  # the host's own process
        assert conn.recv(100) == b"secret of bob"
    assert f"{address} . 7000" in serve_ports()
    for node in ("n0", "n1"):
        launch(pool, f"mallory-{node}", node, "mallory", connect(address))
        wait_final(pool, f"mallory-{node}")
        assert "blocked" in pool.read_log(f"mallory-{node}").text
    pool.stop("replica", grace_s=0.5)
    wait_final(pool, "replica")
    deadline = time.monotonic() + 20
    while f"{address} . 7000" in serve_ports():
        assert time.monotonic() < deadline, "the replica's opening outlived it"
        time.sleep(0.05)


def test_control_a_pod_without_a_serve_port_is_closed_to_the_node(pool: LocalPool) -> None:
    launch(pool, "plain", "n0", "bob", listen("secret of bob"))
    out = wait_output(pool, "plain", "address")
    address = out.split("address", 1)[1].split()[0]
    with pytest.raises(OSError):
        socket.create_connection((address, 7000), timeout=2).close()
