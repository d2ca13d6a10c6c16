"""Gangs across nodes: each pod's rendezvous (MASTER_ADDR of the rank-0 node, a MASTER_PORT reserved
there that no other gang shares), its ranks, and NCCL's IB settings from the node's ports and the
pool's fabric configuration; driven step by step through the live loop."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import ManualProvider

from factories import ALL_REDUCE, pod_python
from gpupool.agent import netns
from gpupool.api.workloads import WorkloadSpec
from gpupool.config import GangsConfig, parse_config
from gpupool.core.model import Device, IbPort, Node
from gpupool.errors import InvalidInput
from gpupool.pods import PodLaunch
from gpupool.providers.base import Provider
from gpupool.providers.localpool import LocalPool
from gpupool.providers.nodespec import nodes_from_spec
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops.control import ControlLoop
from gpupool.server.orm import WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import rendezvous, workloads
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings
from ports import gang_config, gang_ports

ADMIN = Principal("admin", None)
NETWORK = ipaddress.IPv4Network("10.232.0.0/16")
"""This file's own pod network (test files that run at once never share one)."""
CONFIG = """
scheduling: {placement: first-fit, backfill: false}
fabric:
  qos: {critical: 0.8, normal: 0.15, scavenger: 0.05}
  partitions: {default: 1}
"""


def _node(name: str, cpus: int, hcas: tuple[str, ...] = ()) -> Node:
    ports = tuple(IbPort(hca=h, port=1, state="ACTIVE") for h in hcas)
    devices = tuple(Device(uuid=f"{name}-d{i}", model="H100", index=i) for i in range(4))
    return Node(name=name, cpu_milli=cpus * 1000, memory_mib=65_536, devices=devices, ib_ports=ports)


class AddressedProvider(ManualProvider):
    """A hand-driven provider whose nodes have addresses of their own, as a Ray cluster's do."""

    def node_address(self, node: str) -> str:
        return {"n0": "10.0.0.10", "n1": "10.0.0.11"}.get(node, "127.0.0.1")


class Pool:
    def __init__(self, tmp_path: Path, config: str = CONFIG, provider: Provider | None = None) -> None:
        self.provider = provider or AddressedProvider([
            _node("n0", 2, ("mlx5_0", "mlx5_1")), _node("n1", 2, ("mlx5_0",))])
        url = f"sqlite:///{tmp_path / 'store.sqlite'}"
        settings = Settings(data_dir=tmp_path, database_url=url, cycle_interval_s=0.05)
        self.rt = Runtime(settings=settings, store=Store.open(url), provider=self.provider,
                          config=parse_config(config))
        bootstrap(self.rt)
        self.loop = ControlLoop(self.rt)
        self.loop.recovered = self.loop.reconciler.recover()

    def submit(self, replicas: int, cpu: float, **extra: Any) -> str:
        spec = WorkloadSpec.model_validate({"command": ["train"], "replicas": replicas,
                                            "resources": {"cpu": cpu}, **extra})
        return workloads.submit(self.rt, ADMIN, spec).id

    def launched(self, workload_id: str) -> list[PodLaunch]:
        assert isinstance(self.provider, ManualProvider)
        return sorted((p for p in self.provider.launched.values() if p.workload_id == workload_id),
                      key=lambda p: p.rank)

    def env(self, launch: PodLaunch) -> dict[str, str]:
        """The gang variables the agent sets from this launch (agent/isolation.py)."""
        from gpupool.agent.isolation import gang_env

        return gang_env(launch)[0]


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    made = Pool(tmp_path)
    yield made
    made.rt.store.close()


def _spread_two_gangs(pool: Pool) -> tuple[str, str]:
    """Two gangs of two pods, each spread over n0 and n1 (2 cpus each), both with rank 0 on n0."""
    first = pool.submit(2, 1.5)  # r0 on n0; n0 keeps 0.5 cpu, so r1 goes to n1
    pool.loop.step()
    second = pool.submit(2, 0.5)  # r0 on n0's last 0.5 cpu, r1 on n1
    pool.loop.step()
    return first, second


def test_each_rank_of_a_gang_across_nodes_gets_its_environment(pool: Pool) -> None:
    first, _ = _spread_two_gangs(pool)
    r0, r1 = pool.launched(first)
    assert (r0.node, r1.node) == ("n0", "n1")
    env0, env1 = pool.env(r0), pool.env(r1)
    for env, rank in ((env0, "0"), (env1, "1")):
        assert env["MASTER_ADDR"] == "10.0.0.10"  # the rank-0 node's address, on both nodes
        assert env["RANK"] == rank and env["WORLD_SIZE"] == "2"
        assert env["LOCAL_RANK"] == "0" and env["LOCAL_WORLD_SIZE"] == "1"
        assert env["NCCL_IB_SL"] == "2"  # the default class, normal: SL 2 (scavenger 0, critical 1)
        assert env["NCCL_IB_PKEY"] == "1"  # the tenant's partition
    assert env0["MASTER_PORT"] == env1["MASTER_PORT"]
    assert env0["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1" and env1["NCCL_IB_HCA"] == "=mlx5_0:1"


def test_two_gangs_at_once_on_one_master_node_get_different_ports(pool: Pool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rendezvous, "first_port", lambda workload_id, ports: ports.start)
    first, second = _spread_two_gangs(pool)
    ports = [{launch.master_port for launch in pool.launched(w)} for w in (first, second)]
    assert ports == [{29_500}, {29_501}]  # both wanted 29500; the second gang got the next one free
    assert {pool.launched(w)[0].node for w in (first, second)} == {"n0"}


def test_the_pools_gang_range_is_where_ports_come_from(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rendezvous, "first_port", lambda workload_id, ports: ports[-1])
    pool = Pool(tmp_path, config=CONFIG + "gangs: {port_base: 28000, port_count: 2}\n")
    try:
        first, second = _spread_two_gangs(pool)
        ports = [{launch.master_port for launch in pool.launched(w)} for w in (first, second)]
        assert ports == [{28_001}, {28_000}]  # both wanted the last; the second went round to the first
    finally:
        pool.rt.store.close()


def test_each_workload_starts_its_search_somewhere_in_the_pools_range() -> None:
    starts = {rendezvous.first_port(f"w{n}", range(28_000, 28_004)) for n in range(200)}
    assert starts == {28_000, 28_001, 28_002, 28_003}


@pytest.mark.parametrize(("gangs", "expected"), [
    ("{port_count: 0}", "line 1: gangs: gangs.port_count is 0; a gang needs 1 port at least"),
    ("{port_count: 2001}", "gangs.port_count is 2001, more than the 2000 rendezvous ports a node's"),
    ("{port_base: 80, port_count: 16}", "gangs.port_base is 80; ports below 1024 are bound by root alone"),
    ("{port_base: 65000, port_count: 1000}", "reaches port 65999, beyond 65535, the last port there is"),
    ("{port_base: 31000}", "the gangs' ports 31000-32999 reach into Linux's ephemeral ports (32768 and up)"),
    ("{port_base: 27000, port_count: 1001}",
     "line 1: gangs: the gangs' ports 27000-28000 (gangs.port_base, port_count) overlap the replicas' "
     "ports 22000-27999 (serving.port_base, port_count)"),
    ("{port_base: 20001, port_count: 2000}", "ports 20001-22000 (gangs.port_base, port_count) overlap"),
])
def test_a_gang_range_that_cannot_work_is_refused_in_a_sentence(gangs: str, expected: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_config(f"gangs: {gangs}\n", "pool.yaml")
    assert expected in caught.value.message, caught.value.message
    assert caught.value.message.startswith("pool.yaml") and "\n" not in caught.value.message


def test_a_gang_range_at_the_edges_is_taken_and_one_beside_moved_replicas_too() -> None:
    for text in ("gangs: {port_base: 1024, port_count: 1}", "gangs: {port_base: 30768, port_count: 2000}",
                 "gangs: {port_base: 28000, port_count: 1500}",  # just past serving's 22000-27999
                 "gangs: {port_base: 20000, port_count: 2000}",  # just before it
                 "serving: {port_base: 12000}\ngangs: {port_base: 18000, port_count: 2000}"):
        gangs = parse_config(text).gangs
        assert gangs.ports() == range(gangs.port_base, gangs.port_base + gangs.port_count)
    with pytest.raises(InvalidInput, match=r"29500-31499 .* overlap the replicas' ports 29000-29999"):
        parse_config("serving: {port_base: 29000, port_count: 1000}\n")  # the default gangs, moved replicas


def test_a_port_is_free_again_once_its_gang_ended_and_the_book_survives_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rendezvous, "first_port", lambda workload_id, ports: ports.start)
    pool = Pool(tmp_path)
    first, second = _spread_two_gangs(pool)
    pool.rt.store.close()
    again = Pool(tmp_path, provider=pool.provider)  # a restarted server, its pods still running
    assert isinstance(pool.provider, ManualProvider)
    for launch in pool.launched(first):
        pool.provider.finish(launch.pod_id)
    again.loop.step()
    third = again.submit(2, 1.5)  # takes the first gang's place and its port, now free
    again.loop.step()
    assert {launch.master_port for launch in again.launched(third)} == {29_500}
    assert {launch.master_port for launch in again.launched(second)} == {29_501}
    with again.rt.store.read() as session:
        held = again.loop.scheduler.ports.held(session.connection())
    assert held == {(second, 1): ("n0", 29_501), (third, 1): ("n0", 29_500)}
    again.rt.store.close()


def test_a_single_pod_gets_no_rendezvous(pool: Pool) -> None:
    alone = pool.submit(1, 1)
    pool.loop.step()
    (launch,) = pool.launched(alone)
    assert launch.master_port == 0 and pool.env(launch) == {}


def test_rendezvous_is_the_servers_to_set(pool: Pool) -> None:
    with pytest.raises(InvalidInput, match="rendezvous is set by the server"):
        pool.submit(2, 1, rendezvous=[{"attempt": 1, "node": "n0", "addr": "x", "port": 1}])




def test_a_gang_across_two_nodes_meets_and_all_reduces(tmp_path: Path) -> None:
    """Two pods on two simulated nodes of the local provider: real processes that meet at
    MASTER_ADDR:MASTER_PORT and sum their ranks' values over TCP (an all-reduce of 1 + 2). The pool's
    gang range is the last 16 ports of this worker's slice (never the default range, even alone):
    the port the pods met at is one of them."""
    provider = LocalPool(nodes_from_spec("2x1xH100"), tmp_path / "agents")
    mine = gang_ports()[-16:]
    pool = Pool(tmp_path, config="scheduling: {placement: first-fit}\n" + gang_config(mine),
                provider=provider)
    try:
        command = [pod_python(), "-c", ALL_REDUCE]
        gang = pool.submit(2, 0.1, command=command, resources={"gpus": 1, "cpu": 0.1})
        deadline = time.monotonic() + 120
        while _status(pool, gang) not in ("succeeded", "failed"):
            assert time.monotonic() < deadline, "the gang did not finish"
            pool.loop.step()
            time.sleep(0.02)
        pods = [f"{gang}-a1-r{rank}" for rank in range(2)]  # poll() no longer lists them: stored
        logs = [provider.read_log(pod_id).text for pod_id in pods]
        assert _status(pool, gang) == "succeeded", logs
        nodes = sorted(n.name for n in provider.nodes())
        port = int(logs[0].split(" at port ")[1].split(":")[0])
        assert logs == [f"rank {r} of 2 on {nodes[r]} at port {port}: sum 3\n" for r in range(2)]
        assert port in mine and mine.start != GangsConfig().port_base
    finally:
        provider.close(stop_pods=True)
        pool.rt.store.close()


@pytest.mark.skipif(bool(netns.probe()), reason=f"no pod network namespaces here: {netns.probe()}")
def test_a_gang_in_pod_namespaces_meets_at_its_rank0_pods_own_address(tmp_path: Path) -> None:
    """The same all-reduce with a network namespace per pod: MASTER_ADDR is the rank-0 pod's own
    address (in its node's slot of the pod network), which the other node's pod reaches through the
    host's routing."""
    provider = LocalPool(nodes_from_spec("2x1xH100"), tmp_path / "agents",
                         network=netns.NetworkSettings(mode=netns.NetnsMode.ON, pod_network=NETWORK))
    pool = Pool(tmp_path, config="scheduling: {placement: first-fit}\n" + gang_config(), provider=provider)
    try:
        command = [pod_python(), "-c", ALL_REDUCE]
        gang = pool.submit(2, 0.1, command=command, resources={"gpus": 1, "cpu": 0.1})
        deadline = time.monotonic() + 120
        while _status(pool, gang) not in ("succeeded", "failed"):
            assert time.monotonic() < deadline, "the gang did not finish"
            pool.loop.step()
            time.sleep(0.02)
        pods = [f"{gang}-a1-r{rank}" for rank in range(2)]  # poll() no longer lists them: stored
        assert _status(pool, gang) == "succeeded", [provider.read_log(pod_id).text for pod_id in pods]
        with pool.rt.store.read() as session:
            row = session.get(WorkloadRow, gang)
            assert row is not None
            entry = row.spec["rendezvous"][-1]
        rank0_node = netns.node_subnet(NETWORK,
                                       sorted(n.name for n in provider.nodes()).index(entry["node"]))
        assert ipaddress.IPv4Address(entry["addr"]) in rank0_node  # the pod's address, not the node's
    finally:
        provider.close(stop_pods=True)
        pool.rt.store.close()


def _status(pool: Pool, workload_id: str) -> str:
    with pool.rt.store.read() as session:
        row = session.get(WorkloadRow, workload_id)
        assert row is not None
        return row.status


PREEMPTING = """
scheduling: {placement: first-fit, backfill: false}
priority_classes:
  - {name: low, value: 0, preemptible: true, grace: 5s}
  - {name: high, value: 1000}
"""


def test_a_gang_that_waited_for_its_devices_starts_with_the_port_reserved_when_placed(tmp_path: Path) -> None:
    pool = Pool(tmp_path, config=PREEMPTING)
    try:
        low = pool.submit(2, 1.5, priority_class="low", resources={"cpu": 1.5, "gpus": 4})
        pool.loop.step()
        high = pool.submit(2, 1.5, priority_class="high", resources={"cpu": 1.5, "gpus": 4})
        pool.loop.step()  # preempts the low gang: its pods stop, the high gang's pods wait for them
        assert pool.launched(high) == []
        with pool.rt.store.read() as session:
            stored = session.get(WorkloadRow, high)
            assert stored is not None and stored.spec["rendezvous"][-1]["attempt"] == 1
            reserved = stored.spec["rendezvous"][-1]["port"]
        pool.loop.step()  # the victims ended (the hand-driven provider stops pods at once)
        launched = pool.launched(high)
        assert [p.rank for p in launched] == [0, 1] and {p.master_port for p in launched} == {reserved}
        assert {p.master_addr for p in launched} == {"10.0.0.10"} and pool.launched(low)[0].master_port
    finally:
        pool.rt.store.close()


def test_with_a_fabric_nccl_uses_the_adapters_whose_cable_works(tmp_path: Path) -> None:
    """Two servers of a rail-optimised fabric (mlx5_0 and mlx5_1 each, plus a port the fabric does
    not know): the pods name only fabric adapters, and not one whose cable failed."""
    from gpupool.core.fabric.generate import rail_optimized
    from gpupool.core.fabric.write import to_ibnetdiscover
    from gpupool.server.services.fabric import open_live_fabric

    nodes = [_node(f"gpu{i:04d}", 2, ("mlx5_0", "mlx5_1", "mlx5_9")) for i in range(4)]
    pool = Pool(tmp_path, provider=AddressedProvider(nodes))
    try:
        path = tmp_path / "rails.topo"
        path.write_text(to_ibnetdiscover(rail_optimized(4, rails=2, ports=8)))
        fabric = pool.rt.fabric = open_live_fabric(path, pool.rt.nodes())
        broken = next(p for p in fabric.place_of(nodes)["gpu0000"].ports if p.hca == "mlx5_1")
        fabric.fail_link(fabric.base.ca_leaf[broken.ca][2])
        gang = pool.submit(2, 1.5)  # one pod per server
        pool.loop.step()
        first, second = pool.launched(gang)
        assert (first.node, second.node) == ("gpu0000", "gpu0001")
        assert (first.ib_hcas, second.ib_hcas) == (("mlx5_0:1",), ("mlx5_0:1", "mlx5_1:1"))
    finally:
        pool.rt.store.close()


def test_torchrun_launcher_wraps_each_pods_command_with_the_gangs_layout(pool: Pool) -> None:
    gang = pool.submit(2, 1.5, command=["venv/bin/python3.11", "train.py", "--lr", "0.1"],
                       launcher="torchrun", resources={"gpus": 2, "cpu": 1.5})
    pool.loop.step()
    r0, r1 = pool.launched(gang)
    for launch in (r0, r1):
        assert launch.command == (
            "venv/bin/python3.11", "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
            str(launch.rank), "--master-addr", "10.0.0.10", "--master-port", str(r0.master_port),
            "--nproc-per-node", "2", "--no-python", "venv/bin/python3.11", "train.py", "--lr", "0.1")
        assert pool.env(launch)["NPROC_PER_NODE"] == "2" and "WORLD_SIZE" not in pool.env(launch)
    alone = pool.submit(1, 0.1, command=["./train.sh"], launcher="torchrun",
                        resources={"gpus": 0.5, "cpu": 0.1})
    plain = pool.submit(1, 0.1, command=["python", "train.py"], resources={"cpu": 0.1})
    pool.loop.step()
    (single,) = pool.launched(alone)  # a script: torchrun in the pod's python3, which runs it as given
    assert single.command == ("python3", "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                              "--nproc-per-node", "1", "--no-python", "./train.sh")
    assert pool.launched(plain)[0].command == ("python", "train.py")
