"""A live server on the ray provider: gangs across Ray nodes that really meet, two gangs at once,
a preemption, and a remote function called from a process with no GPU variables.

Shares the package's Ray cluster (conftest.pool: three simulated nodes of two T4s, one IP: they
run on this machine) and runs before test_ray_pool.py, which kills nodes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray provider needs Ray (pip install 'gpupool[ray]')")

from factories import ALL_REDUCE
from gpupool.client import Client
from gpupool.config import parse_config
from gpupool.providers.ray import RayProvider
from live import LiveServer, live_server
from ports import gang_config, gang_ports

from .conftest import wait_for

CONFIG = """
scheduling: {placement: first-fit, backfill: false}
priority_classes:
  - {name: low, value: 0, preemptible: true, grace: 10s}
  - {name: high, value: 1000}
"""
GPU_VARS = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


@pytest.fixture(scope="module")
def server(pool: RayProvider,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Client]]:
    provider = RayProvider(pool.address, data_dir=pool.data_dir)
    try:
        config = parse_config(CONFIG + gang_config())  # rank 0 binds MASTER_PORT on its Ray node's host
        with live_server(tmp_path_factory.mktemp("live"), provider, config=config) as live, \
                Client(live.url, live.admin_token) as client:
            yield live, client
    finally:
        provider.close(stop_pods=True)


def _python() -> str:
    from factories import pod_python

    return pod_python()


def _logs(client: Client, workload_id: str, ranks: int) -> list[str]:
    return [client.logs(workload_id, rank=rank).text for rank in range(ranks)]


def _nodes(client: Client, workload_id: str) -> list[str]:
    return [p.node for p in sorted(client.workload(workload_id).pods, key=lambda p: p.rank)]


def test_two_gangs_at_once_meet_on_their_own_ports_and_all_reduce(
        server: tuple[LiveServer, Client], pod_scratch_root: Path) -> None:
    _, client = server
    meet = pod_scratch_root / "meet"  # pods run as another account: a directory open to them
    meet.mkdir()
    meet.chmod(0o777)
    command = [_python(), "-c", ALL_REDUCE, str(meet), "2"]
    across = client.submit({"command": command, "replicas": 2, "resources": {"gpus": 2, "cpu": 0.1}})
    beside = client.submit({"command": command, "replicas": 2, "resources": {"gpus": 1, "cpu": 0.1}})
    done = {wid: client.wait(wid, timeout_s=180) for wid in (across, beside)}
    logs = {wid: _logs(client, wid, 2) for wid in done}
    assert {w.status for w in done.values()} == {"succeeded"}, logs
    across_nodes = _nodes(client, across)
    assert len(set(across_nodes)) == 2  # each rank took a whole node: the gang spans two Ray nodes
    ports = {wid: {int(line.split(" at port ")[1].split(":")[0]) for line in text}
             for wid, text in logs.items()}
    assert all(len(p) == 1 for p in ports.values()) and ports[across] != ports[beside]
    assert set().union(*ports.values()) <= set(gang_ports())  # this worker's, no other worker's
    assert sorted(int(name) for name in (p.name for p in meet.iterdir())) == sorted(
        next(iter(p)) for p in ports.values())  # both rank-0 servers were listening at the same time
    for wid, text in logs.items():
        nodes = _nodes(client, wid)
        port = next(iter(ports[wid]))
        assert text == [f"rank {r} of 2 on {nodes[r]} at port {port}: sum 3\n" for r in range(2)]


def test_a_low_priority_workload_is_preempted_with_sigterm_and_the_high_one_runs(
        server: tuple[LiveServer, Client], pod_scratch_root: Path) -> None:
    _, client = server
    marks, armed = pod_scratch_root / "terms", pod_scratch_root / "armed"
    for directory in (marks, armed):
        directory.mkdir()
        directory.chmod(0o777)
    trap = f"trap 'touch {marks}/$NODE_RANK; exit 0' TERM; touch {armed}/$NODE_RANK; sleep 60 & wait"
    low = client.submit({"command": ["sh", "-c", trap], "replicas": 3, "priority_class": "low",
                         "resources": {"gpus": 2, "cpu": 0.1}})  # every device of the pool
    wait_for(lambda: client.workload(low).status == "running", 120.0, "the low workload to run")
    # a SIGTERM that lands before a shell has set its trap ends it without a mark: preempt once all have
    wait_for(lambda: len(list(armed.iterdir())) == 3, 60.0, "every low pod to set its SIGTERM trap")
    high = client.submit({"command": ["sh", "-c", "echo high ran on $GPUPOOL_NODE"], "priority_class": "high",
                          "resources": {"gpus": 2, "cpu": 0.1}})
    assert client.wait(high, timeout_s=120).status == "succeeded"
    assert client.logs(high).text.startswith("high ran on t4-")
    events = client.events(low)
    assert any("preempt" in f"{e.to_status} {e.reason}" for e in events), [e.reason for e in events]
    # each pod got SIGTERM and its trap ran: the gang's three stops go out together, but the high one
    # may run and end on the first node freed before the other two pods' traps have run
    wait_for(lambda: sorted(p.name for p in marks.iterdir()) == ["0", "1", "2"], 60.0,
             "every low pod's SIGTERM trap to run")
    client.cancel(low)
    assert client.wait(low, timeout_s=60).status == "cancelled"


def test_a_remote_function_from_a_process_without_gpu_variables_runs_on_a_ray_pod(
        server: tuple[LiveServer, Client], tmp_path: Path) -> None:
    live, client = server
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent("""
        import json, os
        import gpupool

        assert not any(os.environ.get(name) for name in {gpu_vars!r}), "the client has GPU variables"
        with gpupool.connect() as pool:
            @pool.function(gpus=0.25, timeout="5m")
            def where(x):
                import os
                return x * 2, os.environ["GPUPOOL_NODE"], os.environ.get("CUDA_VISIBLE_DEVICES", "")

            future = where.remote(21)
            print(json.dumps({{"answer": future.result(), "workload": future.workload_id}}))
    """).format(gpu_vars=GPU_VARS))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GPUPOOL_URL": live.url,
           "GPUPOOL_TOKEN": live.admin_token}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    value, node, device = answer["answer"]
    assert value == 42 and node in {n.name for n in client.nodes()} and device.startswith("GPU-")
    assert _nodes(client, answer["workload"]) == [node]
