"""kill -9 of a real `gpupool up` and a restart: nothing lost, nothing started twice, running work
re-adopted, and work whose process vanished meanwhile marked failed with a reason."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ports import free_port

pytestmark = pytest.mark.slow


def _start(data_dir: Path, port: int, *, simulate: str | None = "1x4xH100",
           env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    pool = ["--simulate", simulate] if simulate else []
    return subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "up", "--data-dir", str(data_dir), "--port", str(port),
         *pool, "--placement", "first-fit"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def _stop(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGKILL after 30 s."""
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()


def _until(predicate: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():  # type: ignore[operator]
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.1)


def test_kill_9_and_restart(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/api/v1"
    server = _start(tmp_path, port)
    probe = httpx.Client()  # one client for every poll (each new one loads the CAs: ~17 ms of CPU)
    try:
        _until(lambda: probe.get(f"{url}/health").status_code == 200)
        token = (tmp_path / "admin-token").read_text().strip()
        assert (tmp_path / "admin-token").stat().st_mode & 0o777 == 0o600
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"})

        def submit(command: list[str], gpus: float) -> str:
            answer = api.post("/workloads", json={"command": command, "resources": {"gpus": gpus}})
            assert answer.status_code == 201, answer.text
            return str(answer.json()["id"])

        def status(wid: str) -> str:
            return str(api.get(f"/workloads/{wid}").json()["status"])

        keeps = submit(["sleep", "60"], 0.5)
        victim = submit(["sh", "-c", "echo $$; exec sleep 60"], 0.5)  # its pid, in its log
        done = submit(["true"], 1)
        waiting = submit(["true"], 4)  # cannot fit while the others hold devices
        _until(lambda: status(keeps) == status(victim) == "running" and status(done) == "succeeded")
        assert status(waiting) == "pending"
        _until(lambda: api.get(f"/workloads/{victim}/logs").json()["text"].strip().isdigit())
        victim_pid = int(api.get(f"/workloads/{victim}/logs").json()["text"])
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
        os.kill(victim_pid, signal.SIGKILL)  # its process dies while no server watches

        server = _start(tmp_path, port)
        _until(lambda: probe.get(f"{url}/health").status_code == 200)
        assert (tmp_path / "admin-token").read_text().strip() == token  # not recreated
        _until(lambda: status(victim) == "failed")
        assert status(keeps) == "running" and status(done) == "succeeded"
        assert api.get("/workloads").json()["total"] == 4  # nothing lost
        events = api.get(f"/workloads/{keeps}/events").json()
        assert [e["reason"] for e in events].count("launched") == 1  # never started twice
        assert events[-1]["reason"] == "adopted"
        lost = api.get(f"/workloads/{victim}").json()
        assert lost["reason"] in ("pod_lost", "pod_failed", "lost_on_restart") and lost["message"]
        assert api.post(f"/workloads/{keeps}/cancel").json()["status"] == "cancelled"
        _until(lambda: status(waiting) == "succeeded")
    finally:
        probe.close()
        _stop(server)


@functools.cache
def _no_gpu_and_namespaces() -> str:
    """Why the default pool's restart cannot be tried here ('' where it can)."""
    from gpupool.agent import netns
    from gpupool.providers.local import devices_here

    if devices_here()[0]:
        return "this machine has a GPU, so `gpupool up` serves it rather than the simulated pool"
    why = netns.probe()
    return f"network namespaces cannot be made here: {why}" if why else ""


@pytest.mark.skipif(bool(_no_gpu_and_namespaces()), reason=_no_gpu_and_namespaces() or "runs")
def test_a_restart_of_the_default_pool_keeps_the_network_of_a_running_pod(tmp_path: Path) -> None:
    """`gpupool up` with no GPU and no --simulate (what `make run` starts) looks for devices before
    its simulated nodes' agents start; the agent it once made for that took the pod network's first
    block and cleared the namespaces of the first node's pods, which, re-adopted, ran on unreachable."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/api/v1"
    env = {"GPUPOOL_POD_NETWORK": "10.227.0.0/16"}  # this file's own: files that run at once share none
    server = _start(tmp_path, port, simulate=None, env=env)
    probe = httpx.Client()
    try:
        _until(lambda: probe.get(f"{url}/health").status_code == 200)
        token = (tmp_path / "admin-token").read_text().strip()
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"})
        made = api.post("/workloads", json={"command": ["sleep", "120"], "resources": {"gpus": 0.5}})
        assert made.status_code == 201, made.text
        wid = made.json()["id"]
        _until(lambda: api.get(f"/workloads/{wid}").json()["status"] == "running")
        [state] = tmp_path.glob(f"agents/*/pods/{wid}-a1-r0/state.json")
        net = json.loads(json.loads(state.read_text())["net"])
        pid = json.loads(state.read_text())["pid"]

        def attached() -> list[str]:
            """What of the pod's network is missing (nothing while it is whole)."""
            named, veth = f"/run/netns/{net['netns']}", f"/sys/class/net/{net['veth']}"
            missing = [what for what, path in (("namespace", named), ("veth", veth))
                       if not os.path.exists(path)]
            if not missing and os.stat(named).st_ino != os.stat(f"/proc/{pid}/ns/net").st_ino:
                missing.append("the pod in its namespace")
            route = subprocess.run(["ip", "route", "get", net["address"]], capture_output=True, text=True)
            if f"dev {net['veth']}" not in route.stdout:
                said = route.stdout.strip() or route.stderr.strip()
                missing.append(f"the route to {net['address']} ({said})")
            return missing

        assert attached() == []
        server.send_signal(signal.SIGTERM)  # pods outlive the server, and are re-adopted
        server.wait(timeout=30)
        server = _start(tmp_path, port, simulate=None, env=env)
        _until(lambda: probe.get(f"{url}/health").status_code == 200)
        _until(lambda: api.get(f"/workloads/{wid}/events").json()[-1]["reason"] == "adopted")
        assert api.get(f"/workloads/{wid}").json()["status"] == "running"
        assert attached() == []
        assert api.post(f"/workloads/{wid}/cancel").json()["status"] == "cancelled"
    finally:
        probe.close()
        _stop(server)
