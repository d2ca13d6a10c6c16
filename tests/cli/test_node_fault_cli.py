"""Issue 12 item 5: `gpupool node fail|heal NODE [--device I]` (and the plural `nodes`) on a live
server, the state and per-device health in `node ls` and `node show`, and refusals in one line."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import replace

import pytest

from cli.cliproc import gpupool, one_line_error
from factories import node
from gpupool.client import Client
from gpupool.core.model import Node
from gpupool.providers.fake import FakeProvider
from live import LiveServer, live_server


def sim_node(name: str, devices: int = 4) -> Node:
    plain = node(name, devices=devices, model="H100")
    return replace(plain, devices=tuple(replace(d, simulated=True) for d in plain.devices))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    provider = FakeProvider([sim_node("s0"), sim_node("s1"), node("real", devices=2, model="H100")])
    with live_server(tmp_path_factory.mktemp("faults"), provider) as live:
        yield live


def run(server: LiveServer, *args: str, token: str = "") -> subprocess.CompletedProcess[str]:
    return gpupool(server.url, token or server.admin_token, *args)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert (result.returncode, result.stderr) == (0, ""), (result.returncode, result.stderr)
    return result.stdout


def test_fail_a_device_show_it_and_heal_it(server: LiveServer) -> None:
    assert ok(run(server, "node", "fail", "s0", "--device", "2")) == "s0 unhealthy (device 2)\n"
    listing = ok(run(server, "node", "ls")).splitlines()
    (s0_row,) = [line for line in listing if line.startswith("s0 ") and "H100" in line]  # the node's row
    assert "unhealthy (device 2)" in s0_row
    wide = ok(run(server, "node", "ls", "-o", "wide"))
    assert "INJECTED FAULTS" in wide and "device 2" in wide
    shown = ok(run(server, "node", "show", "s0")).splitlines()
    assert shown[0] == "s0 unhealthy (device 2)"
    device_rows = {line.split()[0]: line for line in shown if line.split()[:1] in (["0"], ["1"], ["2"])}
    assert "unhealthy (injected)" in device_rows["2"] and "unhealthy" not in device_rows["1"]
    as_json = json.loads(ok(run(server, "node", "show", "s0", "-o", "json")))
    assert [d["healthy"] for d in as_json["devices"]] == [True, True, False, True]
    assert ok(run(server, "nodes", "heal", "s0", "--device", "2")) == "s0 ready\n"  # the plural works too


def test_fail_a_whole_node_then_heal_every_fault(server: LiveServer) -> None:
    ok(run(server, "nodes", "fail", "s1", "-d", "0"))
    assert ok(run(server, "nodes", "fail", "s1")) == "s1 unhealthy (node)\n"
    states = {n["name"]: n["state"] for n in json.loads(ok(run(server, "node", "ls", "-o", "json")))}
    assert states == {"s0": "ready", "s1": "unhealthy", "real": "ready"}
    assert ok(run(server, "node", "heal", "s1")) == "s1 ready\n"
    with Client(server.url, server.admin_token) as pool:
        assert [(d.healthy, d.injected_fault) for d in pool.node("s1").devices] == [(True, False)] * 4


def test_refusals_are_one_line_with_the_documented_exit_code(server: LiveServer) -> None:
    one_line_error(run(server, "node", "fail", "real"), 2,
                   "Error: Node 'real' is real hardware; faults can be injected only on simulated devices")
    one_line_error(run(server, "node", "fail", "s0", "--device", "9"), 3, "Error: Node 's0' has no device 9;")
    one_line_error(run(server, "node", "heal", "s7"), 3, "Error: No node named 's7'.")
    one_line_error(run(server, "node", "show", "s7"), 3, "Error: No node named 's7'.")
    with Client(server.url, server.admin_token) as pool:
        pool.create_tenant("team-a")
        tenant_token = pool.create_token("team-a").token
    one_line_error(run(server, "node", "fail", "s0", token=tenant_token), 3,
                   "Error: This needs the admin token")
    assert run(server, "node", "fail", "s0", "--device", "-1").returncode == 2  # typer refuses it
    states = {n["name"]: n["state"] for n in json.loads(ok(run(server, "node", "ls", "-o", "json")))}
    assert states == {"s0": "ready", "s1": "ready", "real": "ready"}


def test_help_names_the_fault_verbs(server: LiveServer) -> None:
    text = ok(run(server, "node", "--help"))
    assert "fail" in text and "heal" in text and "show" in text
    assert "Refused on real hardware" in ok(run(server, "node", "fail", "--help"))
