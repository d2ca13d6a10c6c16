"""A machine whose agent restarts (a Ray node agent that keeps its Ray node id: the other machines
see no join) misses what the other machines' agents said meanwhile: the pods that started there and
those that ended, whose addresses may now be another tenant's. The restarted agent reads the other
machines' pods back from its host's table, and takes each machine's whole set from its agent
(providers/ray/node_agent.py, `network_snapshot`): a pod it starts reaches its gang's rank 0 that
started on the other machine while it was away, and the pod of another tenant that took over the
address of one of its tenant's ended pods is not let in as that tenant.

Two hosts, each a network namespace with its own table, as in test_pod_network_hosts.py (its agent
script and functions); the words the agents say are handed over by the test, numbered as the Ray
agents number them. Root, iproute2, nftables and nsenter, else skipped with why.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from agent.test_pod_network_hosts import Host, _reach, _serve, joined, pytestmark  # noqa: F401  (skips)
from gpupool.agent import netns
from gpupool.agent.netns import tenant_key

NETWORK = ipaddress.IPv4Network("10.233.0.0/16")
"""This file's own pod network: test files that run at once never share one."""
GANG_PORT = 29_743


class Words:
    """One machine's agent's words to the other, numbered in the order it said them."""

    def __init__(self, origin: str, source: Host) -> None:
        self.origin, self.source = origin, source
        self.incarnation = os.urandom(4).hex()
        self.seq = 0

    def said(self) -> list[dict[str, Any]]:
        """What the agent announced since last asked, each numbered."""
        words = []
        for message in self.source.announced:
            self.seq += 1
            words.append({"origin": self.origin, "incarnation": self.incarnation, "seq": self.seq,
                          "added": message["added"], "removed": message["gone"]})
        self.source.announced.clear()
        return words

    def relay(self, target: Host) -> None:
        for word in self.said():
            assert target.ask(op="told", **word) == {"done": True}

    def snapshot(self) -> dict[str, Any]:
        """Its whole set, as `network_snapshot` answers it: numbered with its last word."""
        whole = self.source.ask(op="members")
        return {"origin": self.origin, "incarnation": self.incarnation, "seq": self.seq,
                "added": whole["members"], "removed": [], "block": whole["block"]}


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[Host, Host]]:
    key = os.urandom(3).hex()
    a, b = Host(f"gprA-{key}", 0, NETWORK), Host(f"gprB-{key}", 1, NETWORK)
    with joined(a, b):
        yield a, b


def _elements(host: Host, name: str) -> list[str]:
    """The addresses in set `name` of `host`'s table."""
    done = subprocess.run(["ip", "netns", "exec", host.name, "nft", "-j", "list", "set", "inet",
                           netns.TABLE, name], capture_output=True, text=True, check=True)
    sets = [item["set"] for item in json.loads(done.stdout)["nftables"] if "set" in item]
    return [str(e) for body in sets for e in body.get("elem", [])]


PEERS = [["a", 0, "192.0.2.1"], ["b", 1, "192.0.2.2"]]


def test_a_restarted_agent_learns_what_the_other_machine_started_and_ended_meanwhile(
        hosts: tuple[Host, Host]) -> None:
    a, b = hosts
    for host in (a, b):
        assert host.ask(op="routes", peers=PEERS) == {"done": True}
    from_a = Words("a", a)
    # before the restart: two pods of carol's on a (a gang's ranks 1 and 2: their addresses are
    # given up when they end, not kept for carol), told to b
    old_gang = {"workload_id": "old", "master_addr": "10.233.0.16", "master_port": GANG_PORT, "world_size": 3}
    old, old2 = (a.ask(op="attach", pod_id=f"old{rank}", tenant="carol", gang={**old_gang, "rank": rank})
                 for rank in (1, 2))
    from_a.relay(b)
    carol = tenant_key("carol", NETWORK)
    assert [old["address"], carol] in [m[:2] for m in b.ask(op="remote_members")["members"]]

    b.kill()
    # while b's agent is away: carol's old pods end, bob's pod takes the address of one, and carol's
    # new gang's rank 0 starts on a; b is told none of it
    for pod_id in ("old1", "old2"):
        assert a.ask(op="detach", pod_id=pod_id) == {"done": True}
    bob = a.ask(op="attach", pod_id="bob", tenant="bob")
    assert bob["address"] == old["address"]  # the lowest free address: the one carol's pod gave up
    master = a.ask(op="gang_address", port=GANG_PORT)["address"]
    gang = {"workload_id": "train", "master_addr": master, "master_port": GANG_PORT, "world_size": 2}
    rank0 = a.ask(op="attach", pod_id="train-r0", tenant="carol", gang={**gang, "rank": 0})
    from_a.said()  # lost: nobody took them

    b.start()
    # the restarted agent knows the pods its table holds (carol's old one among them)...
    held = b.ask(op="remote_members")["members"]
    assert {(old["address"], carol), (old2["address"], carol)} <= {(m[0], m[1]) for m in held}, held
    assert b.ask(op="routes", peers=PEERS) == {"done": True}
    # ... and takes a's whole set (the words it missed are in it): carol's ended pods are forgotten
    assert b.ask(op="told", **from_a.snapshot()) == {"done": True}
    known = {m[0]: m[1] for m in b.ask(op="remote_members")["members"]}
    assert known == {bob["address"]: tenant_key("bob", NETWORK), rank0["address"]: carol}, known

    rank1 = b.ask(op="attach", pod_id="train-r1", tenant="carol", gang={**gang, "rank": 1})
    b_words = Words("b", b)
    b_words.relay(a)
    servers = [_serve(a, rank0["netns"], "rank0 of carol", GANG_PORT),
               _serve(b, rank1["netns"], "rank1 of carol"), _serve(a, bob["netns"], "bob's")]
    try:
        # the pod started after the restart reaches its gang's rank 0, started while it was away
        assert _reach(b, rank1["netns"], master, GANG_PORT) == "reached rank0 of carol"
        # bob's pod, at the address carol's ended pod had, is not let in as carol: b's own table
        # says so (a's table drops what bob's pod sends to carol's pods too)
        assert bob["address"] not in _elements(b, f"ta_{carol}")
        assert bob["address"] in _elements(b, f"ta_{tenant_key('bob', NETWORK)}")
        assert _reach(a, bob["netns"], rank1["address"]) == "blocked TimeoutError"
        assert _reach(b, rank1["netns"], bob["address"]) == "blocked TimeoutError"
    finally:
        for server in servers:
            server.kill()
            server.wait()
