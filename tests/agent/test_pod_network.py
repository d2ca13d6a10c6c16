"""Each pod in its own network namespace: a hostile tenant can neither take a gang's rendezvous nor
reach another tenant's pods; a tenant's own pods, a gang across nodes and the pool's API server still
work; and nothing of a pod's network outlives it, not even an agent crash.

The attacks run for real (root, iproute2 and nftables: `make test-deps`); elsewhere they skip with
the reason. Each has a control with namespaces off that shows the attack works there, so the test
sees the difference the layer makes.
"""

from __future__ import annotations

import http.server
import ipaddress
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from factories import pod_python
from gpupool.agent import netns, podstate
from gpupool.agent.netns import NetnsMode, NetworkSettings, PodNet, PodNetwork
from gpupool.config import GANG_ADDRESSES, GangsConfig
from gpupool.core.model import Device, Node
from gpupool.errors import InvalidInput
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.base import Capability
from gpupool.providers.localpool import LocalPool
from gpupool.server.services import enforcement
from netns_scripts import connect, eventually, listen

WHY = netns.probe()
needs_netns = pytest.mark.skipif(bool(WHY), reason=f"network namespaces cannot be made here: {WHY}")
NETWORK = ipaddress.IPv4Network("10.231.0.0/16")
"""This file's own pod network: test files that run at once never share one."""
ON = NetworkSettings(mode=NetnsMode.ON, pod_network=NETWORK)
OFF = NetworkSettings(mode=NetnsMode.OFF, pod_network=NETWORK)
OTHER_POOL_NETWORK = ipaddress.IPv4Network("10.230.0.0/16")
"""Another pool's pod network on the same machine (a test of two pools)."""
GANG_PORT = 29_731
PY = pod_python()

ATTACKER = r"""
import os, resource, socket, sys, threading
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for port in range(29500, 31500):
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
        s.listen(16)
        held.append(s)
    except OSError:
        s.close()
print("holds", len(held), "of 2000", flush=True)
def serve(s):
    while True:
        c, _ = s.accept()
        c.sendall(b"attacker")
        print("attacker got", c.recv(100), flush=True)
for s in held:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""

RANK0 = r"""
import os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(os.environ["MASTER_PORT"])))
s.listen(1)
s.settimeout(30)
c, peer = s.accept()
print("rank0 got", c.recv(100).decode(), flush=True)
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
print("rank1 got", c.recv(100).decode(), flush=True)
"""

FETCH = r"""
import os, urllib.request
try:
    answer = urllib.request.urlopen(os.environ["GPUPOOL_URL"] + "/", timeout=3).read().decode()
    print("api", answer, flush=True)
except OSError as exc:
    print("api unreachable", type(exc).__name__, flush=True)
"""


def nodes(count: int) -> list[Node]:
    return [Node(name=f"n{i}", cpu_milli=8000, memory_mib=16384,
                 devices=(Device(uuid=f"GPU-n{i}-0", model="H100", index=0, memory_mib=81920),))
            for i in range(count)]


def wait_final(pool: LocalPool, pod_id: str, timeout_s: float = 40.0) -> PodStatus:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = {s.pod_id: s for s in pool.poll()}.get(pod_id)
        if status is not None and status.phase.is_final:
            return status
        time.sleep(0.02)
    raise AssertionError(f"{pod_id} did not finish")


def wait_output(pool: LocalPool, pod_id: str, text: str, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = pool.read_log(pod_id).text
        if text in out:
            return out
        status = {s.pod_id: s for s in pool.poll()}.get(pod_id)
        assert status is None or not status.phase.is_final, (pod_id, status, out)
        time.sleep(0.02)
    raise AssertionError(f"{pod_id} never printed {text!r}: {pool.read_log(pod_id).text!r}")


def launch(pool: LocalPool, pod_id: str, node: str, tenant: str, script: str, **fields: object) -> None:
    env = dict(fields.pop("env", {}) or {})  # type: ignore[call-overload]
    pool.launch(PodLaunch(pod_id=pod_id, workload_id=str(fields.pop("workload_id", "w-" + pod_id)), node=node,
                          command=(PY, "-c", script), tenant=tenant, env=env, **fields))  # type: ignore[arg-type]


def host_leftovers() -> dict[str, list[str]]:
    """Every pod namespace and veth on the host, and every address in the table's `pods` set."""
    spaces = sorted(p.name for p in Path("/run/netns").glob("gpn*")) if Path("/run/netns").is_dir() else []
    links = sorted(p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith("gv"))
    done = subprocess.run(["nft", "-j", "list", "set", "inet", netns.TABLE, "pods"], capture_output=True,
                          text=True, check=False)
    addresses: list[str] = []
    if done.returncode == 0:
        for item in json.loads(done.stdout)["nftables"]:
            if "set" in item:
                addresses += [str(e) for e in item["set"].get("elem", [])]
    return {"netns": spaces, "veth": links, "addresses": sorted(addresses)}


@pytest.fixture(autouse=True)
def nothing_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """This file follows each pod's network to its teardown: none is kept for the tenant's next pod
    (that is test_netns_kept.py)."""
    monkeypatch.setattr(netns, "KEPT", 0)


@pytest.fixture
def pools(tmp_path: Path) -> Iterator[list[LocalPool]]:
    made: list[LocalPool] = []
    yield made
    for pool in made:
        pool.close(stop_pods=True)


def make_pool(pools: list[LocalPool], tmp_path: Path, settings: NetworkSettings, count: int = 2,
              published: tuple[tuple[str, int], ...] = ()) -> LocalPool:
    pool = LocalPool(nodes(count), tmp_path / f"pool{len(pools)}", network=settings, published=published)
    pools.append(pool)
    return pool


# ---- settings (everywhere) ---------------------------------------------------------------------
def test_bad_settings_are_refused_with_what_to_write() -> None:
    with pytest.raises(InvalidInput, match="not one of auto, on, off"):
        NetworkSettings.from_env({netns.NETNS_ENV: "maybe"})
    with pytest.raises(InvalidInput, match="not an IPv4 network"):
        NetworkSettings.from_env({netns.POD_NETWORK_ENV: "10.300.0.0/16"})
    with pytest.raises(InvalidInput, match="smaller than one node"):
        NetworkSettings.from_env({netns.POD_NETWORK_ENV: "10.1.2.0/24"})
    with pytest.raises(InvalidInput, match="comma-separated CIDRs"):
        NetworkSettings.from_env({netns.REACHABLE_ENV: "10.0.0.0/8,storage"})
    settings = NetworkSettings.from_env({netns.REACHABLE_ENV: "10.0.0.0/16, 192.168.7.9/24"})
    assert settings.mode is NetnsMode.AUTO
    assert settings.reachable == (ipaddress.IPv4Network("10.0.0.0/16"),
                                  ipaddress.IPv4Network("192.168.7.0/24"))


def test_each_node_has_its_own_slot_and_a_gang_address_per_rendezvous_port() -> None:
    assert (GangsConfig().port_base, GANG_ADDRESSES) == (netns.GANG_PORT_BASE, netns.GANG_PORT_COUNT)
    network = ipaddress.IPv4Network(netns.DEFAULT_POD_NETWORK)
    first, second = netns.node_subnet(network, 0), netns.node_subnet(network, 1)
    assert first.prefixlen == second.prefixlen == netns.NODE_PREFIX and not first.overlaps(second)
    with pytest.raises(InvalidInput, match="does not fit"):
        netns.node_subnet(ipaddress.IPv4Network("10.0.0.0/19"), 1)


@pytest.mark.parametrize("base", [29_500, 1024, 18_000, 28_000, 30_768])
def test_every_port_of_a_gang_range_has_an_address_of_its_own_in_the_gang_block(base: int) -> None:
    """Agents and the server map a port to its rank-0 address alike, whatever the pool's range: the
    default range as it always has, any other range of at most GANG_PORT_COUNT to as many addresses."""
    subnet = netns.node_subnet(ipaddress.IPv4Network(netns.DEFAULT_POD_NETWORK), 3)
    ports = GangsConfig(port_base=base).ports()
    addresses = [ipaddress.IPv4Address(netns.gang_address_in(subnet, port)) for port in ports]
    first = subnet.network_address + netns.GANG_HOSTS
    assert len(set(addresses)) == len(ports) == netns.GANG_PORT_COUNT
    assert min(addresses) == first and max(addresses) < subnet.network_address + netns.OTHER_HOSTS
    if base == netns.GANG_PORT_BASE:
        assert addresses[0] == first and addresses[-1] == first + netns.GANG_PORT_COUNT - 1  # as before
    assert netns.gang_address_in(subnet, 0) == ""  # no port: no gang


def test_off_is_said_in_node_ls_and_pods_share_the_node_network(tmp_path: Path) -> None:
    pool = LocalPool(nodes(1), tmp_path, network=OFF)
    try:
        missing = pool.missing_capabilities()
        assert "GPUPOOL_POD_NETNS=off" in missing[Capability.NETWORK_ISOLATION]
        layer = {s.layer: s for s in enforcement.node_layers(pool.nodes()[0], missing)}["network"]
        assert not layer.enforced and "share the node's network" in layer.detail
        assert pool.gang_address("n0", GANG_PORT) == "127.0.0.1"  # the node's address, as before
    finally:
        pool.close()


def test_on_where_it_cannot_be_made_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns, "probe", lambda: "the agent does not run as root (no CAP_NET_ADMIN)")
    with pytest.raises(InvalidInput, match="GPUPOOL_POD_NETNS=on, but the agent does not run as root"):
        PodNetwork(ON)
    auto = PodNetwork(NetworkSettings())
    assert not auto.active and "CAP_NET_ADMIN" in auto.unavailable


# ---- attacks (root, iproute2, nftables) ----------------------------------------------------------
def gang(pool: LocalPool, tenant: str, workload: str) -> tuple[str, str]:
    """A 2-pod gang of `tenant`: rank 0 on n0, rank 1 on n1; returns both pod ids."""
    addr = pool.gang_address("n0", GANG_PORT)
    fields = {"workload_id": workload, "world_size": 2, "master_addr": addr, "master_port": GANG_PORT}
    launch(pool, f"{workload}-r0", "n0", tenant, RANK0, rank=0, **fields)
    launch(pool, f"{workload}-r1", "n1", tenant, RANK1, rank=1, **fields)
    return f"{workload}-r0", f"{workload}-r1"


@needs_netns
def test_a_tenant_that_binds_every_rendezvous_port_cannot_take_a_gang(pools: list[LocalPool],
                                                                      tmp_path: Path) -> None:
    pool = make_pool(pools, tmp_path, ON)
    launch(pool, "attacker", "n0", "mallory", ATTACKER)
    out = wait_output(pool, "attacker", "ready")
    assert "holds 2000 of 2000" in out  # in its own namespace, it had every port it asked for
    assert pool.gang_address("n0", GANG_PORT) != "127.0.0.1"
    r0, r1 = gang(pool, "bob", "train")
    for pod_id in (r0, r1):
        status = wait_final(pool, pod_id)
        assert status.phase is PodPhase.SUCCEEDED, (pod_id, status, pool.read_log(pod_id).text)
    assert "rank0 got rank1" in pool.read_log(r0).text
    assert "rank1 got rank0" in pool.read_log(r1).text  # never the attacker's bytes
    assert "attacker got" not in pool.read_log("attacker").text


@needs_netns
def test_control_without_namespaces_the_attacker_takes_the_rendezvous(pools: list[LocalPool],
                                                                      tmp_path: Path) -> None:
    """What the issue saw: rank 0 fails with EADDRINUSE, rank 1 talks to the attacker."""
    pool = make_pool(pools, tmp_path, OFF)
    launch(pool, "attacker", "n0", "mallory", ATTACKER)
    wait_output(pool, "attacker", "ready")
    r0, r1 = gang(pool, "bob", "train")
    assert wait_final(pool, r0).phase is PodPhase.FAILED
    assert "Address already in use" in pool.read_log(r0).text
    wait_final(pool, r1)
    assert "rank1 got attacker" in pool.read_log(r1).text
    assert "attacker got b'rank1'" in wait_output(pool, "attacker", "attacker got")


@needs_netns
def test_only_the_gang_reaches_its_rendezvous_port(pools: list[LocalPool], tmp_path: Path) -> None:
    """Even a pod of the same tenant, outside the gang, cannot reach the rank-0 pod's port."""
    pool = make_pool(pools, tmp_path, ON)
    addr = pool.gang_address("n0", GANG_PORT)
    launch(pool, "train-r0", "n0", "bob", RANK0, workload_id="train", rank=0, world_size=2, master_addr=addr,
           master_port=GANG_PORT)
    launch(pool, "other", "n1", "bob", connect(addr, GANG_PORT))
    wait_final(pool, "other")
    assert "blocked" in pool.read_log("other").text
    launch(pool, "train-r1", "n1", "bob", RANK1, workload_id="train", rank=1, world_size=2, master_addr=addr,
           master_port=GANG_PORT)
    assert wait_final(pool, "train-r1").phase is PodPhase.SUCCEEDED
    assert "rank1 got rank0" in pool.read_log("train-r1").text
    wait_final(pool, "train-r0")
    guard = f"chain g_{netns.gang_key('train', addr, GANG_PORT)}"
    assert eventually(lambda: guard not in table())  # a gang's chain goes with its pods


def table() -> str:
    return subprocess.run(["nft", "list", "table", "inet", netns.TABLE], capture_output=True, text=True,
                          check=True).stdout


def services(pool: LocalPool) -> str:
    """Bob's service on n0 (its address), and a pod of bob and one of mallory on each node that try it."""
    launch(pool, "bob-service", "n0", "bob", listen("secret of bob"))
    out = wait_output(pool, "bob-service", "address")
    target = out.split("address", 1)[1].split()[0]
    for who, node in (("mallory", "n0"), ("mallory", "n1"), ("bob", "n0"), ("bob", "n1")):
        launch(pool, f"{who}-{node}", node, who, connect(target))
    for who, node in (("mallory", "n0"), ("mallory", "n1"), ("bob", "n0"), ("bob", "n1")):
        wait_final(pool, f"{who}-{node}")
    return target


@needs_netns
def test_another_tenant_cannot_reach_a_pods_service_and_the_same_tenant_can(pools: list[LocalPool],
                                                                             tmp_path: Path) -> None:
    pool = make_pool(pools, tmp_path, ON)
    target = services(pool)
    with pytest.raises(OSError):  # nor does a process of the host itself (another user, say)
        socket.create_connection((target, 7000), timeout=2).close()
    for node in ("n0", "n1"):
        assert "blocked" in pool.read_log(f"mallory-{node}").text, pool.read_log(f"mallory-{node}").text
        assert "reached secret of bob" in pool.read_log(f"bob-{node}").text, pool.read_log(f"bob-{node}").text


@needs_netns
def test_a_tenant_of_another_pool_on_the_machine_cannot_reach_a_pod_of_its_namesake(pools: list[LocalPool],
                                                                                    tmp_path: Path) -> None:
    """Two pools on one machine (each its own pod network) share the host's table: a tenant named
    alike in the other pool is another tenant, and its pod is dropped as any other tenant's."""
    here = make_pool(pools, tmp_path, ON, count=1)
    other = make_pool(pools, tmp_path, NetworkSettings(mode=NetnsMode.ON, pod_network=OTHER_POOL_NETWORK),
                      count=1)
    launch(here, "bob-service", "n0", "bob", listen("secret of bob"))
    target = wait_output(here, "bob-service", "address").split("address", 1)[1].split()[0]
    launch(here, "bob-friend", "n0", "bob", connect(target))
    launch(other, "bob-namesake", "n0", "bob", connect(target))
    assert wait_final(here, "bob-friend").phase is PodPhase.SUCCEEDED
    assert wait_final(other, "bob-namesake").phase is PodPhase.SUCCEEDED
    assert here.read_log("bob-friend").text.strip() == "reached secret of bob"
    assert other.read_log("bob-namesake").text.strip() == "blocked TimeoutError"


@needs_netns
def test_control_without_namespaces_another_tenant_reaches_the_service(pools: list[LocalPool],
                                                                       tmp_path: Path) -> None:
    pool = make_pool(pools, tmp_path, OFF)
    target = services(pool)
    assert "reached secret of bob" in pool.read_log("mallory-n1").text
    socket.create_connection((target, 7000), timeout=2).close()


class _Api(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"pool api"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@needs_netns
def test_a_pod_reaches_the_pools_api_server_and_no_other_host_port(pools: list[LocalPool],
                                                                   tmp_path: Path) -> None:
    api = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    private = http.server.ThreadingHTTPServer(("0.0.0.0", 0), _Api)  # the host's own daemon, say
    for server in (api, private):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api_port, private_port = api.server_address[1], private.server_address[1]
        pool = make_pool(pools, tmp_path, ON, published=(("127.0.0.1", api_port),))
        launch(pool, "sdk", "n1", "bob", FETCH, env={"GPUPOOL_URL": f"http://127.0.0.1:{api_port}"})
        wait_final(pool, "sdk")
        assert "api pool api" in pool.read_log("sdk").text
        gateway = netns.node_subnet(ON.pod_network, 1).network_address + 1
        launch(pool, "snoop", "n1", "mallory", FETCH, env={"GPUPOOL_URL": f"http://{gateway}:{private_port}"})
        wait_final(pool, "snoop")
        assert "api unreachable" in pool.read_log("snoop").text
    finally:
        api.shutdown()
        private.shutdown()


# ---- leftovers -------------------------------------------------------------------------------------
def ours(pool_slots: int = 2) -> dict[str, list[str]]:
    """The leftovers of the test pools' slots (0 and 1) only."""
    found = host_leftovers()
    slots = [netns.node_subnet(ON.pod_network, i) for i in range(pool_slots)]
    keys = [PodNetwork(OFF, i).key for i in range(pool_slots)]
    return {"netns": [n for n in found["netns"] if n.split("-")[1] in keys],
            "veth": [n for n in found["veth"] if n[2:7] in keys],
            "addresses": [a for a in found["addresses"] if any(ipaddress.IPv4Address(a) in s for s in slots)]}


def net_of(state_dir: Path, node: str, pod_id: str) -> PodNet:
    """The pod's network attachment, as its record keeps it for the agent's next start."""
    net = PodNet.from_json(json.loads((state_dir / node / "pods" / pod_id / "state.json").read_text())["net"])
    assert net is not None
    return net


def present(net: PodNet) -> list[bool]:
    """Whether the pod's namespace, its veth and its address in the table's `pods` set exist."""
    found = host_leftovers()
    return [net.netns in found["netns"], net.veth in found["veth"], net.address in found["addresses"]]


@needs_netns
def test_a_pods_namespace_veth_and_rules_go_when_it_ends(pools: list[LocalPool], tmp_path: Path) -> None:
    pool = make_pool(pools, tmp_path, ON)
    launch(pool, "short", "n0", "bob", "print('done')")
    launch(pool, "long", "n1", "bob", "import time; time.sleep(60)")
    short, long = net_of(tmp_path / "pool0", "n0", "short"), net_of(tmp_path / "pool0", "n1", "long")
    assert present(long) == [True, True, True]
    assert wait_final(pool, "short").phase is PodPhase.SUCCEEDED
    assert eventually(lambda: present(short) == [False, False, False]), present(short)
    assert present(long) == [True, True, True]
    pool.stop("long", grace_s=0)
    assert wait_final(pool, "long").phase is PodPhase.STOPPED
    assert eventually(lambda: present(long) == [False, False, False]), present(long)
    pools.remove(pool)
    pool.close(stop_pods=True)
    assert ours() == {"netns": [], "veth": [], "addresses": []}  # the namespaces made ahead go too
    rules = table()
    bob = netns.tenant_key("bob", NETWORK)
    assert f"chain t_{bob}" not in rules and f"set ta_{bob}" not in rules  # they went with the agent


@needs_netns
def test_a_pod_refused_after_its_network_was_made_leaves_no_network(pools: list[LocalPool],
                                                                    tmp_path: Path) -> None:
    pool = make_pool(pools, tmp_path, ON)
    made: list[PodNet] = []
    network = pool._members["n0"].agent.network
    attach = network.attach
    network.attach = lambda *a, **k: made.append(attach(*a, **k)) or made[-1]  # type: ignore[method-assign]
    with pytest.raises(InvalidInput, match="empty command"):
        pool.launch(PodLaunch(pod_id="empty", workload_id="w", node="n0", command=(), tenant="bob"))
    [refused] = made
    assert eventually(lambda: present(refused) == [False, False, False]), present(refused)


@needs_netns
def test_an_agent_crash_leaves_nothing_behind_after_its_restart(tmp_path: Path) -> None:
    first = LocalPool(nodes(2), tmp_path / "pool", network=ON)
    second: LocalPool | None = None
    try:
        launch(first, "kept", "n0", "bob", listen("secret of bob"))
        launch(first, "ended", "n1", "bob", "import time; time.sleep(60)")
        kept_addr = wait_output(first, "kept", "address").split("address", 1)[1].split()[0]
        kept, ended = net_of(tmp_path / "pool", "n0", "kept"), net_of(tmp_path / "pool", "n1", "ended")
        ended_pid = json.loads((tmp_path / "pool/n1/pods/ended/state.json").read_text())["pid"]
        first.close()  # the agent goes away without ending its pods, as a crash would
        os.kill(ended_pid, signal.SIGKILL)  # a pod that ends while the agent is down
        # ended, not only signalled: the restarted agent would adopt a pod it still finds running
        assert eventually(lambda: not podstate.process_alive(ended_pid, None)), ended_pid
        made = f"gpn-{PodNetwork(ON, 1).key}-deadbeef"
        subprocess.run(["ip", "netns", "add", made], check=True)  # made just before a crash
        assert present(ended) == [True, True, True] and made in host_leftovers()["netns"]
        second = LocalPool(nodes(2), tmp_path / "pool", network=ON)
        assert present(ended) == [False, False, False] and made not in host_leftovers()["netns"]
        assert present(kept) == [True, True, True] and kept.address == kept_addr
        launch(second, "friend", "n1", "bob", connect(kept_addr))
        wait_final(second, "friend")
        assert "reached secret of bob" in second.read_log("friend").text  # the kept pod still serves
        second.stop("kept", grace_s=0)
        wait_final(second, "kept")
        assert eventually(lambda: present(kept) == [False, False, False]), present(kept)
        second.close(stop_pods=True)
        assert ours() == {"netns": [], "veth": [], "addresses": []}
    finally:
        first.close()
        (second or LocalPool(nodes(2), tmp_path / "pool", network=ON)).close(stop_pods=True)


@needs_netns
def test_a_namespace_adds_no_file_to_a_pods_directory_and_an_older_agents_file_is_still_read(
        tmp_path: Path) -> None:
    """A pod's attachment lives in its record, not a file of its own (each file made and removed a
    pod costs the agent CPU); a pod started by an agent that kept it in net.json keeps its namespace
    across the restart onto this agent, which removes it when the pod ends."""
    plain = LocalPool(nodes(1), tmp_path / "plain", network=OFF)
    first = LocalPool(nodes(1), tmp_path / "pool", network=ON)
    second: LocalPool | None = None
    try:
        for pool in (plain, first):
            launch(pool, "p", "n0", "bob", "print('up', flush=True); import time; time.sleep(60)")
            wait_output(pool, "p", "up")
        files = [sorted(os.listdir(tmp_path / name / "n0/pods/p")) for name in ("pool", "plain")]
        assert files[0] == files[1], files
        net = net_of(tmp_path / "pool", "n0", "p")
        first.close()  # the agent goes away; its pod runs on
        state = tmp_path / "pool/n0/pods/p/state.json"
        record = json.loads(state.read_text())
        del record["net"]  # as the older agent wrote it, with the attachment beside it
        state.write_text(json.dumps(record))
        (state.parent / "net.json").write_text(net.to_json())
        second = LocalPool(nodes(1), tmp_path / "pool", network=ON)
        assert present(net) == [True, True, True]  # not swept as a leftover at the start
        second.stop("p", grace_s=0)
        assert wait_final(second, "p").phase is PodPhase.STOPPED
        assert eventually(lambda: present(net) == [False, False, False]), present(net)
    finally:
        plain.close(stop_pods=True)
        first.close()
        (second or LocalPool(nodes(1), tmp_path / "pool", network=ON)).close(stop_pods=True)


def test_an_unenforced_network_layer_is_recorded_in_the_audit_log(tmp_path: Path) -> None:
    from gpupool.server.auth import Principal
    from gpupool.server.db import Store
    from gpupool.server.runtime import Runtime
    from gpupool.server.services import audit
    from gpupool.server.settings import Settings

    pool = LocalPool(nodes(1), tmp_path / "pool", network=OFF)
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    rt = Runtime(settings=Settings(data_dir=tmp_path, database_url=url), store=Store.open(url), provider=pool)
    try:
        assert "network" in audit.record_unenforced_layers(rt)
        rows = audit.entries(rt, Principal("", None), None, 100)
        network = [r for r in rows if r.action == "isolation.unenforced" and r.target == "network"]
        assert len(network) == 1 and "GPUPOOL_POD_NETNS=off" in network[0].detail
        assert network[0].remote == "start-up"
    finally:
        rt.store.close()
        pool.close()


@needs_netns
def test_a_second_agent_on_the_same_pod_network_says_so_instead_of_sweeping_the_first() -> None:
    first = PodNetwork(ON, 5)
    first.start({})
    try:
        second = PodNetwork(NetworkSettings(pod_network=NETWORK), 5)  # auto
        second.start({})
        assert not second.active
        assert "another agent on this machine uses the pod network" in second.unavailable
        with pytest.raises(InvalidInput, match="give each pool on a machine its own GPUPOOL_POD_NETWORK"):
            PodNetwork(ON, 5).start({})
        assert first.active
    finally:
        first.close()
    third = PodNetwork(ON, 5)  # once the first has stopped, the network is free again
    third.start({})
    assert third.active
    third.close()


def test_the_published_service_is_where_pods_reach_the_api_server(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.server.provision import published_services
    from gpupool.server.settings import Settings

    monkeypatch.delenv("GPUPOOL_POD_API_URL", raising=False)
    everywhere = Settings(data_dir=tmp_path, host="0.0.0.0", port=8123)
    assert published_services(everywhere) == (("127.0.0.1", 8123),)  # a wildcard listens on loopback too
    assert published_services(Settings(data_dir=tmp_path, host="10.0.0.5", port=80)) == (("10.0.0.5", 80),)
    monkeypatch.setenv("GPUPOOL_POD_API_URL", "https://10.1.2.3/")
    assert published_services(Settings(data_dir=tmp_path, port=8123)) == (("10.1.2.3", 443),)
    monkeypatch.setenv("GPUPOOL_POD_API_URL", "http://pool.example:8000")
    assert published_services(Settings(data_dir=tmp_path, port=8123)) == ()  # a name: declare its network


STORAGE = r"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("198.51.100.2", 7100))
s.listen(16)
while True:
    c, peer = s.accept()
    c.sendall(b"storage")
    c.close()
"""


@pytest.fixture
def storage_network() -> Iterator[str]:
    """A network outside the pool (198.51.100.0/24, in a namespace of its own joined to the host by
    a veth) with a service at 198.51.100.2:7100, as a node's storage network would be."""
    space, host_end = "gptest-storage", "gptstor0"
    subprocess.run(["ip", "netns", "del", space], capture_output=True, check=False)
    subprocess.run(["ip", "link", "del", host_end], capture_output=True, check=False)
    steps = [["ip", "netns", "add", space],
             ["ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", space],
             ["ip", "addr", "add", "198.51.100.1/24", "dev", host_end], ["ip", "link", "set", host_end, "up"],
             ["ip", "-n", space, "addr", "add", "198.51.100.2/24", "dev", "eth0"],
             ["ip", "-n", space, "link", "set", "eth0", "up"], ["ip", "-n", space, "link", "set", "lo", "up"]]
    for step in steps:
        subprocess.run(step, check=True)
    server = subprocess.Popen(["ip", "netns", "exec", space, PY, "-c", STORAGE])

    def listening() -> bool:
        try:
            socket.create_connection(("198.51.100.2", 7100), timeout=1).close()
            return True
        except OSError:
            return False

    try:
        assert eventually(listening), "the storage service did not start"
        yield "198.51.100.2"
    finally:
        server.kill()
        server.wait()
        subprocess.run(["ip", "link", "del", host_end], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", space], capture_output=True, check=False)


@needs_netns
def test_a_pod_reaches_a_declared_network_and_no_other(storage_network: str, tmp_path: Path) -> None:
    declared = NetworkSettings(mode=NetnsMode.ON, pod_network=NETWORK,
                               reachable=(ipaddress.IPv4Network("198.51.100.0/24"),))
    results = {}
    for name, settings in (("declared", declared), ("undeclared", ON)):
        pool = LocalPool(nodes(1), tmp_path / name, network=settings)
        try:
            launch(pool, "fetch", "n0", "bob", connect(storage_network, 7100))
            wait_final(pool, "fetch")
            results[name] = pool.read_log("fetch").text
        finally:
            pool.close(stop_pods=True)
    assert "reached storage" in results["declared"], results
    assert "blocked" in results["undeclared"], results
