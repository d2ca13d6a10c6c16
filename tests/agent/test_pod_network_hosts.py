"""Two machines' pod networks, live: each agent's network runs inside a network namespace standing
for its host (its own table, routes and pods), the hosts joined by a veth as the node network, and
each agent's announcements handed to the other as Ray nodes' agents hand them over
(providers/ray/network.py). A gang's pods on both machines reach each other; another tenant's pod
is dropped both ways. A service replica on one machine is reached at that machine's address from
the server's machine only (the other one plays it), not from pods on either."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import IO, Any

import pytest

from gpupool.agent import netns
from netns_scripts import connect, listen

WHY = netns.probe()
NSENTER = shutil.which("nsenter")
pytestmark = [pytest.mark.skipif(bool(WHY), reason=f"network namespaces cannot be made here: {WHY}"),
              pytest.mark.skipif(NSENTER is None, reason="nsenter is not installed (util-linux)")]
NETWORK = ipaddress.IPv4Network("10.229.0.0/16")
"""This file's own pod network: test files that run at once never share one."""
GANG_PORT = 29_741
SERVE_PORT = 7_100
NODE_NETWORK = "192.0.2.0/24"
"""The node network `joined` makes (declared reachable for the module's hosts' pods)."""

AGENT = r"""
import ipaddress, json, sys
from gpupool.agent.netns import Member, NetnsMode, NetworkSettings, PodNetwork
from gpupool.errors import ProviderError

reachable = tuple(ipaddress.IPv4Network(n) for n in sys.argv[3:])
net = PodNetwork(NetworkSettings(mode=NetnsMode.ON, pod_network=ipaddress.IPv4Network(sys.argv[1]),
                                 reachable=reachable), int(sys.argv[2]))
net.spares = 0


def say(**message):
    print(json.dumps(message), flush=True)


net.announce = lambda added, gone: say(added=[[m.address, m.tenant_key, m.gang_key] for m in added],
                                       gone=list(gone))
net.start({})
say(ready=net.active)
for line in sys.stdin:
    ask = json.loads(line)
    if ask["op"] == "routes":
        net.set_routes([tuple(p) for p in ask["peers"]])
        say(done=True)
    elif ask["op"] == "servers":
        net.set_servers(ask["servers"])
        say(done=True)
    elif ask["op"] == "attach":
        try:
            pod = net.attach(ask["pod_id"], ask["tenant"], **ask.get("gang", {}))
        except ProviderError as exc:
            say(error=exc.message)
            continue
        say(netns=pod.netns, address=pod.address)
    elif ask["op"] == "remote":
        net.add_remote([Member(*m) for m in ask["members"]])
        say(done=True)
    elif ask["op"] == "gang_address":
        say(address=net.gang_address(ask["port"]))
    elif ask["op"] == "told":  # another machine's agent's word (node, incarnation, number)
        net.told(ask["origin"], ask["incarnation"], ask["seq"], [Member(*m) for m in ask["added"]],
                 ask["removed"], block=ask.get("block", ""))
        say(done=True)
    elif ask["op"] == "members":
        say(members=[[m.address, m.tenant_key, m.gang_key] for m in net.members()], block=str(net.subnet))
    elif ask["op"] == "remote_members":
        say(members=sorted([m.address, m.tenant_key, m.gang_key] for m in net.remote_members()))
    elif ask["op"] == "detach":  # the pod ended: answered once its teardown was announced
        net.detach(ask["pod_id"])
        with net._changed:
            net._changed.wait_for(lambda: ask["pod_id"] not in net._pending)
        say(done=True)
for pod_id in net.attached():
    net.detach(pod_id)
net.close()
"""


class Host:
    """One machine: a network namespace with the node network's end and an agent's pod network."""

    def __init__(self, name: str, slot: int, network: ipaddress.IPv4Network = NETWORK,
                 reachable: tuple[str, ...] = ()) -> None:
        self.name, self.slot, self.network, self.reachable = name, slot, network, reachable
        self.agent: subprocess.Popen[str] | None = None
        self.announced: list[dict[str, Any]] = []

    def start(self) -> None:
        self.agent = subprocess.Popen(["ip", "netns", "exec", self.name, sys.executable, "-c", AGENT,
                                       str(self.network), str(self.slot), *self.reachable],
                                      stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
        assert self._read() == {"ready": True}

    def _read(self) -> dict[str, Any]:
        assert self.agent is not None and self.agent.stdout is not None
        line = self.agent.stdout.readline()
        assert line, f"the agent in {self.name} ended (exit {self.agent.poll()})"
        return dict(json.loads(line))

    def ask(self, **message: Any) -> dict[str, Any]:
        """Send one request; the answer (announcements made meanwhile are kept in `announced`)."""
        assert self.agent is not None and self.agent.stdin is not None
        self.agent.stdin.write(json.dumps(message) + "\n")
        self.agent.stdin.flush()
        while True:
            answer = self._read()
            if "added" not in answer:
                return answer
            self.announced.append(answer)

    def kill(self) -> None:
        """The agent dies (nothing closed: its table, pods and namespaces stay on the host)."""
        assert self.agent is not None
        self.agent.kill()
        self.agent.wait()
        self.agent = None
        self.announced.clear()

    def stop(self) -> None:
        if self.agent is not None:
            stdin: IO[str] | None = self.agent.stdin
            if stdin is not None:
                stdin.close()
            try:
                self.agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _relay(source: Host, target: Host) -> None:
    """Hand what `source`'s agent announced to `target`'s (the pods it attached, before they start),
    its words applied in order: an address given up and taken again is the last pod's."""
    held: dict[str, list[Any]] = {}
    for message in source.announced:
        for address in message["gone"]:
            held.pop(address, None)
        held.update((m[0], m) for m in message["added"])
    members = list(held.values())
    source.announced.clear()
    if members:
        assert target.ask(op="remote", members=members) == {"done": True}


def _in_pod(host: Host, pod_netns: str, script: str) -> list[str]:
    """The command that runs `script` in a pod's namespace of `host` (named in its agent's mounts)."""
    assert host.agent is not None and NSENTER is not None
    return [NSENTER, f"--mount=/proc/{host.agent.pid}/ns/mnt", "ip", "netns", "exec", pod_netns,
            sys.executable, "-c", script]


def _reach(host: Host, pod_netns: str, target: str, port: int = 7000) -> str:
    done = subprocess.run(_in_pod(host, pod_netns, connect(target, port, timeout_s=1.0)), capture_output=True,
                          text=True, timeout=20, check=True)
    return done.stdout.strip()


def _serve(host: Host, pod_netns: str, secret: str, port: int = 7000) -> subprocess.Popen[str]:
    script = listen(secret, port)
    server = subprocess.Popen(_in_pod(host, pod_netns, script), stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline().startswith("address")
    return server


@contextlib.contextmanager
def joined(a: Host, b: Host) -> Iterator[None]:
    """The two hosts' namespaces made, joined by a veth `node0` as the node network (192.0.2.1 and
    .2), and their agents started; all of it stopped and removed after."""
    made: list[str] = []
    try:
        for host in (a, b):
            _ip("netns", "add", host.name)
            made.append(host.name)
            _ip("-n", host.name, "link", "set", "lo", "up")
        _ip("-n", a.name, "link", "add", "node0", "type", "veth", "peer", "name", "node0", "netns", b.name)
        for host, address in ((a, "192.0.2.1/24"), (b, "192.0.2.2/24")):
            _ip("-n", host.name, "addr", "add", address, "dev", "node0")
            _ip("-n", host.name, "link", "set", "node0", "up")
        for host in (a, b):
            host.start()
        yield
    finally:
        for host in (a, b):
            host.stop()
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


PEERS = [["a", 0, "192.0.2.1"], ["b", 1, "192.0.2.2"]]
"""The routes to each machine's block of pod addresses, as the server gives each agent."""


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[Host, Host]]:
    key = os.urandom(3).hex()
    a = Host(f"gphA-{key}", 0, reachable=(NODE_NETWORK,))
    b = Host(f"gphB-{key}", 1, reachable=(NODE_NETWORK,))
    with joined(a, b):
        for host in (a, b):
            assert host.ask(op="routes", peers=PEERS) == {"done": True}
        yield a, b


def test_a_gangs_pods_on_two_machines_connect_and_another_tenant_is_dropped_both_ways(
        hosts: tuple[Host, Host]) -> None:
    a, b = hosts
    master = a.ask(op="gang_address", port=GANG_PORT)["address"]
    gang = {"workload_id": "train", "master_addr": master, "master_port": GANG_PORT, "world_size": 2}
    rank0 = a.ask(op="attach", pod_id="train-r0", tenant="bob", gang={**gang, "rank": 0})
    rank1 = b.ask(op="attach", pod_id="train-r1", tenant="bob", gang={**gang, "rank": 1})
    mallory_a = a.ask(op="attach", pod_id="mallory-a", tenant="mallory")
    mallory_b = b.ask(op="attach", pod_id="mallory-b", tenant="mallory")
    assert rank0["address"] == master
    _relay(a, b)
    _relay(b, a)
    servers = [_serve(a, rank0["netns"], "rank0 of bob", GANG_PORT),
               _serve(b, rank1["netns"], "rank1 of bob")]
    try:
        assert _reach(b, rank1["netns"], master, GANG_PORT) == "reached rank0 of bob"  # b to a, the gang
        assert _reach(a, rank0["netns"], rank1["address"]) == "reached rank1 of bob"  # a to b, one tenant
        assert _reach(b, mallory_b["netns"], master, GANG_PORT) == "blocked TimeoutError"  # b to a
        assert _reach(a, mallory_a["netns"], rank1["address"]) == "blocked TimeoutError"  # a to b
    finally:
        for server in servers:
            server.kill()
            server.wait()


def _from_host(host: Host, target: str, port: int, source: str = "") -> str:
    """What a process of `host` itself (no pod) reaches at `target`:`port`, from `source` if given."""
    script = connect(target, port, timeout_s=1.0)
    if source:
        script = script.replace(f"timeout={1.0!r})", f"timeout={1.0!r}, source_address=({source!r}, 0))")
        assert "source_address" in script
    done = subprocess.run(["ip", "netns", "exec", host.name, sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=20, check=True)
    return done.stdout.strip()


def test_a_replica_is_reached_at_its_node_address_from_the_servers_addresses_only(
        hosts: tuple[Host, Host]) -> None:
    """a is the server's machine (192.0.2.1), b runs a replica in its own namespace: the server's
    connection to b's address at the serve port reaches the replica; a pod of another tenant on a
    (masqueraded to the server's address toward the node network it may reach) or on b, another
    address of a and b's own processes do not (until the server's addresses change to it: the live
    replica follows); a second replica on the port is refused there; once
    the replica's teardown is done, the port goes with it (a pod at its old address is not reached)
    and serves the next replica on that port."""
    a, b = hosts
    _ip("-n", a.name, "addr", "add", "192.0.2.3/24", "dev", "node0")  # an address the plan does not list
    for host in (a, b):
        assert host.ask(op="servers", servers=["192.0.2.1"]) == {"done": True}
    replica = b.ask(op="attach", pod_id="replica", tenant="alice", gang={"serve_port": SERVE_PORT})
    mallory_a = a.ask(op="attach", pod_id="mallory-sa", tenant="mallory")
    mallory_b = b.ask(op="attach", pod_id="mallory-sb", tenant="mallory")
    server = _serve(b, replica["netns"], "replica of alice", SERVE_PORT)
    try:
        assert _from_host(a, "192.0.2.2", SERVE_PORT) == "reached replica of alice"
        second = b.ask(op="attach", pod_id="replica-dup", tenant="bob", gang={"serve_port": SERVE_PORT})
        assert f"port {SERVE_PORT} of this node is served by replica replica" in second["error"]
        assert _from_host(a, "192.0.2.2", SERVE_PORT) == "reached replica of alice"  # still its
        # the server's address changes (a new leader on another machine): the live replica follows
        assert b.ask(op="servers", servers=["192.0.2.3"]) == {"done": True}
        assert _from_host(a, "192.0.2.2", SERVE_PORT, source="192.0.2.3") == "reached replica of alice"
        assert _from_host(a, "192.0.2.2", SERVE_PORT).startswith("blocked")
        assert b.ask(op="servers", servers=["192.0.2.1"]) == {"done": True}
        assert _reach(a, mallory_a["netns"], "192.0.2.2", SERVE_PORT) == "blocked TimeoutError"
        assert _reach(b, mallory_b["netns"], "192.0.2.2", SERVE_PORT) == "blocked TimeoutError"
        assert _from_host(a, "192.0.2.2", SERVE_PORT, source="192.0.2.3").startswith("blocked")
        assert _from_host(b, "192.0.2.2", SERVE_PORT).startswith("blocked")
        assert _from_host(a, replica["address"], SERVE_PORT).startswith("blocked")  # only through the DNAT
    finally:
        server.kill()
        server.wait()
    assert b.ask(op="detach", pod_id="replica") == {"done": True}
    taker = b.ask(op="attach", pod_id="mallory-taker", tenant="mallory")
    assert taker["address"] == replica["address"]  # the lowest free one: the replica's, given up
    next_replica = b.ask(op="attach", pod_id="replica-2", tenant="bob", gang={"serve_port": SERVE_PORT})
    servers = [_serve(b, taker["netns"], "mallory at the replica's old address", SERVE_PORT)]
    try:
        assert _from_host(a, "192.0.2.2", SERVE_PORT).startswith("blocked")  # the port went with it
        servers.append(_serve(b, next_replica["netns"], "replica of bob", SERVE_PORT))
        assert _from_host(a, "192.0.2.2", SERVE_PORT) == "reached replica of bob"  # and serves the next
    finally:
        for server in servers:
            server.kill()
            server.wait()


def _listed(host: Host, kind: str, name: str) -> list[object]:
    """The elements of a set or map of `host`'s table."""
    done = subprocess.run(["ip", "netns", "exec", host.name, "nft", "-j", "list", kind, "inet", netns.TABLE,
                           name], capture_output=True, text=True, check=True)
    return [e for item in json.loads(done.stdout)["nftables"] for e in item.get(kind, {}).get("elem", [])]


def test_the_port_of_a_killed_agents_replica_is_removed_by_the_next_agent(hosts: tuple[Host, Host]) -> None:
    """An agent dies with a replica attached (its table keeps the node's port taken to it); the
    replica ended meanwhile (as every pod of the module on b), so the next agent's start removes the
    port with its other leftovers."""
    _a, b = hosts
    assert b.ask(op="servers", servers=["192.0.2.1"]) == {"done": True}
    replica = b.ask(op="attach", pod_id="replica-3", tenant="alice", gang={"serve_port": SERVE_PORT + 1})
    assert [SERVE_PORT + 1, replica["address"]] in _listed(b, "map", "serve_dnat")
    assert {"concat": ["192.0.2.1", SERVE_PORT + 1]} in _listed(b, "set", "serve_from")
    b.kill()
    b.start()
    assert _listed(b, "map", "serve_dnat") == [] and _listed(b, "set", "serve_from") == []
    assert b.ask(op="routes", peers=PEERS) == {"done": True}  # as the server gives a new agent
