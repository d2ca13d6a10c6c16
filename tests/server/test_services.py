"""Inference services through the API on a test provider: replicas as workloads with their $PORT,
probes against real HTTP listeners on those ports, replacement, scaling by compare-and-set, rolling
updates within their bounds, bad input, and one tenant against another's service."""

from __future__ import annotations

import http.server
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import ManualProvider
from sqlalchemy import select

from conftest import Server, start_server, stop_server
from factories import node
from gpupool.core.autoscale import decide
from gpupool.server.dataplane import loop as loop_module
from gpupool.server.dataplane.loop import DataPlaneLoop
from gpupool.server.dataplane.model import ServiceTraffic
from gpupool.server.leader import Leadership
from gpupool.server.orm import ServiceReplicaRow, ServiceRow, WorkloadRow
from gpupool.server.serving.endpoints import ready_endpoints

API = "/api/v1"
FINAL = ("succeeded", "failed", "cancelled")


class Replica:
    """An HTTP listener on a replica's port: /healthz answers `code`."""

    def __init__(self, port: int) -> None:
        self.code = 200
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(outer.code)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    provider = ManualProvider([node("n0", devices=2, model="H100"), node("n1", devices=2, model="H100")])
    server = start_server(Path(tmp_path_factory.mktemp("services")), provider=provider)
    client, admin = server.client, server.headers()
    for tenant in ("alpha", "beta"):
        assert client.post(f"{API}/tenants", json={"name": tenant}, headers=admin).status_code == 201
    yield server
    stop_server(server)


@pytest.fixture
def listeners() -> Iterator[dict[int, Replica]]:
    opened: dict[int, Replica] = {}
    yield opened
    for replica in opened.values():
        replica.close()


def token(pool: Server, tenant: str) -> dict[str, str]:
    answer = pool.client.post(f"{API}/tokens", json={"tenant": tenant, "name": f"t-{len(tenant)}"},
                              headers=pool.headers())
    assert answer.status_code == 201, answer.text
    return pool.headers(answer.json()["token"])


def show(pool: Server, name: str, tenant: str = "alpha") -> dict:  # type: ignore[type-arg]
    answer = pool.client.get(f"{API}/services/{name}", params={"tenant": tenant}, headers=pool.headers())
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def ports_launched(pool: Server, name: str) -> dict[str, int]:
    """workload id -> $PORT of each replica pod the provider was asked to run (and still runs)."""
    running = set(pool.provider.running())
    with pool.rt.store.read() as session:
        ours = set(session.scalars(select(ServiceReplicaRow.workload_id).join(
            ServiceRow, ServiceRow.id == ServiceReplicaRow.service_id).where(ServiceRow.name == name)))
    return {p.workload_id: int(p.env["PORT"]) for pid, p in list(pool.provider.launched.items())
            if pid in running and p.workload_id in ours}


def serve_all(pool: Server, name: str, listeners: dict[int, Replica], want: int) -> None:
    """Open a listener on every running replica's port until `want` replicas run."""
    def opened() -> bool:
        # one read for both: a replica launched between two reads was counted but never served
        ports = ports_launched(pool, name).values()
        for port in ports:
            if port not in listeners:
                listeners[port] = Replica(port)
        return len(ports) >= want
    pool.wait_for(opened, timeout_s=20)


def wait_until(pool: Server, check: Callable[[], bool]) -> None:
    pool.wait_for(check, timeout_s=20)


def create(pool: Server, body: dict[str, object]) -> dict:  # type: ignore[type-arg]
    answer = pool.client.post(f"{API}/services", json={"tenant": "alpha", **body}, headers=pool.headers())
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def delete(pool: Server, name: str) -> None:
    answer = pool.client.delete(f"{API}/services/{name}", params={"tenant": "alpha"}, headers=pool.headers())
    assert answer.status_code == 200, answer.text


def test_replicas_get_ports_and_become_ready_endpoints(pool: Server, listeners: dict[int, Replica]) -> None:
    created = create(pool, {"name": "web", "command": ["serve"], "min_replicas": 2, "max_replicas": 4,
                            "resources": {"gpus": 0.25},
                            "readiness": {"path": "/healthz", "period_s": 1.5, "timeout_s": 1.5}})
    # 1.5 s a probe (as the liveness test below): a 0.2 s timeout could mark a healthy replica
    # not ready on a loaded machine between the wait for "ready" and the reads that follow it.
    assert created["state"] == "pending" and created["desired"] == 2
    serve_all(pool, "web", listeners, 2)
    wait_until(pool, lambda: show(pool, "web")["state"] == "ready")
    service = show(pool, "web")
    ports = ports_launched(pool, "web")
    assert len(set(ports.values())) == 2  # each replica its own port
    with pool.rt.store.read() as session:
        endpoints = ready_endpoints(session, service["id"])
    assert sorted((e.workload_id, e.host, e.port) for e in endpoints) == sorted(
        (wid, "127.0.0.1", port) for wid, port in ports.items())
    assert {r["ready"] for r in service["replicas"]} == {"ready"}
    assert sorted(r["node"] for r in service["replicas"]) == ["n0", "n1"]  # spread, though first-fit
    metrics = pool.client.get("/metrics", headers=pool.headers()).text
    assert 'gpupool_service_replicas{service="alpha/web",state="ready"} 2.0' in metrics
    assert 'gpupool_service_desired_replicas{service="alpha/web"} 2.0' in metrics
    usage = pool.client.get(f"{API}/usage", params={"by": "service,priority_class", "tenant": "alpha"},
                            headers=pool.headers()).json()
    web = [r for r in usage["rows"] if r["service"] == "web"]
    assert [(r["priority_class"], r["pods"]) for r in web] == [("serving", 2)], usage["rows"]
    assert web[0]["device_hours"] > 0
    delete(pool, "web")
    wait_until(pool, lambda: not ports_launched(pool, "web"))


def test_a_probe_that_never_passes_degrades_the_service_with_its_error(
        pool: Server, listeners: dict[int, Replica]) -> None:
    create(pool, {"name": "sick", "command": ["serve"], "resources": {"gpus": 0.25},
                  "readiness": {"path": "/healthz", "period_s": 1.5, "timeout_s": 1.5,
                                "failure_threshold": 2}})
    # a 503 fails a probe at once whatever its timeout; the 1.5 s is for the healthy answers after
    serve_all(pool, "sick", listeners, 1)
    # ready first: probes refused before the listener opened must not be what degrades it
    wait_until(pool, lambda: show(pool, "sick")["state"] == "ready")
    for replica in listeners.values():
        replica.code = 503
    wait_until(pool, lambda: show(pool, "sick")["state"] == "degraded")
    service = show(pool, "sick")
    assert "GET /healthz on 127.0.0.1:" in service["last_probe_error"]
    assert "answered 503" in service["last_probe_error"]
    assert any(e["reason"] == "degraded" for e in service["events"])
    for replica in listeners.values():
        replica.code = 200
    wait_until(pool, lambda: show(pool, "sick")["state"] == "ready")
    delete(pool, "sick")


def test_an_ended_replica_is_replaced(pool: Server, listeners: dict[int, Replica]) -> None:
    create(pool, {"name": "phoenix", "command": ["serve"], "resources": {"gpus": 0.25}})
    serve_all(pool, "phoenix", listeners, 1)
    wait_until(pool, lambda: show(pool, "phoenix")["state"] == "ready")
    first = show(pool, "phoenix")["replicas"][0]["workload_id"]
    pod = next(pid for pid, p in pool.provider.launched.items() if p.workload_id == first)
    pool.provider.finish(pod, exit_code=137)  # its process was killed
    wait_until(pool, lambda: [r["workload_id"] for r in show(pool, "phoenix")["replicas"]]
               not in ([], [first]))
    serve_all(pool, "phoenix", listeners, 1)
    wait_until(pool, lambda: show(pool, "phoenix")["state"] == "ready")
    service = show(pool, "phoenix")
    assert [r["workload_id"] for r in service["replicas"]] != [first]
    assert any(e["reason"] == "replica_replaced" and first in e["message"] for e in service["events"])
    delete(pool, "phoenix")


def test_scale_is_a_compare_and_set_and_clamps(pool: Server) -> None:
    created = create(pool, {"name": "elastic", "command": ["serve"], "min_replicas": 0, "max_replicas": 3,
                            "replicas": 0, "resources": {"gpus": 0.25}})
    client, admin = pool.client, pool.headers()
    url = f"{API}/services/elastic/scale"
    version = created["version"]
    first = client.post(url, params={"tenant": "alpha"}, headers=admin,
                        json={"replicas": 9, "expected_version": version, "reason": "load step"})
    assert first.status_code == 200, first.text
    assert first.json()["desired"] == 3  # clamped to max_replicas
    late = client.post(url, params={"tenant": "alpha"}, headers=admin,
                       json={"replicas": 1, "expected_version": version})
    assert late.status_code == 409, late.text
    assert f"not {version}" in late.json()["message"]
    assert show(pool, "elastic")["desired"] == 3
    assert any(e["message"] == "scaled 0 → 3: load step" for e in show(pool, "elastic")["events"])
    delete(pool, "elastic")


def test_bad_input_says_what_was_wrong(pool: Server) -> None:
    client, admin = pool.client, pool.headers()
    cases = [({"min_replicas": 3, "max_replicas": 2}, "min_replicas (3) is above max_replicas (2)"),
             ({"target_concurrency": 0}, "a target per replica must be at least 0.001"),
             ({"resources": {"gpus": 64}}, ""),
             ({"priority_class": "hihg"}, "Unknown priority class 'hihg'")]
    for extra, words in cases:
        answer = client.post(f"{API}/services", headers=admin,
                             json={"tenant": "alpha", "name": "bad", "command": ["x"], **extra})
        assert answer.status_code == 422, answer.text
        assert set(answer.json()) == {"code", "message", "details"}
        assert words in answer.json()["message"], answer.text
    missing = client.get(f"{API}/services/nope", params={"tenant": "alpha"}, headers=admin)
    assert missing.status_code == 404 and "gpupool service ls" in missing.json()["message"]
    create(pool, {"name": "kept", "command": ["serve"], "min_replicas": 0, "max_replicas": 2, "replicas": 0})
    for changes, words in (({"min_replicas": 3}, "min_replicas (3) is above max_replicas (2)"),
                           ({"name": "other"}, "cannot change name of a service"),
                           ({"command": [""]}, "its first word is empty")):
        answer = client.patch(f"{API}/services/kept", params={"tenant": "alpha"}, headers=admin,
                              json={"changes": changes})
        assert answer.status_code == 422 and words in answer.json()["message"], answer.text
    assert show(pool, "kept")["version"] == 1  # nothing of the refused updates was stored
    delete(pool, "kept")


def test_a_tenant_cannot_see_scale_or_delete_another_tenants_service(pool: Server) -> None:
    create(pool, {"name": "private", "command": ["serve"], "min_replicas": 0, "replicas": 0})
    beta = token(pool, "beta")
    client = pool.client
    assert client.get(f"{API}/services", headers=beta).json() == []
    for method, path, body in (("GET", "/services/private", None),
                               ("POST", "/services/private/scale", {"replicas": 1}),
                               ("PATCH", "/services/private", {"changes": {"max_replicas": 5}}),
                               ("DELETE", "/services/private", None)):
        answer = client.request(method, API + path, json=body, headers=beta, params={"tenant": "alpha"})
        assert answer.status_code == 404, (method, path, answer.text)
    stolen = client.post(f"{API}/services", headers=beta,
                         json={"tenant": "alpha", "name": "private2", "command": ["x"]})
    assert stolen.status_code == 403
    service = show(pool, "private")
    assert (service["desired"], service["max_replicas"], service["version"]) == (0, 1, 1)
    delete(pool, "private")


def test_an_update_rolls_the_replicas_within_surge_and_unavailable(
        pool: Server, listeners: dict[int, Replica]) -> None:
    """Every read of the store during the rollout: at most desired + max_surge replicas exist, and
    at least desired - max_unavailable serve."""
    create(pool, {"name": "rolling", "command": ["serve"], "min_replicas": 3, "max_replicas": 3,
                  "resources": {"gpus": 0.25}, "rollout": {"max_surge": 1, "max_unavailable": 0},
                  "readiness": {"period_s": 1.5, "timeout_s": 1.5}})
    # a probe timing out on a loaded machine would take a healthy replica out of the serving count
    # that the rollout's bound is checked on: 1.5 s a probe, as the liveness test below
    serve_all(pool, "rolling", listeners, 3)
    wait_until(pool, lambda: show(pool, "rolling")["state"] == "ready")
    service_id = show(pool, "rolling")["id"]
    answer = pool.client.patch(f"{API}/services/rolling", params={"tenant": "alpha"}, headers=pool.headers(),
                               json={"changes": {"env": {"MODEL": "v2"}}})
    assert answer.status_code == 200, answer.text
    assert answer.json()["generation"] == 2
    seen: list[tuple[int, int]] = []

    def rolled() -> bool:
        for port in ports_launched(pool, "rolling").values():
            if port not in listeners:
                listeners[port] = Replica(port)
        with pool.rt.store.read() as session:
            rows = session.execute(select(ServiceReplicaRow.generation, ServiceReplicaRow.ready,
                                          WorkloadRow.status)
                                   .join(WorkloadRow, WorkloadRow.id == ServiceReplicaRow.workload_id)
                                   .where(ServiceReplicaRow.service_id == service_id,
                                          WorkloadRow.status.not_in(FINAL))).all()
        serving = [g for g, ready, status in rows if ready == "ready" and status == "running"]
        seen.append((len(rows), len(serving)))
        return serving == [2, 2, 2] and len(rows) == 3

    wait_until(pool, rolled)
    assert max(total for total, _ in seen) <= 4, seen
    assert min(serving for _, serving in seen) >= 3, seen
    assert any(total == 4 for total, _ in seen), seen  # the surge was used
    events = [e["message"] for e in show(pool, "rolling")["events"]]
    assert sum("replaced by generation 2" in m for m in events) == 3, events
    launched = [p for p in pool.provider.launched.values() if p.env.get("MODEL") == "v2"]
    assert len(launched) == 3
    delete(pool, "rolling")


def test_a_replica_that_cannot_fit_preempts_batch_and_batch_never_preempts_it(tmp_path: Path) -> None:
    """One device: batch holds it; the service's replica preempts it (serving outranks normal), and
    batch submitted afterwards, even at class high, waits instead of preempting the replica."""
    provider = ManualProvider([node("n0", devices=1, model="H100")])
    server = start_server(tmp_path, provider=provider)
    try:
        client, admin = server.client, server.headers()
        batch = client.post(f"{API}/workloads", headers=admin,
                            json={"command": ["train"], "resources": {"gpus": 1}}).json()["id"]
        server.wait_for(lambda: server.status(batch) == "running")
        answer = client.post(f"{API}/services", headers=admin,
                             json={"name": "infer", "command": ["serve"], "resources": {"gpus": 1}})
        assert answer.status_code == 201, answer.text

        def replica_running() -> bool:
            replicas = client.get(f"{API}/services/infer", headers=admin).json()["replicas"]
            return [r["status"] for r in replicas] == ["running"]

        server.wait_for(replica_running)
        assert server.status(batch) == "pending"
        reasons = [e["reason"] for e in client.get(f"{API}/workloads/{batch}/events", headers=admin).json()]
        assert "preempted" in reasons, reasons
        late = client.post(f"{API}/workloads", headers=admin, json={
            "command": ["train"], "resources": {"gpus": 1}, "priority_class": "high"}).json()["id"]

        def considered() -> bool:  # a cycle placed it nowhere and said why
            row = client.get(f"{API}/workloads/{late}", headers=admin).json()
            return bool(row["status"] == "pending" and row["reason"] not in ("", "submitted"))

        server.wait_for(considered)
        replica = client.get(f"{API}/services/infer", headers=admin).json()["replicas"][0]
        assert replica["status"] == "running"
        assert server.status(batch) == "pending"
        client.delete(f"{API}/services/infer", headers=admin)
        server.wait_for(lambda: "running" in (server.status(batch), server.status(late)))  # batch backfills
    finally:
        stop_server(server)


def test_headroom_keeps_room_for_a_replica_free_of_new_batch(tmp_path: Path) -> None:
    """serving.headroom_replicas: 1 with a one-device service (no replica yet): of two one-device
    batch workloads on two devices one runs, the other waits with serving_headroom; the replica the
    service then asks for starts at once, without a preemption."""
    from fastapi.testclient import TestClient

    from gpupool.config import PoolConfig
    from gpupool.server.app import create_app
    from gpupool.server.db import Store
    from gpupool.server.runtime import Runtime
    from gpupool.server.services.tenants import bootstrap
    from gpupool.server.settings import Settings

    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    provider = ManualProvider([node("n0", devices=2, model="H100")])
    settings = Settings(data_dir=tmp_path, database_url=url, placement="first-fit", cycle_interval_s=0.05,
                        busy_poll_interval_s=0.01)
    config = PoolConfig.model_validate({"serving": {"headroom_replicas": 1}})
    rt = Runtime(settings=settings, store=Store.open(url), provider=provider, config=config)
    server = Server(rt=rt, provider=provider, client=TestClient(create_app(rt)),
                    admin_token=bootstrap(rt) or "")
    server.client.__enter__()
    try:
        client, admin = server.client, server.headers()
        assert client.post(f"{API}/services", headers=admin, json={
            "name": "later", "command": ["serve"], "resources": {"gpus": 1}, "min_replicas": 0,
            "replicas": 0}).status_code == 201
        ids = [client.post(f"{API}/workloads", headers=admin, json={
            "command": ["train"], "resources": {"gpus": 1}}).json()["id"] for _ in range(2)]

        def decided() -> bool:
            rows = [client.get(f"{API}/workloads/{i}", headers=admin).json() for i in ids]
            return sorted((r["status"], r["reason"]) for r in rows)[1][0] == "running" and any(
                r["reason"] == "serving_headroom" for r in rows)

        server.wait_for(decided)
        scaled = client.post(f"{API}/services/later/scale", headers=admin, json={"replicas": 1})
        assert scaled.status_code == 200, scaled.text

        def replica_running() -> bool:
            replicas = client.get(f"{API}/services/later", headers=admin).json()["replicas"]
            return [r["status"] for r in replicas] == ["running"]

        server.wait_for(replica_running)
        statuses = sorted(server.status(i) for i in ids)
        assert statuses == ["pending", "running"]  # nothing was preempted for it
    finally:
        stop_server(server)


def test_a_spec_no_replica_could_run_as_is_refused_at_create(pool: Server) -> None:
    """Found by bench/fuzz_api.py: an empty program passed the service's own rules, and the replica's
    workload spec then refused it inside the controller."""
    answer = pool.client.post(f"{API}/services", headers=pool.headers(),
                              json={"tenant": "alpha", "name": "empty", "command": [""]})
    assert answer.status_code == 422, answer.text
    assert "must start with the program to run; its first word is empty" in answer.json()["message"]


def test_a_replica_failing_its_liveness_probe_is_replaced(
        pool: Server, listeners: dict[int, Replica]) -> None:
    create(pool, {"name": "stuck", "command": ["serve"], "resources": {"gpus": 0.25},
                  "liveness": {"path": "/healthz", "period_s": 1.5, "timeout_s": 1.5,
                               "failure_threshold": 2}})
    # A healthy replica gets 1.5 s to answer each probe: on a loaded machine a 0.1 s timeout failed
    # it before it was ever ready. A 500 fails at once, so the replacement below is not slower.
    serve_all(pool, "stuck", listeners, 1)
    wait_until(pool, lambda: show(pool, "stuck")["state"] == "ready")
    first = show(pool, "stuck")["replicas"][0]["workload_id"]
    for replica in listeners.values():
        replica.code = 500  # it still accepts connections (ready by TCP) but answers nothing useful
    wait_until(pool, lambda: pool.status(first) == "cancelled")
    events = [e for e in show(pool, "stuck")["events"] if e["reason"] == "replica_replaced"]
    assert len(events) == 1 and first in events[0]["message"]
    assert "failed its liveness probe 2 times" in events[0]["message"]
    assert "answered 500" in events[0]["message"]
    for replica in listeners.values():
        replica.code = 200
    serve_all(pool, "stuck", listeners, 1)
    wait_until(pool, lambda: show(pool, "stuck")["state"] == "ready"
               and show(pool, "stuck")["replicas"][0]["workload_id"] != first)
    delete(pool, "stuck")


class _Clock:
    def __init__(self) -> None:
        self.now = 2_000_000.0

    def __call__(self) -> float:
        return self.now


class _Plane:
    """The data plane's surface the loop drives, with a fixed load of 6 requests in flight."""

    def __init__(self, service: str) -> None:
        self.proxy = types.SimpleNamespace(on_cold_start=None)
        self.service = service

    def set_routes(self, routes: object) -> None:
        pass

    def set_backends(self, service: str, backends: object) -> None:
        pass

    def set_tokens(self, tokens: object) -> None:
        pass

    def traffic(self) -> dict[str, ServiceTraffic]:
        return {self.service: ServiceTraffic(self.service, in_flight=6, requests_total=0)}


def test_with_several_servers_only_the_leaders_autoscaler_writes(pool: Server) -> None:
    create(pool, {"name": "traffic", "command": ["serve"], "min_replicas": 0, "max_replicas": 8,
                  "replicas": 0, "target_concurrency": 2, "resources": {"gpus": 0.25}})
    clock = _Clock()
    lead = Leadership(pool.rt.store, server_id="lead", lease_s=9.0, renew_s=2.0, clock=clock, monotonic=clock)
    follow = Leadership(pool.rt.store, server_id="follow", lease_s=9.0, renew_s=2.0, clock=clock,
                        monotonic=clock)
    assert lead.round() and not follow.round()
    try:
        DataPlaneLoop(pool.rt, _Plane("alpha/traffic"), follow).tick(pool.rt.clock())  # type: ignore[arg-type]
        assert show(pool, "traffic")["desired"] == 0  # a follower routes but does not scale
        DataPlaneLoop(pool.rt, _Plane("alpha/traffic"), lead).tick(pool.rt.clock())  # type: ignore[arg-type]
        # 6 in flight at each router: the follower's, reported to the store, counted with the leader's own
        assert show(pool, "traffic")["desired"] == 6  # 12 in flight against a target of 2
    finally:
        lead.release()
        delete(pool, "traffic")


def test_a_scale_down_removes_the_replica_on_the_emptiest_node(pool: Server,
                                                               listeners: dict[int, Replica]) -> None:
    """serving.pack_replicas: three one-device replicas on two 2-device nodes (two share a node); a scale
    to two removes the one alone on its node, not the newest, so that node comes whole again."""
    created = create(pool, {"name": "packed", "command": ["serve"], "min_replicas": 1, "max_replicas": 3,
                            "replicas": 3, "resources": {"gpus": 1},
                            "readiness": {"period_s": 1.5, "timeout_s": 1.5}})
    serve_all(pool, "packed", listeners, 3)
    wait_until(pool, lambda: show(pool, "packed")["ready_replicas"] == 3)
    where = {r["workload_id"]: r["node"] for r in show(pool, "packed")["replicas"]}
    alone = [w for w, n in where.items() if list(where.values()).count(n) == 1]
    assert len(alone) == 1 and len(set(where.values())) == 2, where
    answer = pool.client.post(f"{API}/services/packed/scale", params={"tenant": "alpha"},
                              headers=pool.headers(),
                              json={"replicas": 2, "expected_version": show(pool, "packed")["version"]})
    assert answer.status_code == 200, answer.text
    wait_until(pool, lambda: {r["workload_id"] for r in show(pool, "packed")["replicas"]
                              if r["ready"] != "draining"} == set(where) - set(alone))
    assert created["desired"] == 3
    delete(pool, "packed")


class _Planes(_Plane):
    """The same load on several services."""

    def __init__(self, *services: str) -> None:
        super().__init__(services[0])
        self.services = services

    def traffic(self) -> dict[str, ServiceTraffic]:
        return {s: ServiceTraffic(s, in_flight=6, requests_total=0) for s in self.services}


def test_one_services_target_never_stops_the_others_autoscaling(pool: Server,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A target per replica near 0 made every service's decision in the tick fail (ceil of an infinite
    quotient): the API refuses one below MIN_TARGET, the autoscaler caps the quotient for one stored
    before, and a decision that fails for any other reason leaves the other services' decisions be."""
    body = {"command": ["serve"], "min_replicas": 0, "max_replicas": 8, "replicas": 0,
            "resources": {"gpus": 0.25}}
    answer = pool.client.post(f"{API}/services", headers=pool.headers(),
                              json={"tenant": "alpha", "name": "tiny", **body, "target_concurrency": 5e-324})
    assert answer.status_code == 422 and "must be at least 0.001" in answer.text, answer.text
    create(pool, {"name": "tiny", **body, "target_concurrency": 2})
    create(pool, {"name": "fine", **body, "target_concurrency": 2})
    try:
        with pool.rt.store.write() as session:  # as a release before the bound stored it
            row = session.scalars(select(ServiceRow).where(ServiceRow.name == "tiny")).one()
            row.target_concurrency, row.spec = 5e-324, {**row.spec, "target_concurrency": 5e-324}
        plane = _Planes("alpha/tiny", "alpha/fine")
        DataPlaneLoop(pool.rt, plane, None).tick(pool.rt.clock())  # type: ignore[arg-type]
        assert (show(pool, "tiny")["desired"], show(pool, "fine")["desired"]) == (8, 3)

        def failing(policy: Any, *args: Any) -> Any:
            if policy.target_per_replica < 1:
                raise RuntimeError("a decision that fails")
            return decide(policy, *args)

        monkeypatch.setattr(loop_module, "decide", failing)
        with pool.rt.store.write() as session:
            for row in session.scalars(select(ServiceRow).where(ServiceRow.name.in_(["tiny", "fine"]))):
                row.desired = 0
        DataPlaneLoop(pool.rt, plane, None).tick(pool.rt.clock())  # type: ignore[arg-type]
        assert (show(pool, "tiny")["desired"], show(pool, "fine")["desired"]) == (0, 3)
    finally:
        delete(pool, "tiny")
        delete(pool, "fine")
