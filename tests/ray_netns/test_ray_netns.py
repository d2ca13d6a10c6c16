"""Pod network namespaces on Ray nodes: each machine gets its own block of the pod network from the
store when it joins (and gives it back when it leaves), its gang's MASTER_ADDR comes from that
block, a gang's two pods on two machines reach each other, and a pod of another tenant on the other
machine cannot connect. Two simulated Ray nodes on this host (one cluster for the module: a Ray
head takes about ten seconds to start); root, iproute2 and nftables, else skipped with why.

Its own package: a process is connected to one Ray cluster at a time, and tests/ray_provider keeps
its own cluster up for all of its modules.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import ipaddress
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="the ray provider needs Ray (pip install 'gpupool[ray]')")

import httpx
import ray

from factories import pod_python
from gpupool.agent import netns
from gpupool.agent.netns import NetnsMode, NetworkSettings
from gpupool.agent.podstate import PodRecord, save_record
from gpupool.errors import NotFound
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.base import Capability
from gpupool.providers.ray import RayProvider
from gpupool.providers.ray.actor import PodActor
from gpupool.providers.ray.network import NetworkPlan
from gpupool.providers.ray.node_agent import PLAN_FILE, NodeAgentActor
from gpupool.providers.ray.nodeconfig import NodeConfig, node_agent_name, pod_actor_name
from gpupool.providers.ray.settings import NAMESPACE
from gpupool.server.dataplane.model import Backend, Probe, Route
from gpupool.server.dataplane.plane import DataPlane
from gpupool.server.db import Store
from gpupool.server.services.netblocks import StoreBlocks
from netns_scripts import connect, listen
from ports import free_port
from ray_provider.conftest import FAST_HEALTH_CHECKS, wait_for

WHY = netns.probe()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(WHY), reason=f"network namespaces cannot be made here: {WHY}")]
NETWORK = ipaddress.IPv4Network("10.248.0.0/16")
"""This file's own pod network: test files that run at once never share one."""
OTHER_NETWORK = ipaddress.IPv4Network("10.249.0.0/16")
"""Another pool's pod network (an agent of it answers a block outside NETWORK)."""
SPARE_SLOTS = (5, 6)
"""Blocks no simulated node of the module's pool takes (it has two): for agents a test starts."""
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
    """What the simulated machines' agents (and the tests' own agents) left (killed, they closed
    nothing): an agent's start on each block sweeps whatever no live pod holds, as a machine's next
    join would."""
    blocks = [(NETWORK, slot) for slot in (0, 1, *SPARE_SLOTS)] + [(OTHER_NETWORK, 0)]
    for network, slot in blocks:
        leftover = netns.PodNetwork(NetworkSettings(mode=NetnsMode.ON, pod_network=network), slot)
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

    try:
        return str(wait_for(printed, 60, f"{pod_id} to print {text!r}"))
    except AssertionError as exc:  # say where the pod got to: a pod that failed to start prints nothing
        raise AssertionError(f"{exc}; the pod is {_status(provider, pod_id)}; "
                             f"its Ray actor: {_actor_state(pod_id)}") from None


def _actor_state(pod_id: str) -> object:
    """What Ray's control store says of an actor-carried pod's actor (its state, and why it died):
    whether Ray had started its process at all."""
    try:  # Ray has no public call for it without its dashboard
        found = [info for info in ray._private.state.actors().values()
                 if info.get("Name") == pod_actor_name(pod_id)]
    except Exception as exc:  # a diagnosis only: never the test's failure
        return f"unknown ({type(exc).__name__})"
    keys = ("State", "NumRestarts", "DeathCause", "Address")
    return [{key: info.get(key) for key in keys} for info in found]


def _agent(name: str, directory: Path) -> tuple[NodeConfig, Any]:
    """A node's agent of this machine under `name`, with one simulated device: its config and actor."""
    config = NodeConfig(name, str(directory), simulate="1xT4")
    return config, NodeAgentActor.options(  # type: ignore[attr-defined]
        name=node_agent_name(name), namespace=NAMESPACE).remote(config)


def _kill_for_good(*agents: object) -> None:
    """Kill the agents and wait until their processes are gone: `ray.kill` returns before the
    process ends, and until it does it holds its block's claim (a lock file), so the next test's
    agent on the same spare block would be refused ("another agent on this machine uses ...")."""
    pids = []
    for agent in agents:
        with contextlib.suppress(Exception):  # dead already, or never started: nothing to wait for
            pids.append(ray.get(agent.pid.remote(), timeout=30))  # type: ignore[attr-defined]
        ray.kill(agent, no_restart=True)  # type: ignore[arg-type]

    def gone(pid: int) -> bool:
        try:  # a zombie has closed its files (and the claim) already
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except (FileNotFoundError, ProcessLookupError):
            return True

    for pid in pids:
        wait_for(functools.partial(gone, pid), 60, f"the killed agent's process {pid} to end")


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


SERVE_PORT = 29_801
SERVE = f"""
import os
from http.server import BaseHTTPRequestHandler, HTTPServer

ADDRESS = os.environ.get("GPUPOOL_POD_ADDRESS", "the node's network")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ok" if self.path == "/ready" else f"replica at {{ADDRESS}}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = HTTPServer(("0.0.0.0", {SERVE_PORT}), Handler)
print("serving at", ADDRESS, flush=True)
server.serve_forever()
"""


def test_a_service_replica_has_its_own_namespace_and_is_served_through_the_pool(
        pool: tuple[RayProvider, Store], tmp_path: Path) -> None:
    """A replica runs in its own namespace, in its node's block, and the pool's data plane (on the
    server's machine, this host) reaches it at the node's address, where its node takes the serve
    port to it for the server's address; another tenant's pod on the other machine does not."""
    provider, store = pool
    _launch(provider, "replica", "t4-000", "alice", SERVE, serve_port=SERVE_PORT)
    address = _log(provider, "replica", "serving at").split()[2]
    assert ipaddress.IPv4Address(address) in netns.node_subnet(NETWORK, StoreBlocks(store).held()["t4-000"])
    host = provider.pod_address("t4-000", "replica")
    assert host == provider.node_address("t4-000")  # the router's and probes' endpoint is unchanged
    _launch(provider, "mallory-probe", "t4-001", "mallory", connect(host, SERVE_PORT))
    plane = DataPlane(tmp_path / "dataplane", "127.0.0.1", free_port(), cold_start_limit_s=20.0)
    plane.start()
    try:
        plane.set_tokens({hashlib.sha256(b"gp_alice").hexdigest(): "alice"})
        plane.set_routes([Route("alice/web", "alice", probe=Probe(path="/ready", interval_s=0.2,
                                                                  success_threshold=1, failure_threshold=2))])
        plane.set_backends("alice/web", [Backend("replica", host, SERVE_PORT)])
        answer = httpx.get(f"{plane.url}/s/alice/web/hello", headers={"Authorization": "Bearer gp_alice"},
                           timeout=30)
        assert (answer.status_code, answer.text) == (200, f"replica at {address}")
    finally:
        plane.stop()
    assert _final(provider, "mallory-probe").phase is PodPhase.SUCCEEDED
    assert provider.read_log("mallory-probe").text.strip() == "blocked TimeoutError"
    provider.stop("replica", grace_s=1)
    _final(provider, "replica")


def _remote_set() -> set[str]:
    """The addresses in the host table's set of other machines' pods."""
    done = subprocess.run(["nft", "-j", "list", "set", "inet", netns.TABLE, "remote"], capture_output=True,
                          text=True, check=True)
    sets = [item["set"] for item in json.loads(done.stdout)["nftables"] if "set" in item]
    return {str(e) for body in sets for e in body.get("elem", [])}


def test_a_restarted_agent_takes_its_plan_and_the_other_machines_pods_at_once(
        pool: tuple[RayProvider, Store], tmp_path: Path) -> None:
    """Two more agents, p and q, each told by the plans the test sends (as the provider would) that
    the other is a machine of another host (at an address of TEST-NET-2). p starts a pod that q is
    not told of (p's plan does not name q yet); then Ray restarts q's agent on the same Ray node (no
    machine sees a join). Before anything is sent to it, the restarted agent has its block again (a
    pod launched there gets its namespace, not the node's network) and has taken p's whole set from
    p's agent."""
    provider, _store = pool
    settings = provider.network.settings
    assert settings is not None
    machines = {"p": (SPARE_SLOTS[0], "198.51.100.8"), "q": (SPARE_SLOTS[1], "198.51.100.9")}
    agents = {name: _agent(name, tmp_path / name)[1] for name in machines}

    def plan(name: str, *others: str) -> NetworkPlan:  # the others at addresses of another host
        named = sorted({name, *others})
        peers = tuple((n, machines[n][0], machines[n][1] if n != name else "127.0.0.1") for n in named)
        return NetworkPlan(settings, (), machines[name][0], peers, tuple((n, n) for n in named))

    def launch(name: str, pod_id: str) -> None:  # a gang's rank 1: its address is given up at its end
        started = ray.get(agents[name].launch.remote(PodLaunch(
            pod_id=pod_id, workload_id="w-" + pod_id, node=name, tenant="carol", rank=1, world_size=2,
            master_addr="10.248.0.16", master_port=PORT, command=(PY, "-c", "import time; time.sleep(120)"))),
            timeout=60)
        assert not started.phase.is_final, started

    def take(name: str, given: NetworkPlan) -> None:
        assert ray.get(agents[name].use_network.remote(given), timeout=60).network_slot == given.slot

    def ended(name: str, pod_id: str) -> bool:
        return bool(ray.get(agents[name].statuses.remote([pod_id]), timeout=30)[pod_id].phase.is_final)

    def addresses(name: str) -> list[str]:
        return [m.address for m in ray.get(agents[name].network_snapshot.remote(), timeout=30)[3]]

    try:
        take("p", plan("p"))
        take("q", plan("q", "p"))
        launch("p", "p-pod")
        (address,) = addresses("p")
        assert address not in _remote_set()  # q was not told of it

        pid = ray.get(agents["q"].pid.remote(), timeout=30)
        ray.kill(agents["q"], no_restart=False)
        wait_for(lambda: ray.get(agents["q"].pid.remote(), timeout=30) != pid, 60, "q's agent to restart")
        assert ray.get(agents["q"].describe.remote(), timeout=30).network_slot == machines["q"][0]
        assert address in _remote_set()  # taken from p's agent
        launch("q", "q-pod")
        (mine,) = addresses("q")  # in its own namespace, at an address of its block
        assert ipaddress.IPv4Address(mine) in netns.node_subnet(NETWORK, machines["q"][0])

        # p learns of q (its plan names it now): what it says from then on reaches q, numbered after
        # the whole set it told q
        take("p", plan("p", "q"))
        for name, pod_id in (("p", "p-pod"), ("q", "q-pod")):
            ray.get(agents[name].stop.remote(pod_id, 1.0), timeout=30)
            wait_for(functools.partial(ended, name, pod_id), 60, f"{pod_id} to end")
        wait_for(lambda: address not in _remote_set(), 60, "q to forget p's ended pod")
    finally:
        _kill_for_good(*agents.values())
        for slot, _address in machines.values():  # where the host has a way to the addresses named
            subprocess.run(["ip", "route", "del", str(netns.node_subnet(NETWORK, slot))], capture_output=True,
                           check=False)


def test_a_restarted_agent_that_cannot_take_its_kept_plan_still_starts(
        pool: tuple[RayProvider, Store], tmp_path: Path) -> None:
    """The block of the plan an agent kept is held by another agent of this machine when Ray
    restarts it (the plan names another block than the one it had): the agent starts without
    namespaces (its description says so; the server's next plan is taken as ever) instead of failing
    its start over and over."""
    provider, _store = pool
    settings = provider.network.settings
    assert settings is not None
    mine, held = SPARE_SLOTS
    _, agent = _agent("r", tmp_path)
    holder = netns.PodNetwork(NetworkSettings(mode=NetnsMode.ON, pod_network=NETWORK), held)
    holder.spares = 0
    try:
        plan = NetworkPlan(settings, (), mine, (("r", mine, "127.0.0.1"),), (("r", "r"),))
        assert ray.get(agent.use_network.remote(plan), timeout=60).network_slot == mine
        holder.start({})  # holds block `held` from now on
        kept = tmp_path / "node" / PLAN_FILE
        kept.write_text(replace(plan, slot=held, peers=(("r", held, "127.0.0.1"),)).to_json())
        pid = ray.get(agent.pid.remote(), timeout=30)
        ray.kill(agent, no_restart=False)
        wait_for(lambda: ray.get(agent.pid.remote(), timeout=30) != pid, 60, "r's agent to restart")
        assert ray.get(agent.describe.remote(), timeout=30).network_slot == -1
        assert ray.get(agent.use_network.remote(plan), timeout=60).network_slot == mine  # the server's
    finally:
        _kill_for_good(agent)
        holder.close()


def test_an_agent_takes_its_plan_though_another_machine_answers_a_block_not_of_its_pod_network(
        pool: tuple[RayProvider, Store], tmp_path: Path) -> None:
    """Another machine's agent answers its whole set with a block outside this pool's pod network
    (an agent of another pool under the same name): its pods are not taken, and the plan is."""
    provider, _store = pool
    settings = provider.network.settings
    assert settings is not None
    other = NetworkSettings(mode=NetnsMode.ON, pod_network=OTHER_NETWORK)
    agents = {name: _agent(name, tmp_path / name)[1] for name in ("s", "t")}
    try:
        s_plan = NetworkPlan(other, (), 0, (("s", 0, "127.0.0.1"),), (("s", "s"),))
        assert ray.get(agents["s"].use_network.remote(s_plan), timeout=60).network_slot == 0
        t_slot, s_slot = SPARE_SLOTS  # s as t's plan names it: another host's
        peers = (("s", s_slot, "198.51.100.7"), ("t", t_slot, "127.0.0.1"))
        t_plan = NetworkPlan(settings, (), t_slot, peers, (("s", "s"), ("t", "t")))
        assert ray.get(agents["t"].use_network.remote(t_plan), timeout=60).network_slot == t_slot
    finally:
        _kill_for_good(*agents.values())
        subprocess.run(["ip", "route", "del", str(netns.node_subnet(NETWORK, SPARE_SLOTS[1]))],
                       capture_output=True, check=False)


@pytest.fixture(scope="module")
def actors(pool: tuple[RayProvider, Store]) -> Iterator[RayProvider]:
    """A provider of the actor carrier on the module's cluster (its pods' namespaces are lent by the
    node agents the module's provider gave their blocks and plans)."""
    provider = RayProvider(pool[0].address, data_dir=pool[0].data_dir, pod_carrier="actor")
    try:
        yield provider
    finally:
        provider.close(stop_pods=True)


def _addresses(provider: RayProvider, node: str) -> list[str]:
    """The addresses of the pods in `node`'s namespaces, as its agent tells the other machines."""
    agent = ray.get_actor(node_agent_name(node), namespace=NAMESPACE)
    return [m.address for m in ray.get(agent.network_snapshot.remote(), timeout=30)[3]]


def test_an_actor_carried_pod_has_its_namespace_and_another_tenants_pod_cannot_reach_it(
        pool: tuple[RayProvider, Store], actors: RayProvider) -> None:
    provider, store = pool
    # a gang's rank 1 (its namespace is never kept for the tenant's next pod: its address is given
    # up when it ends)
    gang = {"workload_id": "bob-gang", "world_size": 2, "master_addr": "10.248.0.16", "master_port": PORT + 2}
    _launch(actors, "bob-actor-server", "t4-000", "bob", listen("secret of bob"), rank=1, **gang)
    address = _log(actors, "bob-actor-server", "address").split()[1]
    assert ipaddress.IPv4Address(address) in netns.node_subnet(NETWORK, StoreBlocks(store).held()["t4-000"])
    assert address in _addresses(provider, "t4-000")  # the node agent's, told to the other machines
    _launch(actors, "alice-actor-probe", "t4-001", "alice", connect(address))
    _launch(actors, "bob-actor-probe", "t4-001", "bob", connect(address))
    _launch(provider, "alice-group-probe", "t4-000", "alice", connect(address))
    for owner, pod_id in ((actors, "alice-actor-probe"), (actors, "bob-actor-probe"),
                          (provider, "alice-group-probe")):
        assert _final(owner, pod_id).phase is PodPhase.SUCCEEDED
    assert actors.read_log("alice-actor-probe").text.strip() == "blocked TimeoutError"
    assert provider.read_log("alice-group-probe").text.strip() == "blocked TimeoutError"
    assert actors.read_log("bob-actor-probe").text.strip() == "reached secret of bob"
    actors.stop("bob-actor-server", grace_s=1)
    _final(actors, "bob-actor-server")
    wait_for(lambda: address not in _addresses(provider, "t4-000"), 60, "its address to be given up")


def test_an_actor_carried_gang_meets_at_the_master_addr_of_its_block(
        pool: tuple[RayProvider, Store], actors: RayProvider) -> None:
    provider, _store = pool
    port = PORT + 1
    addr = provider.gang_address("t4-000", port)
    gang = {"workload_id": "actor-train", "world_size": 2, "master_addr": addr, "master_port": port}
    _launch(actors, "actor-train-r0", "t4-000", "carol", RANK0, rank=0, **gang)
    _launch(actors, "actor-train-r1", "t4-001", "carol", RANK1, rank=1, **gang)
    for pod_id in ("actor-train-r0", "actor-train-r1"):
        status = _final(actors, pod_id)
        assert status.phase is PodPhase.SUCCEEDED, (pod_id, status, actors.read_log(pod_id).text)
    rank1 = actors.read_log("actor-train-r1").text.split()
    assert rank1[3:] == ["got", "rank0"], rank1
    assert f"rank0 got rank1 from {rank1[2]}" in actors.read_log("actor-train-r0").text


def test_a_pod_actor_holding_its_nodes_fence_gets_its_namespace_while_a_takeover_waits(
        pool: tuple[RayProvider, Store]) -> None:
    """A leader's launch by a pod actor holds the node's fence (agent/fencing.py, admitting) while it
    asks the node's agent for the pod's namespace; a new leader's takeover (`fence`) waits for that
    launch: the namespace is lent all the same, and then the takeover goes on."""
    provider, _store = pool
    agent = ray.get_actor(node_agent_name("t4-000"), namespace=NAMESPACE)
    description = provider.membership.description("t4-000")
    assert description is not None
    fd = os.open(description.config.agent_dir() / "epoch.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # as the pod actor's launch holds it
        fenced = agent.fence.remote(1)
        assert not ray.wait([fenced], timeout=1)[0]  # the takeover waits for the launch
        pod = PodLaunch(pod_id="fenced-launch", workload_id="w", node="t4-000", command=(PY,), tenant="alice")
        net, _url, detail = ray.get(agent.lend_network.remote(pod, ""), timeout=20)
        assert net is not None, detail
    finally:
        os.close(fd)
    assert ray.get(fenced, timeout=30) >= 1
    ray.get(agent.return_network.remote("fenced-launch"), timeout=30)


def test_a_restarted_agent_keeps_the_namespace_it_lent_to_a_running_pod(
        pool: tuple[RayProvider, Store], tmp_path: Path) -> None:
    """Ray restarts a node's agent while an actor-carried pod runs in a namespace it lent: the
    restarted agent's start sweeps its block, but not that namespace (it reads the pod's record), so
    the pod still serves its tenant's pods at its address."""
    provider, _store = pool
    settings = provider.network.settings
    assert settings is not None
    slot = SPARE_SLOTS[0]
    config, agent = _agent("u", tmp_path)
    pods: list[object] = []

    def carried(pod_id: str, script: str) -> object:
        pod = PodLaunch(pod_id=pod_id, workload_id="w-" + pod_id, node="u", tenant="alice",
                        command=(PY, "-c", script))
        pods.append(PodActor.remote(pod, config))  # type: ignore[attr-defined]
        return pods[-1]

    def printed(actor: object) -> str:
        return str(ray.get(actor.read_log.remote("stdout", 0), timeout=30).text)  # type: ignore[attr-defined]

    def ended(actor: object) -> bool:
        return bool(ray.get(actor.status.remote(), timeout=30).phase.is_final)  # type: ignore[attr-defined]

    try:
        plan = NetworkPlan(settings, (), slot, (("u", slot, "127.0.0.1"),), (("u", "u"),))
        assert ray.get(agent.use_network.remote(plan), timeout=60).network_slot == slot
        server = carried("lent-server", listen("secret of alice"))
        wait_for(lambda: "address" in printed(server), 60, "the pod to listen")
        address = printed(server).split()[1]
        assert ipaddress.IPv4Address(address) in netns.node_subnet(NETWORK, slot)
        pid = ray.get(agent.pid.remote(), timeout=30)
        ray.kill(agent, no_restart=False)
        wait_for(lambda: ray.get(agent.pid.remote(), timeout=30) != pid, 60, "u's agent to restart")
        assert ray.get(agent.describe.remote(), timeout=30).network_slot == slot
        probe = carried("lent-probe", connect(address))
        wait_for(lambda: printed(probe), 60, "the probe to say what it reached")
        assert printed(probe).strip() == "reached secret of alice"
    finally:
        for actor in pods:  # its pod is not the actor's process: stopped first
            ray.get(actor.stop.remote(0.0), timeout=30)  # type: ignore[attr-defined]
            wait_for(functools.partial(ended, actor), 30, "the pod to end")
            ray.kill(actor, no_restart=True)  # type: ignore[arg-type]
        _kill_for_good(agent)


def test_the_agent_reads_the_log_of_a_pod_its_actor_is_starting_without_ending_its_loan(
        pool: tuple[RayProvider, Store], tmp_path: Path) -> None:
    """Until an actor-carried pod's actor first answers, the provider reads the pod's log from its
    node's agent, so also while the actor starts the pod: its record saved, its process not yet
    started (Runner.start). The agent reads the log without taking the pod on: the record stays as
    the actor wrote it, and the namespace lent to the pod stays through the agent's next look at its
    loans (describe: NodeAgent.end_lent)."""
    provider, _store = pool
    settings = provider.network.settings
    assert settings is not None
    slot = SPARE_SLOTS[0]
    config, agent = _agent("v", tmp_path)
    # a gang's rank 1: its namespace is never kept for the tenant's next pod once taken back
    pod = PodLaunch(pod_id="starting", workload_id="w-starting", node="v", tenant="alice", command=(PY,),
                    rank=1, world_size=2, master_addr="10.248.0.16", master_port=PORT + 3)
    try:
        plan = NetworkPlan(settings, (), slot, (("v", slot, "127.0.0.1"),), (("v", "v"),))
        assert ray.get(agent.use_network.remote(plan), timeout=60).network_slot == slot
        net, _url, detail = ray.get(agent.lend_network.remote(pod, ""), timeout=30)
        assert net is not None, detail
        record = config.pod_record(pod.pod_id)  # as the actor's runner saves it before the shim starts
        record.parent.mkdir(parents=True, mode=0o700)
        save_record(record, PodRecord(pod_id=pod.pod_id, command=[PY], workdir=str(record.parent),
                                      net=net.to_json()))
        saved = record.read_text()
        chunk = ray.get(agent.read_log.remote(pod.pod_id, "stdout", 0), timeout=30)
        ray.get(agent.describe.remote(), timeout=30)
        members = [m.address for m in ray.get(agent.network_snapshot.remote(), timeout=30)[3]]
        assert net.address in members
        assert record.read_text() == saved
        assert (chunk.text, chunk.finished) == ("", False)
    finally:
        with contextlib.suppress(Exception):
            ray.get(agent.return_network.remote(pod.pod_id), timeout=30)
        _kill_for_good(agent)


def test_a_machine_that_leaves_gives_its_block_back(pool: tuple[RayProvider, Store]) -> None:
    provider, store = pool
    leaving = next(j for j in provider.joined if j.config.name == "t4-001")
    leaving.process.stop(grace_s=2)
    wait_for(lambda: "t4-001" not in StoreBlocks(store).held(), 60, "t4-001's block to be given back")
    assert list(StoreBlocks(store).held()) == ["t4-000"]
