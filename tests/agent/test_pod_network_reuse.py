"""A pod address is freed when its pod ends and given to the next pod, perhaps another tenant's. The
rules accept a packet of an established connection before any tenant check, so the kernel's
connection entries of the address must go with its pod: else the next pod inherits them and talks
to the last pod's peers (a UDP flow stays established while either side keeps it busy)."""

from __future__ import annotations

import ipaddress
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from factories import pod_python
from gpupool.agent import netns
from gpupool.agent.netns import NetnsMode, NetworkSettings
from gpupool.core.model import Device, Node
from gpupool.pods import PodLaunch
from gpupool.providers.localpool import LocalPool

WHY = netns.probe() or ("" if shutil.which("conntrack", path="/usr/sbin:/usr/bin:/sbin:/bin")
                        else "conntrack is not installed (Debian's conntrack)")
NETWORK = ipaddress.IPv4Network("10.226.0.0/16")
"""This file's own pod network: test files that run at once never share one."""
PY = pod_python()

LISTENER = r"""
import os, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 7000))
print("address", os.environ["GPUPOOL_POD_ADDRESS"], flush=True)
while True:
    data, peer = s.recvfrom(1000)
    print("got", data.decode(), flush=True)
    s.sendto(b"secret", peer)
"""
SENDER = r"""
import os, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 5555))
s.settimeout(3)
print("address", os.environ["GPUPOOL_POD_ADDRESS"], flush=True)
s.sendto(sys.argv[2].encode(), (sys.argv[1], 7000))
try:
    print("answer", s.recvfrom(100)[0].decode(), flush=True)
except OSError:
    print("no answer", flush=True)
"""


@pytest.fixture
def pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalPool]:
    monkeypatch.setattr(netns, "KEPT", 0)  # every namespace goes with its pod, as a gang pod's does
    monkeypatch.setattr(netns, "SPARES", 0)  # and the next pod takes the lowest free address
    node = Node(name="n0", cpu_milli=8000, memory_mib=16384,
                devices=(Device(uuid="GPU-r-0", model="H100", index=0, memory_mib=81920),))
    settings = NetworkSettings(mode=NetnsMode.ON, pod_network=NETWORK)
    made = LocalPool([node], tmp_path / "pool", network=settings)
    yield made
    made.close(stop_pods=True)


def _log(pool: LocalPool, pod_id: str, *, until: str = "", final: bool = False) -> str:
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        status = {s.pod_id: s for s in pool.poll()}.get(pod_id)
        text = pool.read_log(pod_id).text
        if (until and until in text) or (final and status is not None and status.phase.is_final):
            return pool.read_log(pod_id).text
        time.sleep(0.05)
    raise AssertionError(f"{pod_id}: {pool.read_log(pod_id).text!r}")


def _address(log: str) -> str:
    return log.split("address", 1)[1].split()[0]


@pytest.mark.skipif(bool(WHY), reason=f"needs network namespaces and conntrack: {WHY}")
def test_the_next_pod_given_an_address_inherits_none_of_its_connections(pool: LocalPool) -> None:
    def launch(pod_id: str, tenant: str, script: str, *args: str) -> None:
        pool.launch(PodLaunch(pod_id=pod_id, workload_id="w-" + pod_id, node="n0", tenant=tenant,
                              command=(PY, "-c", script, *args), env={}))

    launch("listener", "alice", LISTENER)
    target = _address(_log(pool, "listener", until="address"))
    launch("friend", "alice", SENDER, target, "friend")
    friend = _log(pool, "friend", final=True)
    assert "answer secret" in friend  # alice's own pods talk: the connection is established
    freed = _address(friend)
    network = pool._member("n0").agent.network
    deadline = time.monotonic() + 20
    while True:  # its namespace is torn down with it, and only then is its address free
        pool.poll()
        with network._lock:
            if freed not in network._addresses_held():
                break
        assert time.monotonic() < deadline, "the friend's address was not freed"
        time.sleep(0.05)
    launch("mallory", "mallory", SENDER, target, "mallory")
    mallory = _log(pool, "mallory", final=True)
    assert _address(mallory) == freed, (target, freed, mallory)  # the same address and port, another tenant
    assert "no answer" in mallory, mallory
    assert "got mallory" not in pool.read_log("listener").text


FLOOD = r"""
import os, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
print("address", os.environ["GPUPOOL_POD_ADDRESS"], flush=True)
for port in range(20000, 20000 + int(sys.argv[2])):
    try:
        s.sendto(b"x", (sys.argv[1], port))
    except OSError:
        pass
print("sent", flush=True)
time.sleep(120)  # counted while it lives: its connections go with its address when it ends
"""


@pytest.mark.skipif(bool(WHY), reason=f"needs network namespaces and conntrack: {WHY}")
def test_one_pod_cannot_fill_the_nodes_connection_table(pool: LocalPool) -> None:
    """The kernel's connection table is the node's (every pod's, the host's): one pod's flows are
    bounded (`POD_CONNECTIONS`), new ones past it dropped, where one pod made 40,000 in 0.17 s."""
    import subprocess

    def launch(pod_id: str, script: str, *args: str) -> None:
        pool.launch(PodLaunch(pod_id=pod_id, workload_id="w-" + pod_id, node="n0", tenant="bob",
                              command=(PY, "-c", script, *args), env={}))

    launch("sink", "import os, time; print('address', os.environ['GPUPOOL_POD_ADDRESS'], flush=True); "
                   "time.sleep(120)")
    sink = _address(_log(pool, "sink", until="address"))
    flows = netns.POD_CONNECTIONS + 2000
    launch("flood", FLOOD, sink, str(flows))  # to its own tenant's pod: the rules let it through
    flood = _address(_log(pool, "flood", until="sent"))

    def tracked() -> int:
        listed = subprocess.run(["conntrack", "-L", "-p", "udp", "--orig-src", flood], capture_output=True,
                                text=True, check=False).stdout
        return sum(1 for line in listed.splitlines() if line.startswith("udp"))

    counts = [tracked()]
    while len(counts) < 20 and (len(counts) < 2 or counts[-1] != counts[-2]):  # packets still on their way
        time.sleep(0.1)
        counts.append(tracked())
    assert netns.POD_CONNECTIONS - 50 <= counts[-1] <= netns.POD_CONNECTIONS, counts
