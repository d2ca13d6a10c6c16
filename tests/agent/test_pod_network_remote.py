"""Pods on two machines (Ray nodes): this machine's table lets a pod of another machine in only
when that machine's agent said it is a pod of the same tenant, sends to it without hiding the
sender's address, and routes the other machines' blocks through their node addresses.

The other machine's pod is a namespace on this host behind a link that is not a pod's veth, with an
address of another block, so its packets arrive here as another machine's would (through the
forward hook, from outside the pods' links). Root, iproute2 and nftables, else skipped with why.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gpupool.agent import netns
from gpupool.agent.netns import Member, NetnsMode, NetworkSettings, PodNetwork, tenant_key
from gpupool.errors import InvalidInput
from netns_scripts import connect, listen

WHY = netns.probe()
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"network namespaces cannot be made here: {WHY}")
NETWORK = ipaddress.IPv4Network("10.247.0.0/16")
"""This file's own pod network: test files that run at once never share one."""
ON = NetworkSettings(mode=NetnsMode.ON, pod_network=NETWORK)
REMOTE = str(netns.node_subnet(NETWORK, 1).network_address + 100)
"""The other machine's pod: an address of block 1 (this machine has block 0)."""

def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _reach(space: str, target: str) -> str:
    """What a probe in namespace `space` gets from `target`'s port 7000 (netns_scripts.connect)."""
    probe = connect(target, timeout_s=1.0)
    done = subprocess.run(["ip", "netns", "exec", space, sys.executable, "-c", probe],
                          capture_output=True, text=True, timeout=20, check=True)
    return done.stdout.strip()


def _serve(space: str) -> subprocess.Popen[str]:
    server = subprocess.Popen(["ip", "netns", "exec", space, sys.executable, "-c", listen(None)],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline().startswith("address")  # it listens
    return server


@pytest.fixture(scope="module")
def machine() -> Iterator[tuple[PodNetwork, str]]:
    """This machine's pod network (block 0) and the other machine's pod (its namespace)."""
    net = PodNetwork(ON, 0)
    net.spares = 0
    net.start({})
    key = os.urandom(3).hex()
    space, link = f"gprm-{key}", f"gxr{key}"
    _ip("netns", "add", space)
    try:
        _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", space)
        _ip("link", "set", link, "up")
        _ip("route", "add", f"{REMOTE}/32", "dev", link)
        with open(f"/proc/sys/net/ipv4/conf/{link}/proxy_arp", "w") as handle:
            handle.write("1")
        for line in ("link set lo up", "link set eth0 up", f"addr add {REMOTE}/32 dev eth0",
                     f"route add {net.gateway}/32 dev eth0 scope link",
                     f"route add default via {net.gateway} dev eth0"):
            _ip("-n", space, *line.split())
        yield net, space
    finally:
        subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", space], capture_output=True, check=False)
        net.close()


@pytest.fixture
def alice_pod(machine: tuple[PodNetwork, str]) -> Iterator[tuple[str, str]]:
    """A pod of tenant alice on this machine, serving port 7000: (its namespace, its address)."""
    net, _space = machine
    pod = net.attach(f"pa-{os.urandom(3).hex()}", "alice")
    server = _serve(pod.netns)
    try:
        yield pod.netns, pod.address
    finally:
        server.kill()
        server.wait()
        net.forget_remote([m.address for m in net.remote_members()])
        net.detach(pod.pod_id)


def test_another_machines_pod_is_let_in_only_as_a_pod_of_the_same_tenant(
        machine: tuple[PodNetwork, str], alice_pod: tuple[str, str]) -> None:
    net, remote = machine
    _pod_space, address = alice_pod
    assert _reach(remote, address) == "blocked TimeoutError"  # not told of it: dropped
    net.add_remote([Member(REMOTE, tenant_key("bob", NETWORK))])
    assert _reach(remote, address) == "blocked TimeoutError"  # bob's pod: still dropped
    net.add_remote([Member(REMOTE, tenant_key("alice", NETWORK))])  # the address now alice's (bob's went)
    assert _reach(remote, address) == f"reached from {REMOTE}"
    assert net.remote_members() == [Member(REMOTE, tenant_key("alice", NETWORK))]
    net.forget_remote([REMOTE])  # it ended there
    assert _reach(remote, address) == "blocked TimeoutError"


def test_a_pod_reaches_its_tenants_pod_on_another_machine_with_its_own_address(
        machine: tuple[PodNetwork, str], alice_pod: tuple[str, str]) -> None:
    net, remote = machine
    pod_space, address = alice_pod
    server = _serve(remote)
    try:
        assert _reach(pod_space, REMOTE) == "blocked TimeoutError"  # not one of alice's
        net.add_remote([Member(REMOTE, tenant_key("bob", NETWORK))])
        assert _reach(pod_space, REMOTE) == "blocked TimeoutError"
        net.add_remote([Member(REMOTE, tenant_key("alice", NETWORK))])
        assert _reach(pod_space, REMOTE) == f"reached from {address}"  # not masqueraded
    finally:
        server.kill()
        server.wait()


def test_other_machines_blocks_are_routed_through_their_node_addresses(
        machine: tuple[PodNetwork, str]) -> None:
    net, _remote = machine
    key = os.urandom(3).hex()
    link = f"gxd{key}"  # this machine's link to the others' network (192.0.2.0/24)
    _ip("link", "add", link, "type", "veth", "peer", "name", f"gxe{key}")
    try:
        _ip("addr", "add", "192.0.2.1/24", "dev", link)
        _ip("link", "set", link, "up")
        block2, block3 = str(netns.node_subnet(NETWORK, 2)), str(netns.node_subnet(NETWORK, 3))
        peers = [("n0", 0, "192.0.2.1"), ("n1", 1, "127.0.0.1"), ("n2", 2, "192.0.2.7"),
                 ("n3", 3, "192.0.2.8")]
        # its own block and one on this host (a local address) need no route
        assert net.routes(peers) == {block2: "192.0.2.7", block3: "192.0.2.8"}
        net.set_routes(peers)
        assert _routes(block2, block3) == {block2: "192.0.2.7", block3: "192.0.2.8"}
        net.set_routes(peers[:3])  # n3 left
        assert _routes(block2, block3) == {block2: "192.0.2.7"}
    finally:
        net.set_routes([])
        subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
    assert _routes(block2, block3) == {}


def _routes(*cidrs: str) -> dict[str, str]:
    found = {}
    for cidr in cidrs:
        done = subprocess.run(["ip", "-j", "route", "show", cidr], capture_output=True, text=True, check=True)
        for route in json.loads(done.stdout or "[]"):
            found[cidr] = route.get("gateway", "")
    return found


def test_another_machines_words_apply_in_the_order_its_agent_said_them(
        machine: tuple[PodNetwork, str]) -> None:
    """Ray runs up to four of an agent's `network_members` calls at once: a pod's end said after its
    start, arriving first, is not undone by the start; a restarted agent (another incarnation)
    starts its numbering again, and a late word of the one before it is dropped."""
    net, _remote = machine
    carol, bob = tenant_key("carol", NETWORK), tenant_key("bob", NETWORK)
    try:
        net.told("m1", "first", 2, [], [REMOTE])  # the end, said second, arrives first
        net.told("m1", "first", 1, [Member(REMOTE, carol)], [])
        assert net.remote_members() == []
        net.told("m1", "first", 3, [Member(REMOTE, carol)], [])  # the address taken again
        assert net.remote_members() == [Member(REMOTE, carol)]
        net.told("m1", "second", 1, [Member(REMOTE, bob)], [])  # its agent restarted: numbered anew
        assert net.remote_members() == [Member(REMOTE, bob)]
        net.told("m1", "first", 9, [], [REMOTE])  # a late word of the agent before it
        assert net.remote_members() == [Member(REMOTE, bob)]
        with pytest.raises(InvalidInput, match="not another machine's block"):
            net.told("m1", "second", 2, [], [], block=str(net.subnet))  # this machine's own block
        net.told("m1", "second", 2, [], [], block=str(netns.node_subnet(NETWORK, 1)))  # none left there
        assert net.remote_members() == []
    finally:
        net.forget_remote([m.address for m in net.remote_members()])
