"""A real `gpupool up` on this machine reports whether /proc hides other accounts' processes, through
the API and `gpupool node ls`, as the mount table says (this test's machine is read, never
remounted)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from upproc import UpProcess, cli

from gpupool.agent.procfs import parse_mountinfo

pytestmark = pytest.mark.slow


def test_up_reports_the_proc_layer_with_its_remedy(tmp_path: Path) -> None:
    mount = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    hidden = mount is not None and mount.hides
    server = UpProcess(tmp_path / "data", ["--simulate", "1x2xH100"]).start()
    try:
        with server.client() as api:
            nodes = api.get("/nodes").json()
        layers = [layer for n in nodes for layer in n["enforcement"] if layer["layer"] == "proc"]
        assert len(layers) == len(nodes) >= 1
        listing = cli(["node", "ls"], {"GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.token(),
                                       "COLUMNS": "400"})
        assert listing.returncode == 0, listing.stderr
        rows = [line for line in listing.stdout.splitlines() if " proc " in line]
        assert rows, listing.stdout
    finally:
        server.stop()
    if hidden and os.geteuid() == 0:
        assert all(layer["level"] == "enforced" for layer in layers), layers
        return
    for layer in layers:
        assert layer["level"] == "unenforced" and not layer["enforced"]
        assert "mount -o remount,hidepid=2,gid=GROUP /proc" in layer["detail"] or hidden, layer
    for row in rows:
        assert " no " in row and "hidepid" in row, row
    if not hidden:
        assert any("mount -o remount,hidepid=2,gid=GROUP /proc" in row for row in rows), rows
