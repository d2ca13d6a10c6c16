"""The Ray pitfalls that need no cluster: token file, process environment, version pin, explicit
addresses only, short temp dirs cleaned by pid."""

from __future__ import annotations

import ast
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray provider needs Ray (pip install 'gpupool[ray]')")

from gpupool.errors import ProviderError
from gpupool.providers.ray import cluster, driver
from gpupool.providers.ray.settings import RAY_VERSION, check_version, ensure_token, ray_env

SOURCE = Path(__file__).resolve().parents[2] / "src" / "gpupool"


def test_the_token_is_made_once_private_and_kept(tmp_path: Path) -> None:
    path = ensure_token(tmp_path / "d" / "ray-token")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text()
    assert len(token) == 64
    assert ensure_token(path).read_text() == token


def test_a_token_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ray-token"
    path.write_text("x" * 64)
    path.chmod(0o644)
    with pytest.raises(ProviderError, match="chmod 600"):
        ensure_token(path)


def test_every_ray_process_runs_with_auth_on_and_the_memory_monitor_off(tmp_path: Path) -> None:
    env = ray_env(tmp_path / "ray-token")
    assert env["RAY_AUTH_MODE"] == "token"
    assert env["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "ray-token")
    assert env["RAY_memory_monitor_refresh_ms"] == "0"
    assert env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"


def test_the_ray_version_is_pinned() -> None:
    import ray

    assert ray.__version__ == RAY_VERSION
    check_version(RAY_VERSION)
    with pytest.raises(ProviderError, match=f"Ray {RAY_VERSION}"):
        check_version("2.9.0")


@pytest.mark.parametrize("address", ["", "auto"])
def test_no_connection_without_an_explicit_address(address: str, tmp_path: Path) -> None:
    import ray

    connected = ray.is_initialized()  # the package's shared cluster may be connected already
    with pytest.raises(ProviderError, match="HOST:PORT"):
        driver.connect(address, ensure_token(tmp_path / "t"))
    assert ray.is_initialized() == connected  # refused before Ray was touched


def test_the_source_never_calls_ray_init_without_an_address() -> None:
    calls = []
    for path in SOURCE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "ray.init":
                calls.append((path.name, {k.arg for k in node.keywords}))
    assert calls, "the driver connects with ray.init"
    assert all("address" in keywords for _, keywords in calls), calls


def test_temp_dirs_are_short_and_those_of_dead_processes_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    stale = tmp_path / f"gpr-{dead.stdout.strip()}-1"
    stale.mkdir()
    mine = tmp_path / f"gpr-{os.getpid()}-99"
    mine.mkdir()
    other = tmp_path / "gpr-something"
    other.mkdir()
    fresh = cluster.short_temp_dir(tmp_path)
    assert not stale.exists() and mine.exists() and other.exists() and fresh.is_dir()
    real = cluster.short_temp_dir()
    try:
        # Ray's deepest socket: <temp>/session_<date>_<time>_<micro>_<pid>/sockets/plasma_store
        socket_path = f"{real}/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store"
        assert len(socket_path) < 107
    finally:
        cluster.remove_temp_dir(real)
    assert not real.parent.exists() and real.parent.name.startswith("gpr-")



def test_a_head_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A server killed with -9 leaves no Ray cluster running: its head notices and stops."""
    import signal
    import time

    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from gpupool.providers.ray.cluster import start_head\n"
        "from gpupool.providers.ray.settings import ensure_token\n"
        f"head = start_head(ensure_token(Path({str(tmp_path / 'ray-token')!r})))\n"
        "print(head.pid, head.temp_dir, flush=True)\n"
        "time.sleep(600)\n"
    )
    starter = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert starter.stdout is not None
        pid_text, temp_dir = starter.stdout.readline().split()
        head_pid = int(pid_text)
        assert Path(f"/proc/{head_pid}").exists()
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (
            Path(f"/proc/{head_pid}").exists() or cluster._used_by_a_process([Path(temp_dir)])):
        time.sleep(0.5)
    assert not Path(f"/proc/{head_pid}").exists(), "the head outlived the process that started it"
    assert not cluster._used_by_a_process([Path(temp_dir)]), "a Ray process of the head is still running"


def test_the_ports_of_one_node_are_distinct() -> None:
    """Ray refuses a node two of whose components share a port; each is chosen while the others
    are still held."""
    assert len(set(cluster.free_ports(64))) == 64
    ports, extra = cluster.agent_ports(extra=3)
    assert len(set(ports.values()) | set(extra)) == 7


def test_a_kept_pod_network_plan_reads_back_whole_and_a_damaged_one_is_none() -> None:
    """What a node agent keeps in its state directory for a restart (node_agent.PLAN_FILE)."""
    import ipaddress
    import json
    from dataclasses import replace

    from gpupool.agent.netns import NetnsMode, NetworkSettings
    from gpupool.providers.ray.network import NetworkPlan

    settings = NetworkSettings(NetnsMode.ON, ipaddress.IPv4Network("10.250.0.0/16"),
                               (ipaddress.IPv4Network("192.0.2.0/24"),))
    plan = NetworkPlan(settings, (("192.0.2.1", 8000),), 3, (("a", 3, "192.0.2.1"), ("b", 4, "192.0.2.2")),
                       (("a", "id-a"), ("b", "id-b")), ("192.0.2.9",))
    assert NetworkPlan.from_json(plan.to_json()) == plan
    whole = json.loads(plan.to_json())
    older = {k: v for k, v in whole.items() if k != "servers"}  # kept by an agent before servers were sent
    assert NetworkPlan.from_json(json.dumps(older)) == replace(plan, servers=())
    for damaged in ("{", "[]", json.dumps({**whole, "mode": "sometimes"}),
                    json.dumps({**whole, "pod_network": "10.250.0.0/33"}),
                    json.dumps({**whole, "servers": ["192.0.2.9 . 1"]}),
                    json.dumps({k: v for k, v in whole.items() if k != "slot"})):
        assert NetworkPlan.from_json(damaged) is None, damaged
