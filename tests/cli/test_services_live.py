"""Services through the real `gpupool` entry point against a real `gpupool up --simulate`: replicas
are processes told their port in $PORT, reached (in their pod network namespaces where the node
makes them) at the endpoint the store records; a killed replica is replaced; bad input exits 2 or 3."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli_inproc import run_cli
from ports import serving_config, serving_ports
from server.upproc import UpProcess, until

pytestmark = pytest.mark.slow
POD_NETWORK = "10.244.0.0/16"
"""This file's own pod network: pools on one machine must not share one."""
REPLICA = """
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ('%s %s' % (os.environ['PORT'], os.getpid())).encode()
        self.send_response(200 if self.path in ('/healthz', '/who') else 404)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(('0.0.0.0', int(os.environ['PORT'])), H).serve_forever()
"""


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    base = tmp_path_factory.mktemp("services")
    config = base / "pool.yaml"
    config.write_text(serving_config())
    server = UpProcess(base / "data", ["--simulate", "2x2xH100", "--config", str(config)],
                       env={"GPUPOOL_POD_NETWORK": POD_NETWORK}).start()
    try:
        yield server
    finally:
        server.stop()


def gp(pool: UpProcess, *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env = {**base, "GPUPOOL_URL": pool.url, "GPUPOOL_TOKEN": pool.token()}
    return run_cli(args, env)


def shown(pool: UpProcess, name: str) -> dict:
    result = gp(pool, "service", "show", name, "--json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def ask(host: str, port: int) -> tuple[int, int]:
    """(the $PORT the replica was given, its pid), from the replica itself."""
    port_text, pid = httpx.get(f"http://{host}:{port}/who", timeout=5).text.split()
    return int(port_text), int(pid)


def test_replicas_serve_on_their_port_and_a_killed_one_is_replaced(pool: UpProcess) -> None:
    created = gp(pool, "service", "create", "web", "--gpus", "0.25", "--min", "2", "--max", "3",
                 "--readiness-http", "/healthz", "--probe-period", "0.2", "--", "python3", "-c", REPLICA)
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == "web"
    until(lambda: shown(pool, "web")["state"] == "ready", 90, "service web ready")
    service = shown(pool, "web")
    assert service["url"] is None  # this pool serves no data plane (no --serve-port), and says so
    said = "url: none (this pool routes no service traffic: start it with gpupool up --serve-port PORT)"
    assert said in gp(pool, "service", "show", "web").stdout
    replicas = service["replicas"]
    assert [r["ready"] for r in replicas] == ["ready", "ready"]
    assert len({r["port"] for r in replicas}) == 2
    assert all(r["port"] in serving_ports() for r in replicas)  # this worker's, no other worker's
    pids = {}
    for r in replicas:
        port, pid = ask(r["host"], r["port"])
        assert port == r["port"]  # the replica listens where its $PORT says, reached at its endpoint
        pids[r["workload_id"]] = pid
    victim = replicas[0]["workload_id"]
    os.kill(pids[victim], signal.SIGKILL)

    def replaced() -> bool:
        now = shown(pool, "web")
        ids = [r["workload_id"] for r in now["replicas"]]
        return now["state"] == "ready" and victim not in ids and len(ids) == 2

    until(replaced, 90, "the killed replica replaced")
    events = shown(pool, "web")["events"]
    assert any(e["reason"] == "replica_replaced" and victim in e["message"] for e in events), events

    def listed_ready() -> bool:
        ls = gp(pool, "service", "ls")
        assert ls.returncode == 0 and "web" in ls.stdout, ls.stdout
        return "2/2" in ls.stdout

    # Readiness is probed every 0.2 s within 0.2 s: on a loaded machine a replica can miss three
    # probes in a row and be unready for a moment after `replaced` saw both ready (`ls` then read
    # "pending 1/2"); the listing must show both ready again, not at one instant.
    until(listed_ready, 60, "service ls showing web with 2/2 ready")
    assert gp(pool, "service", "delete", "web").returncode == 0
    until(lambda: gp(pool, "service", "show", "web").returncode == 3, 30, "the service gone")


@pytest.mark.parametrize(("args", "code", "words"), [
    (("create", "bad", "--min", "3", "--max", "2", "--", "x"), 2, "--min 3 is above --max 2"),
    (("create", "bad", "--target-concurrency", "0", "--", "x"), 2, "per replica must be at least 0.001"),
    (("create", "bad"), 2, "Give the replica's command after --"),
    (("show", "nope"), 3, "No service 'nope'"),
    (("scale", "nope", "2"), 3, "No service 'nope'"),
    (("delete", "nope"), 3, "No service 'nope'"),
])
def test_bad_input_exits_with_a_sentence(pool: UpProcess, args: tuple[str, ...], code: int,
                                         words: str) -> None:
    result = gp(pool, "service", *args)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert words in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_spec_file_then_scale_and_update_through_the_cli(pool: UpProcess, tmp_path: Path) -> None:
    spec = tmp_path / "svc.yaml"
    spec.write_text("command: [sleep, '600']\nresources: {gpus: 0.25}\nmin_replicas: 0\nmax_replicas: 2\n"
                    "replicas: 0\nreadiness: {kind: tcp, period_s: 0.5, timeout_s: 0.5}\n")
    assert gp(pool, "service", "create", "filed", "-f", str(spec)).returncode == 0
    assert shown(pool, "filed")["spec"]["command"] == ["sleep", "600"]
    scaled = gp(pool, "service", "scale", "filed", "5", "--reason", "a test")
    assert scaled.returncode == 0 and scaled.stdout.strip() == "filed desired=2 version=2", scaled.stdout
    stale = gp(pool, "service", "scale", "filed", "0", "--expected-version", "1")
    assert stale.returncode == 2 and "is at version 2, not 1" in stale.stderr, stale.stderr
    assert gp(pool, "service", "scale", "filed", "0", "--expected-version", "2").returncode == 0
    bounds = gp(pool, "service", "update", "filed", "--max", "3")
    assert bounds.returncode == 0 and "generation=1" in bounds.stdout, bounds.stdout
    rolled = gp(pool, "service", "update", "filed", "--env", "MODEL=v2")
    assert rolled.returncode == 0 and "generation=2" in rolled.stdout, rolled.stdout
    assert any(e["message"] == "scaled 0 → 2: a test" for e in shown(pool, "filed")["events"])
    assert gp(pool, "service", "delete", "filed").returncode == 0
