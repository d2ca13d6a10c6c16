"""A real `gpupool up` says whether its pods get network namespaces: at start-up, in `gpupool node ls`
(layer `network`) and in the audit log; and it refuses a setting it cannot use with one sentence."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest
from upproc import UpProcess, cli

from gpupool.agent import netns
from ports import free_port

pytestmark = pytest.mark.slow
WHY = netns.probe()
NETWORK = ipaddress.IPv4Network("10.237.0.0/16")
"""This file's own pod network (test files that run at once never share one: tests/test_layout.py)."""


def _network_rows(server: UpProcess) -> tuple[list[dict[str, object]], list[str], list[dict[str, object]]]:
    with server.client() as api:
        nodes = api.get("/nodes").json()
        audit = api.get("/audit").json()
    layers = [layer for n in nodes for layer in n["enforcement"] if layer["layer"] == "network"]
    env = {"GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.token(), "COLUMNS": "400"}
    listing = cli(["node", "ls", "-o", "wide"], env)
    assert listing.returncode == 0, listing.stderr
    rows = [line for line in listing.stdout.splitlines() if " network " in line]
    recorded = [r for r in audit if r["action"] == "isolation.unenforced" and r["target"] == "network"]
    return layers, rows, recorded


def test_up_with_namespaces_off_says_so_everywhere(tmp_path: Path) -> None:
    off = {"GPUPOOL_POD_NETNS": "off"}
    server = UpProcess(tmp_path / "data", ["--simulate", "1x2xH100"], env=off).start()
    try:
        layers, rows, recorded = _network_rows(server)
    finally:
        server.stop()
    assert layers and all(not layer["enforced"] and "GPUPOOL_POD_NETNS=off" in str(layer["detail"])
                          for layer in layers), layers
    assert rows and all(" no " in row for row in rows), rows
    assert len(recorded) == 1 and "GPUPOOL_POD_NETNS=off" in str(recorded[0]["detail"]), recorded
    if os.geteuid() == 0:  # a pool of other accounts whose pods share the node's network is warned about
        assert "layer network" in server.log_text(), server.log_text()


@pytest.mark.skipif(bool(WHY), reason=f"no pod network namespaces here: {WHY}")
def test_up_with_namespaces_reports_the_layer_enforced(tmp_path: Path) -> None:
    env = {"GPUPOOL_POD_NETNS": "on", "GPUPOOL_POD_NETWORK": str(NETWORK)}
    server = UpProcess(tmp_path / "data", ["--simulate", "2x1xH100"], env=env).start()
    try:
        layers, rows, recorded = _network_rows(server)
    finally:
        server.stop()
    assert len(layers) == 2 and all(layer["enforced"] for layer in layers), layers
    assert len(rows) == 2 and all(" yes " in row for row in rows), rows
    assert recorded == []
    assert "layer network" not in server.log_text()
    keys = [netns.PodNetwork(netns.NetworkSettings(mode=netns.NetnsMode.OFF, pod_network=NETWORK), slot).key
            for slot in (0, 1)]
    left = [p.name for p in Path("/run/netns").glob("gpn-*") if p.name.split("-")[1] in keys]
    assert left == [], left  # stopped with SIGTERM, it closed its agents: their spare namespaces went too


def test_up_refuses_a_network_setting_it_cannot_use_with_one_sentence(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "gpupool.cli.main", "up", "--data-dir", str(tmp_path / "data"),
            "--port", str(free_port()), "--simulate", "1x2xH100"]
    done = subprocess.run(argv, env={**os.environ, "GPUPOOL_POD_NETNS": "maybe"}, capture_output=True,
                          text=True, timeout=120, check=False)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "GPUPOOL_POD_NETNS='maybe' is not one of auto, on, off" in out, out
    assert "Traceback" not in out, out
