"""Issue 13 item 8: `gpupool node drain` like Slurm's DRAIN (no new placements, running work finishes,
`draining` then `drained`), `--now` requeues at once, `uncordon` ends either."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.cliproc import gpupool, one_line_error
from factories import node
from gpupool.client import Client
from live import LiveServer, live_server
from server.fakes import ManualProvider
from server.upproc import until


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[tuple[LiveServer, ManualProvider, Client]]:
    provider = ManualProvider([node("n0", devices=4, model="H100"), node("n1", devices=4, model="H100")])
    with live_server(tmp_path, provider) as server, Client(server.url, server.admin_token) as pool:
        yield server, provider, pool


def running_on(pool: Client, workload_id: str) -> str:
    until(lambda: pool.workload(workload_id).status == "running", 30, f"{workload_id} running")
    (pod,) = pool.workload(workload_id).pods
    return pod.node


def state(server: LiveServer, name: str) -> str:
    listing = gpupool(server.url, server.admin_token, "node", "ls", "-o", "json")
    return str({n["name"]: n["state"] for n in json.loads(listing.stdout)}[name])


def run(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    return gpupool(server.url, server.admin_token, *args)


def test_drain_lets_running_work_finish(srv: tuple[LiveServer, ManualProvider, Client]) -> None:
    server, provider, pool = srv
    first = pool.submit({"command": ["true"], "resources": {"gpus": 2}})
    assert running_on(pool, first) == "n0"  # first-fit
    drained = run(server, "node", "drain", "n0")
    assert (drained.returncode, drained.stdout, drained.stderr) == (0, "n0 draining\n", "")
    # n0 still has room, but new work goes elsewhere; the running work is left alone.
    second = pool.submit({"command": ["true"], "resources": {"gpus": 1}})
    assert running_on(pool, second) == "n1"
    assert pool.workload(first).status == "running" and pool.workload(first).attempt == 1
    assert provider.stopped == [] and state(server, "n0") == "draining"
    provider.finish(pool.workload(first).pods[0].id, 0)
    until(lambda: pool.workload(first).status == "succeeded", 30, "the drained node's work to end")
    assert state(server, "n0") == "drained"
    assert "drained" in run(server, "node", "ls").stdout
    ready = run(server, "node", "uncordon", "n0")
    assert (ready.returncode, ready.stdout) == (0, "n0 ready\n")
    third = pool.submit({"command": ["true"], "resources": {"gpus": 1}})
    assert running_on(pool, third) == "n0"


def test_drain_now_requeues_at_once(srv: tuple[LiveServer, ManualProvider, Client]) -> None:
    server, provider, pool = srv
    busy = pool.submit({"command": ["true"], "resources": {"gpus": 3}})
    assert running_on(pool, busy) == "n0"
    pod = pool.workload(busy).pods[0].id
    drained = run(server, "node", "drain", "n0", "--now")
    assert (drained.returncode, drained.stdout, drained.stderr) == (0, "n0 drained\n", "")
    assert provider.stopped == [pod]
    assert running_on(pool, busy) == "n1"  # requeued and placed again, not on n0
    assert pool.workload(busy).attempt == 2
    assert "node_drained" in [e.reason for e in pool.events(busy)]


def test_drain_errors_are_one_line(srv: tuple[LiveServer, ManualProvider, Client]) -> None:
    server, _, pool = srv
    one_line_error(run(server, "node", "drain", "n9"), 3, "Error: No node named 'n9'.")
    pool.create_tenant("team-a")
    tenant_token = pool.create_token("team-a").token
    refused = gpupool(server.url, tenant_token, "node", "drain", "n0")
    one_line_error(refused, 3, "Error: This needs the admin token")
    assert state(server, "n0") == "ready"
