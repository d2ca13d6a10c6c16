"""The data plane end to end: `gpupool up --simulate --serve-port`, a tenant's service at zero replicas,
a request through the router held while the autoscaler scales it from zero, answered by the new
replica; the scale and the cold start are events and metrics; other tenants' tokens are refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
import pytest

from cli_inproc import run_cli
from ports import free_port, serving_config
from server.upproc import UpProcess, until

pytestmark = pytest.mark.slow
POD_NETWORK = "10.252.0.0/16"
"""This file's own pod network: pools on one machine must not share one."""
REPLICA = """
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ('replica %s %s' % (os.environ['PORT'], self.headers.get('Authorization', '-'))).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(('0.0.0.0', int(os.environ['PORT'])), H).serve_forever()
"""


class Pool:
    def __init__(self, server: UpProcess, serve_port: int) -> None:
        self.server = server
        self.serve_port = serve_port
        self.tokens: dict[str, str] = {}
        self.services: list[str] = []

    def gp(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        env = {**base, "GPUPOOL_URL": self.server.url, "GPUPOOL_TOKEN": token or self.server.token()}
        return run_cli(args, env)

    def routed(self, path: str, token: str | None, timeout_s: float = 90.0) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(f"http://127.0.0.1:{self.serve_port}{path}", headers=headers, timeout=timeout_s)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    serve_port = free_port()
    base = tmp_path_factory.mktemp("dataplane")
    config = base / "pool.yaml"
    config.write_text(serving_config())
    server = UpProcess(base / "data",
                       ["--simulate", "2x2xH100", "--serve-port", str(serve_port),
                        "--serve-cold-start", "90", "--config", str(config)],
                       env={"GPUPOOL_POD_NETWORK": POD_NETWORK}).start()
    made = Pool(server, serve_port)
    try:
        for tenant in ("alice", "bob"):
            assert made.gp("tenant", "create", tenant).returncode == 0
            created = made.gp("token", "create", "--tenant", tenant)
            assert created.returncode == 0, created.stderr
            made.tokens[tenant] = created.stdout.strip()
        yield made
        # a replica outlives its server (as any pod): the services go first, and their replicas with them
        alice = made.tokens["alice"]
        for name in made.services:
            assert made.gp("service", "delete", name, token=alice).returncode == 0
            until(lambda name=name: made.gp("service", "show", name, token=alice).returncode == 3,
                  60, f"service {name} gone")
    finally:
        server.stop()


def _create_web(pool: Pool) -> None:
    """alice/web, at zero replicas, scaled by the requests it is sent."""
    created = pool.gp("service", "create", "web", "--gpus", "0.25", "--min", "0", "--max", "2",
                      "--target-concurrency", "1", "--readiness-http", "/", "--probe-period", "0.2",
                      "--", "python3", "-c", REPLICA, token=pool.tokens["alice"])
    assert created.returncode == 0, created.stderr
    pool.services.append("web")


@pytest.fixture
def web(pool: Pool) -> str:
    """alice/web with a ready replica: the one the first test leaves, or, where that test did not
    run first (a test chosen alone), one made here as it makes it."""
    if "web" not in pool.services:
        _create_web(pool)
    until(lambda: pool.routed("/s/alice/web/", None, timeout_s=5).status_code == 401, 30, "the route")
    answer = pool.routed("/s/alice/web/", pool.tokens["alice"])  # held while it scales from zero
    assert answer.status_code == 200, answer.text
    return "web"


def test_a_request_scales_a_service_from_zero_and_is_answered(pool: Pool) -> None:
    alice = pool.tokens["alice"]
    _create_web(pool)
    shown = json.loads(pool.gp("service", "show", "web", "--json", token=alice).stdout)
    assert shown["replicas"] == []
    url = f"http://127.0.0.1:{pool.serve_port}/s/alice/web/"  # where it answers, as the pool says
    assert shown["url"] == url
    assert f"url: {url}\n" in pool.gp("service", "show", "web", token=alice).stdout
    # routed within a tick of the data plane's loop: then a request without a token is refused with 401
    # (one with alice's token would be held, and count for the autoscaler)
    until(lambda: pool.routed("/s/alice/web/", None, timeout_s=5).status_code == 401, 30, "the route")
    answer = pool.routed("/s/alice/web/v1/hello", alice)
    assert answer.status_code == 200, answer.text
    assert answer.text.startswith("replica ") and answer.text.endswith(" -")  # the pool token stays behind
    events = json.loads(pool.gp("service", "show", "web", "--json", token=alice).stdout)["events"]
    messages = [e["message"] for e in events]
    assert any(m.startswith("scaled 0 → 1: ") and "against a target of 1" in m for m in messages), messages
    until(lambda: any(e["reason"] == "cold_start" for e in json.loads(
        pool.gp("service", "show", "web", "--json", token=alice).stdout)["events"]), 10, "a cold start event")
    admin = {"Authorization": f"Bearer {pool.server.token()}"}
    # /metrics reads the data plane's last tick: a cold start after that tick's sample (its event is
    # written by the same tick) shows from the next one
    until(lambda: 'gpupool_service_cold_starts_total{service="alice/web"} 1.0' in httpx.get(
        f"{pool.server.url}/metrics", headers=admin, timeout=10).text, 10, "the cold start counted")
    assert pool.routed("/s/alice/web/", pool.tokens["bob"], timeout_s=10).status_code == 403
    assert pool.routed("/s/alice/web/", None, timeout_s=10).status_code == 401


def test_the_router_follows_a_revoked_token(pool: Pool, web: str) -> None:
    """With a ready replica of alice/web: a held request would hide the difference between a token
    the router knows and one it does not."""
    created = pool.gp("token", "create", "--tenant", "alice", "--name", "short-lived")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    until(lambda: pool.routed("/s/alice/web/", token, timeout_s=10).status_code == 200, 30,
          "the new token known to the router")
    assert pool.gp("token", "revoke", "short-lived", "--tenant", "alice").returncode == 0
    until(lambda: pool.routed("/s/alice/web/", token, timeout_s=10).status_code == 401, 10,
          "the revoked token refused by the router")
    assert pool.routed("/s/alice/web/", pool.tokens["alice"], timeout_s=10).status_code == 200


def test_the_service_page_reads_the_routers_live_numbers(pool: Pool, web: str) -> None:
    alice = {"Authorization": f"Bearer {pool.tokens['alice']}"}
    for _ in range(5):
        assert pool.routed("/s/alice/web/", pool.tokens["alice"], timeout_s=10).status_code == 200

    def live() -> dict | None:  # type: ignore[type-arg]
        answer = httpx.get(f"{pool.server.api}/services/web", headers=alice, timeout=10)
        assert answer.status_code == 200, answer.text
        return answer.json()["live"]  # type: ignore[no-any-return]

    until(lambda: live() is not None, 10, "the router's numbers on the service")
    page = httpx.get(f"{pool.server.api}/services/web/history", headers=alice, timeout=10).json()
    assert page["router"] in ("haproxy", "in-process") and page["live"] is not None
    # both routers time every request (HAProxy through its request log): quantiles
    until(lambda: httpx.get(f"{pool.server.api}/services/web/history", headers=alice, timeout=10)
          .json()["live"]["latency_p50_ms"] is not None, 10, "per-request latency")
    page = httpx.get(f"{pool.server.api}/services/web/history", headers=alice, timeout=10).json()
    assert page["latency"] == "quantiles" and page["live"]["latency_p99_ms"] is not None
    if page["router"] == "haproxy":  # and show stat's mean beside them
        assert page["live"]["latency_mean_ms"] is not None
    listed = httpx.get(f"{pool.server.api}/services", headers=alice, timeout=10).json()
    assert [s["live"] is not None for s in listed if s["name"] == "web"] == [True]


def test_events_services_follows_a_scale_and_shows_the_tenants_own_only(pool: Pool, web: str) -> None:
    """`gpupool events --services -f` as alice: her scale appears as it is stored; bob's never."""
    alice, bob = pool.tokens["alice"], pool.tokens["bob"]
    assert pool.gp("service", "create", "bobs", "--gpus", "0.25", "--min", "0", "--max", "1", "--",
                   "sleep", "600", token=bob).returncode == 0
    stored = pool.gp("events", "--services", "-o", "json", token=alice)
    assert stored.returncode == 0, stored.stderr
    seen = [json.loads(line) for line in stored.stdout.splitlines()]
    assert seen and {e["service"] for e in seen} == {"web"}  # bob's service is not hers to see
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env = {**base, "GPUPOOL_URL": pool.server.url, "GPUPOOL_TOKEN": alice}
    follower = subprocess.Popen(  # from the last stored event on: nothing stored after it is missed
        [sys.executable, "-m", "gpupool.cli.main", "events", "--services", "-f",
         "--after", str(seen[-1]["id"])],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    watchdog = threading.Timer(60, follower.kill)  # a missing event fails the test, never hangs it
    watchdog.start()
    try:
        assert pool.gp("service", "scale", "bobs", "1", "--reason", "bob's own", token=bob).returncode == 0
        assert pool.gp("service", "scale", "web", "2", "--reason", "followed", token=alice).returncode == 0
        assert follower.stdout is not None
        lines = []
        for line in follower.stdout:
            lines.append(line)
            if "followed" in line:
                break
        assert lines and "followed" in lines[-1] and "scaled" in lines[-1], lines
        assert all("alice/web" in line for line in lines), lines  # the autoscaler's own, never bob's
    finally:
        watchdog.cancel()
        follower.terminate()
        follower.wait(timeout=30)
        assert pool.gp("service", "delete", "bobs", token=bob).returncode == 0
        until(lambda: pool.gp("service", "show", "bobs", token=bob).returncode == 3, 60, "bobs gone")


def test_node_ls_and_the_pool_summary_say_which_router_serves(pool: Pool) -> None:
    summary = httpx.get(f"{pool.server.api}/pool", headers={"Authorization": f"Bearer {pool.tokens['bob']}"},
                        timeout=10).json()
    want = "haproxy" if shutil.which("haproxy") or os.access("/usr/sbin/haproxy", os.X_OK) else \
        "in-process (haproxy not installed)"
    assert summary["router"] == want
    listed = pool.gp("node", "ls")
    assert listed.returncode == 0 and f"services: routed by {want}" in listed.stdout, listed.stderr
    assert "services:" not in pool.gp("node", "ls", "-o", "json").stdout  # machine output stays JSON
