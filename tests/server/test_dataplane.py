"""The data plane, with real HAProxy and with the in-process router: the same answers both ways.

Each router is started once per module on loopback; each test routes a service of its own, so the
tests do not see each other's replicas. The HAProxy cases skip when haproxy is not installed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from dataplane_replicas import bearer, digest, get, replicas

from gpupool.server.dataplane import plane as plane_module
from gpupool.server.dataplane.haproxy import find_haproxy
from gpupool.server.dataplane.haproxy_log import LatencyLog
from gpupool.server.dataplane.model import Backend, Probe, Route, ServiceTraffic
from gpupool.server.dataplane.plane import DataPlane, RouterKind
from ports import free_port

HAPROXY = find_haproxy()
TOKENS = {digest("gp_alice"): "alice", digest("gp_bob"): "bob"}
PROBE = Probe(path="/ready", interval_s=0.5, success_threshold=1, failure_threshold=2)

KINDS = [
    pytest.param(RouterKind.HAPROXY, marks=pytest.mark.skipif(
        HAPROXY is None, reason="haproxy is not installed (scripts/install-test-deps.sh installs it)")),
    pytest.param(RouterKind.IN_PROCESS),
]


class Plane:
    """A started data plane, the cold starts it reported, and a way to route one service."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.port = plane.port
        self.routes: dict[str, Route] = {}
        self.cold_starts: list[tuple[str, float]] = []

    def route(self, route: Route) -> None:
        self.routes[route.service] = route
        self.plane.set_routes(list(self.routes.values()))


@pytest.fixture(scope="module", params=KINDS)
def plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    kind: RouterKind = request.param
    directory = tmp_path_factory.mktemp(f"dp-{kind}") / "dataplane"
    holder: list[Plane] = []
    dp = DataPlane(directory, "127.0.0.1", free_port(), cold_start_limit_s=20.0,
                   haproxy=HAPROXY if kind is RouterKind.HAPROXY else None,
                   on_cold_start=lambda service, s: holder[0].cold_starts.append((service, s)))
    assert dp.kind is kind
    wrapped = Plane(dp)
    holder.append(wrapped)
    dp.start()
    dp.set_tokens(dict(TOKENS))
    try:
        yield wrapped
    finally:
        dp.stop()


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_requests_reach_a_ready_replica_with_the_service_prefix_stripped(plane: Plane) -> None:
    plane.route(Route("alice/echo", "alice", probe=PROBE))
    with replicas("a") as (a,):
        plane.plane.set_backends("alice/echo", [Backend("echo-0", "127.0.0.1", a.port)])
        r = get(plane.port, "/s/alice/echo/v1/predict?x=1&y=2", "gp_alice")
        assert (r.status_code, r.text.split()[:2]) == (200, ["a", "/v1/predict?x=1&y=2"])
        assert get(plane.port, "/s/alice/echo", "gp_alice").text.split()[:2] == ["a", "/"]


def test_least_outstanding_requests_balances_away_from_a_busy_replica(plane: Plane) -> None:
    plane.route(Route("alice/lb", "alice", probe=PROBE))
    with replicas("a", "b") as (a, b):
        plane.plane.set_backends("alice/lb", [Backend("lb-0", "127.0.0.1", a.port),
                                        Backend("lb-1", "127.0.0.1", b.port)])
        a.release.clear()
        b.release.clear()
        slow = threading.Thread(target=get, args=(plane.port, "/s/alice/lb/slow", "gp_alice"))
        slow.start()
        wait_for("the slow request to reach a replica", lambda: "/slow" in a.seen + b.seen)
        busy, idle = (a, b) if "/slow" in a.seen else (b, a)
        answered = [get(plane.port, f"/s/alice/lb/n{i}", "gp_alice").text.split()[0] for i in range(6)]
        assert answered == [idle.name] * 6
        a.release.set()
        b.release.set()
        slow.join()
        assert busy.seen == ["/slow"]


def test_a_tenants_service_answers_only_that_tenants_tokens(plane: Plane) -> None:
    plane.route(Route("alice/private", "alice", probe=PROBE))
    plane.route(Route("bob/private", "bob", probe=PROBE))  # the same name in another tenant
    with replicas("a", "b") as (a, b):
        plane.plane.set_backends("alice/private", [Backend("p-0", "127.0.0.1", a.port)])
        plane.plane.set_backends("bob/private", [Backend("p-1", "127.0.0.1", b.port)])
        assert get(plane.port, "/s/bob/private/", "gp_bob").text.startswith("b /")
        assert get(plane.port, "/s/bob/private/", "gp_alice").status_code == 403
        assert get(plane.port, "/s/alice/private/", "gp_alice").status_code == 200
        other = get(plane.port, "/s/alice/private/", "gp_bob")
        assert other.status_code == 403 and "belongs to another tenant" in other.text
        anonymous = get(plane.port, "/s/alice/private/")
        assert anonymous.status_code == 401 and "bearer token" in anonymous.text
        assert anonymous.headers["www-authenticate"] == "Bearer"
        assert get(plane.port, "/s/alice/private/", "gp_forged").status_code == 401
        plane.plane.set_tokens({k: v for k, v in TOKENS.items() if v != "alice"})  # alice's token revoked
        try:
            revoked = get(plane.port, "/s/alice/private/", "gp_alice")
            assert revoked.status_code == 401 and "neither revoked nor expired" in revoked.text
        finally:
            plane.plane.set_tokens(dict(TOKENS))
        assert get(plane.port, "/s/alice/private/", "gp_alice").status_code == 200
        assert a.seen == ["/", "/"]  # no refused request reached the replica


def test_a_public_service_answers_anyone_and_never_sees_the_callers_pool_token(plane: Plane) -> None:
    plane.route(Route("alice/open", "alice", public=True, probe=PROBE))
    with replicas("a") as (a,):
        plane.plane.set_backends("alice/open", [Backend("o-0", "127.0.0.1", a.port)])
        assert get(plane.port, "/s/alice/open/x").status_code == 200
        # the owner's code must not harvest another tenant's pool token from its callers
        r = get(plane.port, "/s/alice/open/x", "gp_bob")
        assert r.status_code == 200 and r.text == "a /x -"
        own = httpx.get(f"http://127.0.0.1:{plane.port}/s/alice/open/x", headers=bearer("app-key-123"),
                        timeout=10)
        assert own.text == "a /x Bearer app-key-123"  # the service's own scheme passes through
        plane.route(Route("alice/open", "alice", public=False, probe=PROBE))
        assert get(plane.port, "/s/alice/open/x", "gp_bob").status_code == 403


def test_unknown_services_and_other_paths_get_a_sentence(plane: Plane) -> None:
    r = get(plane.port, "/s/alice/nothing-here/", "gp_alice")
    assert r.status_code == 404 and "no service 'alice/nothing-here'" in r.text
    assert get(plane.port, "/s/echo/", "gp_alice").status_code == 404  # the tenant is part of the URL
    r = get(plane.port, "/api/v1/pool")
    assert r.status_code == 404 and "/s/<tenant>/<service>/<path>" in r.text


def test_requests_are_held_across_a_scale_from_zero_and_none_is_dropped(plane: Plane) -> None:
    plane.route(Route("alice/cold", "alice", probe=PROBE))
    answers: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda i=i: answers.append(
        get(plane.port, f"/s/alice/cold/q{i}", "gp_alice", timeout_s=30))) for i in range(8)]
    for t in threads:
        t.start()
    # held by the activator (HAProxy's backup server) or the in-process router: the one that waits
    holder = plane.plane.proxy
    wait_for("8 held requests",
             lambda: "alice/cold" in holder.traffic() and holder.traffic()["alice/cold"].in_flight == 8)
    assert plane.plane.traffic()["alice/cold"].in_flight == 8  # the router counts them for the autoscaler
    with replicas("a") as (a,):
        plane.plane.set_backends("alice/cold", [Backend("c-0", "127.0.0.1", a.port)])
        for t in threads:
            t.join()
    assert sorted(r.status_code for r in answers) == [200] * 8
    assert sorted(a.seen) == sorted(f"/q{i}" for i in range(8))
    assert [s for s, _ in plane.cold_starts if s == "alice/cold"] == ["alice/cold"]
    assert plane.plane.traffic()["alice/cold"].cold_starts == 1


def test_a_request_held_past_the_cold_start_limit_gets_503_and_retry_after(plane: Plane) -> None:
    plane.route(Route("alice/never", "alice", probe=PROBE, cold_start_limit_s=0.5))
    r = get(plane.port, "/s/alice/never/", "gp_alice")
    assert r.status_code == 503
    assert "within the 0.5 s cold-start limit" in r.text
    assert int(r.headers["retry-after"]) > 0


def test_the_router_files_are_the_pools_alone(plane: Plane) -> None:
    directory: Path = plane.plane.directory
    assert directory.stat().st_mode & 0o777 == 0o700
    for path in directory.iterdir():
        if path.is_socket() or path.is_file():
            assert path.stat().st_mode & 0o077 == 0, path


def test_the_start_note_says_which_router_serves(plane: Plane) -> None:
    if plane.plane.kind is RouterKind.HAPROXY:
        assert plane.plane.note.startswith("services are served by HAProxy")
        assert plane.plane.router == "haproxy"
    else:  # asked for (haproxy=None): not said to be missing when it may well be installed
        assert plane.plane.note.startswith("services are served by the in-process router (--serve-router "
                                           "in-process)")
        assert plane.plane.router == "in-process (--serve-router in-process)"


def test_a_pool_without_haproxy_says_so_in_its_router(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plane_module, "find_haproxy", lambda: None)  # a machine without the package
    fallen_back = DataPlane(tmp_path / "dataplane", "127.0.0.1", free_port(), haproxy="")
    assert fallen_back.kind is RouterKind.IN_PROCESS
    assert fallen_back.router == "in-process (haproxy not installed)"
    assert fallen_back.note.startswith("HAProxy is not installed: services are served by the in-process")


def test_each_router_gives_per_request_latency_quantiles(plane: Plane) -> None:
    """The in-process router times each request; HAProxy's request log (haproxy_log.py) gives the
    same p50/p99, not only `show stat`'s mean."""
    plane.route(Route("alice/timed", "alice", probe=PROBE))
    with replicas("t") as (t,):
        plane.plane.set_backends("alice/timed", [Backend("timed-0", "127.0.0.1", t.port)])
        wait_for("the replica routed",
                 lambda: get(plane.port, "/s/alice/timed/", "gp_alice").status_code == 200)
        for _ in range(20):
            assert get(plane.port, "/s/alice/timed/x", "gp_alice").status_code == 200

        def seen() -> ServiceTraffic | None:
            return plane.plane.traffic().get("alice/timed")

        wait_for("latency quantiles", lambda: (s := seen()) is not None and s.latency_p99_ms is not None)
        timed = seen()
        assert timed is not None and timed.latency_p50_ms is not None and timed.latency_p99_ms is not None
        assert 0 <= timed.latency_p50_ms <= timed.latency_p99_ms < 10_000


def test_the_latency_log_keeps_routed_backends_answered_requests_only(tmp_path: Path) -> None:
    latency = LatencyLog(tmp_path / "latency.sock", lambda backend: backend == "svc_alice.web")
    for line in (b"svc_alice.web 4 200", b"svc_alice.web 9 200", b"serve 1 401", b"svc_bob.x 7 200",
                 b"svc_alice.web -1 -1", b"svc_alice.web x 200", b"garbage"):
        latency.take(line)
    assert latency.quantiles("svc_alice.web") == (9.0, 9.0)  # the samples 4 and 9: rank 0.5 is 9
    assert latency.quantiles("svc_bob.x") == (None, None)
    for _ in range(5000):
        latency.take(b"svc_alice.web 1 200")
    assert latency.quantiles("svc_alice.web") == (1.0, 1.0)  # bounded: the old samples are gone


def test_a_body_past_the_routers_limit_is_refused_not_held(plane: Plane) -> None:
    """The router holds a request's body in the server's memory while it waits for a replica (the
    activator does, behind HAProxy, when none is ready): past its limit the request is refused."""
    from gpupool.server.dataplane.proxy import MAX_BODY_BYTES

    plane.route(Route("alice/big", "alice", public=True, probe=PROBE, cold_start_limit_s=2.0))
    chunk = b"x" * 2**20

    def body() -> Iterator[bytes]:
        for _ in range(MAX_BODY_BYTES // len(chunk) + 4):
            yield chunk

    answer = httpx.post(f"http://127.0.0.1:{plane.port}/s/alice/big/x", content=body(), timeout=30)
    assert answer.status_code == 413 and "at most 64 MiB" in answer.text, answer.text


def test_a_probe_path_cannot_write_the_routers_configuration(tmp_path: Path) -> None:
    """A quote in one service's probe path made HAProxy refuse the whole file: no service's routes
    changed again, and revoked tokens kept working. The API refuses it; one stored before is checked
    by a connect instead, and the file stays valid."""
    import subprocess

    import pydantic

    from gpupool.api.services import ProbeSpec
    from gpupool.server.dataplane.haproxy_config import HAProxyPaths, render, render_maps

    for path in ('/"', "/'", "/\\", "/a b"):
        with pytest.raises(pydantic.ValidationError):
            ProbeSpec(path=path)
    assert ProbeSpec(path="/v1/health?x=1&y=[2]").path == "/v1/health?x=1&y=[2]"
    routes = [Route("alice/quoted", "alice", probe=Probe(path='/"')), Route("alice/ok", "alice", probe=PROBE)]
    text = render(HAProxyPaths(tmp_path), "127.0.0.1", free_port(), routes, {}, 20.0)
    assert 'GET /"' not in text and "option httpchk GET /ready" in text
    if HAPROXY is not None:
        paths = HAProxyPaths(tmp_path)
        for attr, content in render_maps(routes, {}).items():
            getattr(paths, attr).write_text(content)
        config = tmp_path / "haproxy.cfg"
        config.write_text(text)
        checked = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True,
                                 check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_routes_whose_reload_failed_are_applied_at_the_next_call(plane: Plane,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload that failed used to count as applied (its routes were recorded first), so the same
    routes were never tried again and the new service stayed unrouted."""
    supervisor = plane.plane.haproxy
    if supervisor is None:
        pytest.skip("the in-process router reloads nothing")
    real = supervisor._reload
    calls: list[int] = []

    def failing_once() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("haproxy did not reload within 10 s")
        real()

    monkeypatch.setattr(supervisor, "_reload", failing_once)
    routes = [*plane.routes.values(), Route("alice/late", "alice", probe=PROBE)]
    with pytest.raises(OSError):
        plane.plane.set_routes(routes)
    plane.plane.set_routes(routes)  # the same routes again: tried, not taken as done
    plane.routes["alice/late"] = routes[-1]
    assert len(calls) == 2
    with replicas("a") as (a,):
        plane.plane.set_backends("alice/late", [Backend("l-0", "127.0.0.1", a.port)])
        wait_for("the late service routed",
                 lambda: get(plane.port, "/s/alice/late/", "gp_alice").status_code == 200)
