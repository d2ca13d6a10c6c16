"""Two real `gpupool up --ha --serve-port` servers on one PostgreSQL: requests sent to the follower's
router scale the service, because the follower writes its router's numbers to the store and the
leader's autoscaler adds them to its own router's (server/dataplane/loop.py)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from upproc import UpProcess, until

from cli_inproc import run_cli
from gpupool.server import pgtemp
from ports import free_port, serving_config

pytestmark = pytest.mark.slow
LEASE = {"GPUPOOL_LEASE_S": "30", "GPUPOOL_LEASE_RENEW_S": "0.5"}
"""Nothing here waits for a takeover, so the lease is long: with 3 s, a leader that a loaded machine
held up 2.5 s lost it mid-test, and the server the test had found leading then followed (its
`service show` and the scaling it watches came from the other)."""
POD_NETWORK = "10.251.0.0/16"
"""This file's own pod network: pools on one machine must not share one."""
REPLICA = """
import http.server, os, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith('/slow'):
            time.sleep(60)  # a long inference: held in flight while the test watches the count
        body = b'ok'
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(('0.0.0.0', int(os.environ['PORT'])), H).serve_forever()
"""


def gp(server: UpProcess, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env = {**base, "GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": token or server.token()}
    return run_cli(args, env)


def leader_of(servers: list[tuple[UpProcess, int]]) -> UpProcess | None:
    for server, _ in servers:
        try:
            rows = server.client().get("/servers").json()["servers"]
        except (httpx.TransportError, KeyError):
            continue
        for row in rows:
            if row["leader"]:
                api = int(row["address"].rsplit(":", 1)[1])
                return next(s for s, _ in servers if s.port == api)
    return None


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[UpProcess, int]]]:
    reason = pgtemp.why_unavailable()
    if reason:
        pytest.skip(f"several servers need PostgreSQL: {reason}")
    pg = pgtemp.start(free_port=free_port)
    root = tmp_path_factory.mktemp("hatraffic")
    made: list[tuple[UpProcess, int]] = []
    try:
        env = {"GPUPOOL_DATABASE_URL": pg.create_database(), "GPUPOOL_POD_NETWORK": POD_NETWORK, **LEASE}
        config = root / "pool.yaml"
        config.write_text(serving_config())
        for name in ("a", "b"):  # one data directory: one pool; a router each
            port = free_port()
            args = ["--ha", "--simulate", "1x8xH100", "--serve-port", str(port), "--config", str(config)]
            server = UpProcess(root / "data", args, env=env, log_path=root / f"{name}.log")
            made.append((server.start(), port))
        yield made
    finally:
        for server, _ in made:
            server.stop()
        pg.stop()


def test_requests_sent_to_the_follower_scale_the_service(servers: list[tuple[UpProcess, int]]) -> None:
    until(lambda: leader_of(servers) is not None, 30, "a leader")
    leader = leader_of(servers)
    assert leader is not None
    follower_port = next(p for s, p in servers if s is not leader)
    assert gp(leader, "tenant", "create", "alice").returncode == 0
    created = gp(leader, "token", "create", "--tenant", "alice")
    assert created.returncode == 0, created.stderr
    alice = created.stdout.strip()
    made = gp(leader, "service", "create", "web", "--gpus", "0.25", "--min", "1", "--max", "4",
              "--target-concurrency", "1", "--readiness-http", "/", "--probe-period", "0.2",
              "--", "python3", "-c", REPLICA, token=alice)
    assert made.returncode == 0, made.stderr

    def show() -> dict[str, Any]:
        return dict(json.loads(gp(leader, "service", "show", "web", "--json", token=alice).stdout))

    def routed(path: str, timeout_s: float) -> httpx.Response:
        # trust_env=False: the threads below send these while `gp` runs the CLI in this process, which
        # swaps os.environ for the command's; httpx reading the proxy variables meanwhile met a key
        # gone (KeyError in a thread, once in a whole run). A loopback request needs no proxy.
        return httpx.get(f"http://127.0.0.1:{follower_port}/s/alice/web{path}",
                         headers={"Authorization": f"Bearer {alice}"}, timeout=timeout_s, trust_env=False)

    until(lambda: show()["ready_replicas"] == 1, 90, "a ready replica")
    until(lambda: routed("/", 5).status_code == 200, 60, "the follower's router to reach it")
    assert show()["desired"] == 1

    done: list[int] = []

    def slow() -> None:
        try:
            done.append(routed("/slow", 90).status_code)
        except httpx.HTTPError:
            done.append(0)

    threads = [threading.Thread(target=slow, daemon=True) for _ in range(6)]
    try:
        for t in threads:
            t.start()
        # only the follower's router sees these six: the leader scales on what the follower reports
        until(lambda: show()["desired"] >= 3, 45, "the leader to scale on the follower's traffic")
        messages = [str(e["message"]) for e in show()["events"]]
        scaled = [m for m in messages if m.startswith("scaled 1 → ")]
        assert scaled and "in flight against a target of 1" in scaled[0], messages
        assert leader_of(servers) is leader  # scaled on the follower's report, not by it as leader
    finally:
        assert gp(leader, "service", "delete", "web", token=alice).returncode == 0
        until(lambda: gp(leader, "service", "show", "web", token=alice).returncode == 3, 60,
              "the service gone")
        for t in threads:
            t.join(timeout=90)


def test_each_server_keeps_its_router_in_a_directory_of_its_own(servers: list[tuple[UpProcess, int]]) -> None:
    data = servers[0][0].data_dir
    assert {p.name for p in Path(data).glob("dataplane-*")} == {f"dataplane-{port}" for _, port in servers}
