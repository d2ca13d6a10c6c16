"""Pod network namespaces on Ray nodes: each machine gets its own block of the pod network from the
store when it joins (and gives it back when it leaves), its gang's MASTER_ADDR comes from that
block, a gang's two pods on two machines reach each other, and a pod of another tenant on the other
machine cannot connect. Two simulated Ray nodes on this host (one cluster for the module: a Ray
head takes about ten seconds to start); root, iproute2 and nftables, else skipped with why.

Its own package: a process is connected to one Ray cluster at a time, and tests/ray_provider keeps
its own cluster up for all of its modules.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator

import pytest

pytest.importorskip("ray", reason="the ray provider needs Ray (pip install 'gpupool[ray]')")

from factories import pod_python
from gpupool.agent import netns
from gpupool.agent.netns import NetnsMode, NetworkSettings
from gpupool.errors import NotFound
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.base import Capability
from gpupool.providers.ray import RayProvider
from gpupool.server.db import Store
from gpupool.server.services.netblocks import StoreBlocks
from netns_scripts import connect, listen
from ray_provider.conftest import FAST_HEALTH_CHECKS, wait_for

WHY = netns.probe()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(WHY), reason=f"network namespaces cannot be made here: {WHY}")]
NETWORK = ipaddress.IPv4Network("10.248.0.0/16")
"""This file's own pod network: test files that run at once never share one."""
PORT = 29_733
PY = pod_python()

RANK0 = r"""
import os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
s.listen(1)
s.settimeout(30)
c, peer = s.accept()
print("rank0 got", c.recv(100).decode(), "from", peer[0], flush=True)
c.sendall(b"rank0")
"""

RANK1 = r"""
import os, socket, time
deadline = time.monotonic() + 30
while True:
    try:
        c = socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout=2)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
c.sendall(b"rank1")
print("rank1 at", os.environ["GPUPOOL_POD_ADDRESS"], "got", c.recv(100).decode(), flush=True)
"""


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RayProvider, Store]]:
    data = tmp_path_factory.mktemp("raynetns")
    store = Store.open(f"sqlite:///{data / 'store.sqlite'}")
    provider = RayProvider(simulate="2x1xT4", data_dir=data, head_env=FAST_HEALTH_CHECKS,
                           network=NetworkSettings(mode=NetnsMode.ON, pod_network=NETWORK))
    try:
        provider.use_network_blocks(StoreBlocks(store))
        yield provider, store
    finally:
        provider.close(stop_pods=True)
        store.close()
        sweep()


def sweep() -> None:
    """What the simulated machines' agents left (killed with their Ray nodes, they closed nothing):
    an agent's start on each block sweeps whatever no live pod holds, as a machine's next join would."""
    for slot in range(2):
        leftover = netns.PodNetwork(NetworkSettings(mode=NetnsMode.ON, pod_network=NETWORK), slot)
        leftover.spares = 0
        leftover.start({})
        leftover.close()


def _launch(provider: RayProvider, pod_id: str, node: str, tenant: str, script: str,
            **fields: object) -> None:
    provider.launch(PodLaunch(pod_id=pod_id, workload_id=str(fields.pop("workload_id", "w-" + pod_id)),
                              node=node, command=(PY, "-c", script), tenant=tenant,
                              **fields))  # type: ignore[arg-type]


def _status(provider: RayProvider, pod_id: str) -> PodStatus:
    return {s.pod_id: s for s in provider.poll()}[pod_id]


def _final(provider: RayProvider, pod_id: str) -> PodStatus:
    status = wait_for(lambda: (s := _status(provider, pod_id)).phase.is_final and s, 60, f"{pod_id} to end")
    assert isinstance(status, PodStatus)
    return status


def _log(provider: RayProvider, pod_id: str, text: str) -> str:
    def printed() -> str:
        try:
            out = provider.read_log(pod_id).text
        except NotFound:  # not started on its node yet
            return ""
        return out if text in out else ""

    return str(wait_for(printed, 60, f"{pod_id} to print {text!r}"))


def test_each_machine_has_its_own_block_from_the_store_and_reports_the_layer(
        pool: tuple[RayProvider, Store]) -> None:
    provider, store = pool
    held = StoreBlocks(store).held()
    assert sorted(held) == ["t4-000", "t4-001"] and held["t4-000"] != held["t4-001"], held
    descriptions = {d.node.name: d for d in provider.membership.descriptions()}
    assert {name: d.network_slot for name, d in descriptions.items()} == held  # each agent uses its own
    assert Capability.NETWORK_ISOLATION not in provider.missing_capabilities()
    block = netns.node_subnet(NETWORK, held["t4-001"])
    assert provider.gang_address("t4-001", PORT) == netns.gang_address_in(block, PORT)


def test_a_gangs_two_pods_on_two_machines_reach_each_other(pool: tuple[RayProvider, Store]) -> None:
    provider, store = pool
    addr = provider.gang_address("t4-000", PORT)
    gang = {"workload_id": "train", "world_size": 2, "master_addr": addr, "master_port": PORT}
    _launch(provider, "train-r0", "t4-000", "carol", RANK0, rank=0, **gang)
    _launch(provider, "train-r1", "t4-001", "carol", RANK1, rank=1, **gang)
    for pod_id in ("train-r0", "train-r1"):
        status = _final(provider, pod_id)
        assert status.phase is PodPhase.SUCCEEDED, (pod_id, status, provider.read_log(pod_id).text)
    rank1 = provider.read_log("train-r1").text.split()
    assert rank1[:2] == ["rank1", "at"] and rank1[3:] == ["got", "rank0"], rank1
    block1 = netns.node_subnet(NETWORK, StoreBlocks(store).held()["t4-001"])
    assert ipaddress.IPv4Address(rank1[2]) in block1  # rank 1 in its own machine's block
    assert f"rank0 got rank1 from {rank1[2]}" in provider.read_log("train-r0").text


def test_another_tenants_pod_on_the_other_machine_cannot_connect(pool: tuple[RayProvider, Store]) -> None:
    provider, _store = pool
    _launch(provider, "alice-server", "t4-000", "alice", listen("secret of alice"))
    address = _log(provider, "alice-server", "address").split()[1]
    _launch(provider, "bob-probe", "t4-001", "bob", connect(address))
    _launch(provider, "alice-probe", "t4-001", "alice", connect(address))
    for pod_id in ("bob-probe", "alice-probe"):
        assert _final(provider, pod_id).phase is PodPhase.SUCCEEDED
    assert provider.read_log("bob-probe").text.strip() == "blocked TimeoutError"
    assert provider.read_log("alice-probe").text.strip() == "reached secret of alice"
    provider.stop("alice-server", grace_s=1)
    _final(provider, "alice-server")


SERVE = r"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 29_801))
s.listen(16)
print("serving", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"replica")
    c.close()
"""


def test_a_service_replica_stays_reachable_at_its_node_address(pool: tuple[RayProvider, Store]) -> None:
    """The pool's router and probes run on the server's machine, which another machine's table
    does not let in: a replica on a Ray node shares the node's network, and says so."""
    provider, _store = pool
    _launch(provider, "replica", "t4-000", "alice", SERVE, serve_port=29_801)
    _log(provider, "replica", "serving")
    host = provider.pod_address("t4-000", "replica")
    assert host == provider.node_address("t4-000")
    with socket.create_connection((host, 29_801), timeout=5) as conn:
        assert conn.recv(100) == b"replica"
    provider.stop("replica", grace_s=1)
    _final(provider, "replica")


def test_a_machine_that_leaves_gives_its_block_back(pool: tuple[RayProvider, Store]) -> None:
    provider, store = pool
    leaving = next(j for j in provider.joined if j.config.name == "t4-001")
    leaving.process.stop(grace_s=2)
    wait_for(lambda: "t4-001" not in StoreBlocks(store).held(), 60, "t4-001's block to be given back")
    assert list(StoreBlocks(store).held()) == ["t4-000"]
