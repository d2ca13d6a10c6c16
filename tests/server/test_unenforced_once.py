"""Issue 38 item 6: an unenforced limit is said once per node, not as an event on every workload.

A real (not simulated) node whose provider lacks MPS and cgroup v2 holds many workloads that ask for a
device share and host cpu: none of them gets a `limits_unenforced` event, the node's layers say it
(node ls / node show), and `gpupool show` still tells each workload which of its limits do not hold
there, derived from the node's layers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fakes import ManualProvider

from conftest import Server, start_server, stop_server
from factories import node
from gpupool.cli.show import _show_one
from gpupool.client import Client
from gpupool.providers.base import Capability

NO_MPS = "no nvidia-cuda-mps-control on this node"
NO_CGROUPS = "no writable delegated cgroup v2 tree"
WORKLOADS = 12


class Unenforcing(ManualProvider):
    """Real-like devices on a provider that cannot cap a device share nor a pod's cpu and memory."""

    def missing_capabilities(self) -> dict[Capability, str]:
        return {Capability.MPS: NO_MPS, Capability.CGROUPS: NO_CGROUPS}


@pytest.fixture(scope="module")
def placed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Client, list[str]]]:
    server = start_server(tmp_path_factory.mktemp("unenforced"),
                          provider=Unenforcing([node("gpu-07", devices=8, model="H100")]))
    pool = Client("http://testserver", server.admin_token, transport=server.client._transport)
    try:
        ids = [pool.submit({"command": ["sleep", "600"], "name": f"w{i}",
                            "resources": {"gpus": 0.5, "cpu": 1}}) for i in range(WORKLOADS)]
        server.wait_for(lambda: all(pool.workload(w).status == "running" for w in ids))
        yield server, pool, ids
    finally:
        pool.close()
        stop_server(server)


def test_no_workload_gets_a_limits_unenforced_event(placed: tuple[Server, Client, list[str]]) -> None:
    _, pool, ids = placed
    assert all(not any(p.simulated for p in pool.workload(w).pods) for w in ids)  # a real-like node
    for wid in ids:
        reasons = [e.reason for e in pool.events(wid)]
        assert "admitted" in reasons and "limits_unenforced" not in reasons, reasons


def test_the_node_says_it_once(placed: tuple[Server, Client, list[str]]) -> None:
    _, pool, _ = placed
    layers = {s.layer: s for s in pool.node("gpu-07").enforcement}
    assert not layers["device_limits"].enforced and layers["device_limits"].detail == NO_MPS
    assert not layers["host_limits"].enforced and layers["host_limits"].detail == NO_CGROUPS


def test_show_still_says_which_of_its_limits_do_not_hold(placed: tuple[Server, Client, list[str]],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    _, pool, ids = placed
    _show_one(pool, pool.workload(ids[-1]))
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("not enforced:")]
    assert said == [
        f"not enforced: device compute and memory limits are not enforced on node gpu-07: {NO_MPS}",
        f"not enforced: host cpu and memory limits are not enforced on node gpu-07: {NO_CGROUPS}"]


def test_a_whole_device_is_not_told_of_device_shares(placed: tuple[Server, Client, list[str]],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    server, pool, _ = placed
    whole = pool.submit({"command": ["sleep", "600"], "name": "whole", "resources": {"gpus": 1}})
    server.wait_for(lambda: pool.workload(whole).status == "running")
    _show_one(pool, pool.workload(whole))
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("not enforced:")]
    assert said == [  # the host cpu and memory it holds by default, not a device share it never asked for
        f"not enforced: host cpu and memory limits are not enforced on node gpu-07: {NO_CGROUPS}"]
