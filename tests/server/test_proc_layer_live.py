"""A real `gpupool up` on this machine reports whether /proc hides other accounts' processes, at
start-up, through the API and in `gpupool node ls`, as the mount table says (this test's machine is
read, never remounted)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from upproc import UpProcess, cli

from gpupool.agent.procfs import proc_visibility

pytestmark = pytest.mark.slow
REMOUNT = "mount -o remount,hidepid=2,gid=GROUP /proc"


def test_up_reports_the_proc_layer_with_its_remedy(tmp_path: Path) -> None:
    server = UpProcess(tmp_path / "data", ["--simulate", "1x2xH100"]).start()
    try:
        with server.client() as api:
            nodes = api.get("/nodes").json()
        layers = [layer for n in nodes for layer in n["enforcement"] if layer["layer"] == "proc"]
        assert len(layers) == len(nodes) >= 1
        env = {"GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.token(), "COLUMNS": "400"}
        listing = cli(["node", "ls", "-o", "wide"], env)
        assert listing.returncode == 0, listing.stderr
        rows = [line for line in listing.stdout.splitlines() if " proc " in line]
        assert len(rows) == len(nodes), listing.stdout
    finally:
        server.stop()
    why = proc_visibility()  # after the start: the pods' group exists, as it did for the server
    root = os.geteuid() == 0
    assert (REMOUNT in server.log_text()) == bool(why and root), server.log_text()
    if not why and root:
        assert all(layer["level"] == "enforced" for layer in layers), layers
        assert all(" yes " in row for row in rows), rows
        return
    for layer in layers:
        assert layer["level"] == "unenforced" and not layer["enforced"], layer
        assert not root or layer["detail"] == why, layer
    assert all(" no " in row for row in rows), rows
    if root:
        assert all(REMOUNT in row for row in rows), rows
