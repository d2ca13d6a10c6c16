"""A pod's network namespace kept for its tenant's next pod: that pod runs `ip` and `nft` not at
all, is still fenced off from other tenants, and never gets a namespace another tenant held or one a
process of the last pod still lives in.

Root, iproute2 and nftables (`make test-deps`); elsewhere these skip with the reason.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from factories import pod_python
from gpupool.agent import netns
from gpupool.agent.netns import NetnsMode, NetworkSettings, PodNet, PodNetwork
from gpupool.core.model import Device, Node
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.localpool import LocalPool
from netns_scripts import connect, eventually, listen

WHY = netns.probe()
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"network namespaces cannot be made here: {WHY}")
NETWORK = ipaddress.IPv4Network("10.238.0.0/16")
"""This file's own pod network: test files that run at once never share one."""
ON = NetworkSettings(mode=NetnsMode.ON, pod_network=NETWORK)
PY = pod_python()


def exists(net: PodNet) -> bool:
    return (netns.NETNS_DIR / net.netns).exists()


@pytest.fixture
def network() -> Iterator[PodNetwork]:
    net = PodNetwork(ON, slot=3)
    net.spares = 0  # every namespace here is made for its pod, so the counts below are exact
    net.start({})
    yield net
    for pod_id in net.attached():  # their pods ended: then the agent stops
        net.detach(pod_id)
    net.close()
    assert not [p for p in netns.NETNS_DIR.glob(f"gpn-{net.key}-*")]  # kept ones go with the agent


def counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The programs the network runs from now on (their names)."""
    ran: list[str] = []
    real = netns._run

    def run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        ran.append(argv[0])
        return real(argv, stdin)

    monkeypatch.setattr(netns, "_run", run)
    return ran


def test_the_tenants_next_pod_gets_the_kept_namespace_without_ip_or_nft(
        network: PodNetwork, monkeypatch: pytest.MonkeyPatch) -> None:
    first = network.attach("p1", "bob")
    network.detach("p1")
    assert eventually(lambda: [k.netns for k in network.kept()] == [first.netns])
    ran = counting(monkeypatch)
    second = network.attach("p2", "bob")
    assert ran == []
    assert (second.netns, second.veth, second.address) == (first.netns, first.veth, first.address)
    assert second.pod_id == "p2" and network.kept() == [] and network.attached() == ["p2"]


def test_a_launch_while_the_worker_judges_the_tenants_ended_namespace_waits_for_it(
        network: PodNetwork, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next pod's launch comes before the worker has read /proc for the pod that ended: it
    waits for the verdict and takes that namespace, instead of making one anew."""
    scanning, verdict = threading.Event(), threading.Event()
    real = netns._netns_in_use

    def held_scan(names: list[str]) -> set[str]:
        scanning.set()
        assert verdict.wait(20)
        return real(names)

    monkeypatch.setattr(netns, "_netns_in_use", held_scan)
    first = network.attach("p1", "bob")
    network.detach("p1")
    assert scanning.wait(20)
    got: list[PodNet] = []
    attach = threading.Thread(target=lambda: got.append(network.attach("p2", "bob")))
    attach.start()
    verdict.set()
    attach.join(20)
    assert [n.netns for n in got] == [first.netns]


def test_another_tenant_never_gets_a_namespace_kept_for_bob(network: PodNetwork) -> None:
    bobs = network.attach("p1", "bob")
    network.detach("p1")
    assert eventually(lambda: len(network.kept()) == 1)
    mallorys = network.attach("m1", "mallory")
    assert mallorys.netns != bobs.netns and mallorys.address != bobs.address
    assert [k.netns for k in network.kept()] == [bobs.netns]


def test_a_namespace_a_process_still_lives_in_is_torn_down_not_kept(network: PodNetwork) -> None:
    held = network.attach("p1", "bob")
    stray = subprocess.Popen(["ip", "netns", "exec", held.netns, "sleep", "60"])  # what a pod left
    try:
        assert eventually(lambda: bool(netns._netns_in_use([held.netns])))
        network.detach("p1")
        assert eventually(lambda: not exists(held))  # removed; the stray is cut off from the network
        assert network.kept() == []
    finally:
        stray.kill()
        stray.wait()
    control = network.attach("p2", "bob")  # the same, with nothing left in it: kept
    network.detach("p2")
    assert eventually(lambda: [k.netns for k in network.kept()] == [control.netns])
    assert exists(control)


def test_a_scan_reads_a_settled_process_once_not_at_every_pod_end(
        network: PodNetwork, monkeypatch: pytest.MonkeyPatch) -> None:
    """The /proc scan that judges an ended pod's namespace reads each process's namespace until the
    process has settled, then never again: long-lived processes (this one, init) cost nothing at
    the next pod's end."""
    held = network.attach("p1", "bob")
    monkeypatch.setattr(netns, "SETTLE_S", 0.0)
    monkeypatch.setattr(netns, "_seen", {})  # nothing settled yet
    real = os.readlink
    reads: list[str] = []

    def counted(path: str) -> str:
        if str(path).endswith("/ns/net"):
            reads.append(str(path))
        return real(path)

    monkeypatch.setattr(netns.os, "readlink", counted)
    mine = {f"/proc/{os.getpid()}/ns/net", "/proc/1/ns/net"}
    netns._netns_in_use([held.netns])
    assert mine <= set(reads)
    reads.clear()
    netns._netns_in_use([held.netns])
    assert not mine & set(reads), reads


def test_a_gangs_namespace_is_never_kept(network: PodNetwork) -> None:
    gang = network.attach("g0", "bob", rank=0, world_size=2, workload_id="w", master_addr="",
                          master_port=29_600)
    network.detach("g0")
    assert eventually(lambda: not exists(gang))
    assert network.kept() == []


def test_at_most_the_limit_is_kept_the_oldest_going_first(network: PodNetwork) -> None:
    network.kept_limit = 2
    nets = [network.attach(f"p{i}", "bob") for i in range(3)]
    for i in range(3):
        network.detach(f"p{i}")
    assert eventually(lambda: sorted(k.netns for k in network.kept()) == sorted(n.netns for n in nets[1:]))
    assert eventually(lambda: not exists(nets[0]))


def nodes() -> list[Node]:
    return [Node(name="n0", cpu_milli=8000, memory_mib=16384,
                 devices=(Device(uuid="GPU-n0-0", model="H100", index=0, memory_mib=81920),))]


def run_pod(pool: LocalPool, pod_id: str, tenant: str, script: str, on_behalf: bool = False) -> None:
    pool.launch(PodLaunch(pod_id=pod_id, workload_id="w-" + pod_id, node="n0", command=(PY, "-c", script),
                          tenant=tenant, on_behalf=on_behalf))


def wait_status(pool: LocalPool, pod_id: str, check: Callable[[PodStatus], bool]) -> PodStatus:
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        status = {s.pod_id: s for s in pool.poll()}.get(pod_id)
        if status is not None and check(status):
            return status
        time.sleep(0.02)
    raise AssertionError(f"{pod_id}: {pool.read_log(pod_id).text!r}")


def test_a_pod_in_a_kept_namespace_is_fenced_off_as_in_a_new_one(tmp_path: Path) -> None:
    """Bob's service runs in the namespace his ended pod left: bob's other pod reaches it, mallory's
    does not."""
    pool = LocalPool(nodes(), tmp_path / "pool", network=ON)
    try:
        network = pool._members["n0"].agent.network
        run_pod(pool, "first", "bob", "print('done')")
        assert wait_status(pool, "first", lambda s: s.phase.is_final).phase is PodPhase.SUCCEEDED
        assert eventually(lambda: len(network.kept()) == 1)  # the poll above handed its end over
        kept = network.kept()[0]
        run_pod(pool, "service", "bob", listen("secret of bob"))
        wait_status(pool, "service", lambda s: "address" in pool.read_log("service").text)
        address = pool.read_log("service").text.split("address", 1)[1].split()[0]
        assert address == kept.address
        for who in ("mallory", "bob"):
            run_pod(pool, who, who, connect(address))
        for who in ("mallory", "bob"):
            wait_status(pool, who, lambda s: s.phase.is_final)
        assert "blocked" in pool.read_log("mallory").text, pool.read_log("mallory").text
        assert "reached secret of bob" in pool.read_log("bob").text, pool.read_log("bob").text
    finally:
        pool.close(stop_pods=True)


def test_work_others_wrote_for_bob_is_a_network_apart_from_bobs_own(tmp_path: Path) -> None:
    """Work the admin or a hub wrote for bob (on_behalf) runs as bob's on-behalf account: the namespace
    such a pod leaves went to bob's own next pod (with whatever socket the admin's other pod kept of
    it), and such pods reached every port of bob's own. Neither now: it is a network of its own."""
    pool = LocalPool(nodes(), tmp_path / "pool", network=ON)
    try:
        network = pool._members["n0"].agent.network
        run_pod(pool, "admins", "bob", "print('done')", on_behalf=True)
        assert wait_status(pool, "admins", lambda s: s.phase.is_final).phase is PodPhase.SUCCEEDED
        assert eventually(lambda: len(network.kept()) == 1)
        kept = network.kept()[0]
        run_pod(pool, "service", "bob", listen("secret of bob"))
        wait_status(pool, "service", lambda s: "address" in pool.read_log("service").text)
        address = pool.read_log("service").text.split("address", 1)[1].split()[0]
        assert address != kept.address and len(network.kept()) == 1, "not the on-behalf pod's namespace"
        run_pod(pool, "admin-probe", "bob", connect(address), on_behalf=True)
        run_pod(pool, "bob-probe", "bob", connect(address))
        for probe in ("admin-probe", "bob-probe"):
            wait_status(pool, probe, lambda s: s.phase.is_final)
        assert "blocked" in pool.read_log("admin-probe").text, pool.read_log("admin-probe").text
        assert "reached secret of bob" in pool.read_log("bob-probe").text, pool.read_log("bob-probe").text
    finally:
        pool.close(stop_pods=True)
