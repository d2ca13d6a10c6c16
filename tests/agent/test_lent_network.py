"""A namespace lent by a node's agent to a pod another process starts (on Ray, an actor-carried pod:
providers/ray/actor.py): the pod runs in it fenced off as the agent's own pods are, and the
namespace lives exactly while the pod does: given back by the borrower, or found ended by the
lender from the pod's record when the borrower is gone, kept over the lender's restart while the
pod runs.

Two agents of this machine stand for the node agent (the lender, with the node's block) and the pod
actor (the borrower, without a network of its own). Root, iproute2 and nftables (`make test-deps`);
elsewhere these skip with the reason.
"""

from __future__ import annotations

import ipaddress
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from factories import pod_python
from gpupool.agent import netns, node
from gpupool.agent.netns import NetnsMode, NetworkSettings, PodNet
from gpupool.agent.node import NodeAgent
from gpupool.pods import PodLaunch
from netns_scripts import connect, eventually, listen

WHY = netns.probe()
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"network namespaces cannot be made here: {WHY}")
NETWORK = ipaddress.IPv4Network("10.234.0.0/16")
"""This file's own pod network: test files that run at once never share one."""
ON = NetworkSettings(mode=NetnsMode.ON, pod_network=NETWORK)
SLOT = 2
PY = pod_python()


class Lent:
    """The borrower's side (what the pod actor's NodeNetwork does over Ray, called directly)."""

    def __init__(self, lender: NodeAgent, borrower: NodeAgent) -> None:
        self.lender, self.borrower = lender, borrower

    def lend(self, pod: PodLaunch, url: str) -> tuple[PodNet | None, str, str]:
        return self.lender.lend(pod, self.borrower.runner.pod_dir(pod.pod_id) / "state.json", url)

    def give_back(self, pod_id: str) -> None:
        self.lender.take_back(pod_id)


def lender_agent(path: Path) -> NodeAgent:
    """A node agent as a Ray node's starts: without namespaces until its plan (use_network)."""
    agent = NodeAgent(path, node_name="n0", simulate="1xT4", network=NetworkSettings(mode=NetnsMode.OFF))
    agent.network.spares = 0
    return agent


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[NodeAgent, NodeAgent]]:
    lender = lender_agent(tmp_path / "node")
    lender.use_network(ON, SLOT, ())
    lender.network.spares = 0
    borrower = NodeAgent(tmp_path / "pod", node_name="n0", simulate="1xT4")
    borrower.lender = Lent(lender, borrower)
    yield lender, borrower
    borrower.close(stop_pods=True)
    lender.close(stop_pods=True)
    leftover = netns.PodNetwork(ON, SLOT)
    leftover.spares = 0
    leftover.start({})  # sweeps what a test's restarted lender left
    leftover.close()


def launch(agent: NodeAgent, pod_id: str, tenant: str, script: str) -> None:
    agent.launch(PodLaunch(pod_id=pod_id, workload_id="w-" + pod_id, node="n0", command=(PY, "-c", script),
                           tenant=tenant))


def output(agent: NodeAgent, pod_id: str, text: str) -> str:
    found = ""

    def printed() -> bool:
        nonlocal found
        found = agent.read_log(pod_id).text
        return text in found

    assert eventually(printed), found
    return found


def ended(agent: NodeAgent, pod_id: str) -> bool:
    return any(r.pod_id == pod_id and r.finished for r in agent.poll())


def test_a_borrowers_pod_runs_in_the_lenders_block_fenced_off_from_other_tenants(
        pair: tuple[NodeAgent, NodeAgent]) -> None:
    lender, borrower = pair
    launch(borrower, "alice-server", "alice", listen("secret of alice"))
    address = output(borrower, "alice-server", "address").split()[1]
    assert ipaddress.IPv4Address(address) in lender.network.subnet
    assert lender.network.attached() == ["alice-server"]
    launch(lender, "bob-probe", "bob", connect(address))
    launch(borrower, "alice-probe", "alice", connect(address))
    assert eventually(lambda: ended(lender, "bob-probe") and ended(borrower, "alice-probe"))
    assert lender.read_log("bob-probe").text.strip() == "blocked TimeoutError"
    assert borrower.read_log("alice-probe").text.strip() == "reached secret of alice"
    borrower.stop("alice-server", grace_s=0)
    assert eventually(lambda: ended(borrower, "alice-server"))  # its poll gives the namespace back
    assert "alice-server" not in lender.network.attached()


def test_the_lender_takes_back_the_namespace_of_a_pod_that_ended_while_its_borrower_was_gone(
        pair: tuple[NodeAgent, NodeAgent]) -> None:
    lender, borrower = pair
    launch(borrower, "orphan", "alice", "import time; print('up', flush=True); time.sleep(60)")
    output(borrower, "orphan", "up")
    lender.end_lent()
    assert lender.network.attached() == ["orphan"]  # it runs: the namespace stays
    pid = borrower.runner.known("orphan").pid  # type: ignore[union-attr]
    borrower.lender = None
    borrower.close()  # the borrower is gone, as a crash would (its pod runs on): nobody gives it back
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # the pod ends with nobody to record it: its record says it runs

    def taken_back() -> bool:
        lender.end_lent()  # what its node agent does at each description the provider asks for
        return not lender.network.attached()

    assert eventually(taken_back)


def test_a_namespace_whose_pod_never_started_goes_after_the_grace(
        pair: tuple[NodeAgent, NodeAgent], monkeypatch: pytest.MonkeyPatch) -> None:
    lender, borrower = pair
    net, _url, detail = borrower.lender.lend(  # type: ignore[union-attr]
        PodLaunch(pod_id="never", workload_id="w", node="n0", command=("true",), tenant="alice"), "")
    assert net is not None and detail.startswith("network namespace ")
    lender.end_lent()
    assert lender.network.attached() == ["never"]  # within the grace: its start may still come
    monkeypatch.setattr(node, "LENT_GRACE_S", 0.0)
    lender.end_lent()
    assert lender.network.attached() == []


def test_a_restarted_lender_keeps_the_namespace_of_a_running_pod_and_ends_it_after(
        pair: tuple[NodeAgent, NodeAgent], tmp_path: Path) -> None:
    lender, borrower = pair
    launch(borrower, "long", "alice", listen("secret of alice"))
    address = output(borrower, "long", "address").split()[1]
    net = PodNet.from_json(borrower.runner.known("long").net)  # type: ignore[union-attr]
    assert net is not None and net.address == address
    lender.close()  # as a crash would: the pod runs on
    again = lender_agent(tmp_path / "node")
    again.adopt_lent({"long": borrower.runner.pod_dir("long") / "state.json"})
    again.use_network(ON, SLOT, ())  # its start sweeps the block: the running pod's namespace stays
    borrower.lender = Lent(again, borrower)
    try:
        assert (netns.NETNS_DIR / net.netns).exists() and again.network.attached() == ["long"]
        launch(again, "alice-probe", "alice", connect(address))
        assert eventually(lambda: ended(again, "alice-probe"))
        assert again.read_log("alice-probe").text.strip() == "reached secret of alice"
        borrower.stop("long", grace_s=0)
        assert eventually(lambda: ended(borrower, "long"))
        assert again.network.attached() == []
    finally:
        again.close(stop_pods=True)
