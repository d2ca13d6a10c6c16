"""A service's dashboard page (GET /services/{name}/history): the sampler's per-service points (ready
and desired replicas from the store, requests/s, in flight and latency from the router), their hourly
roll-up (latency over the minutes that measured one), HAProxy's mean never shown as a quantile, and
another tenant's service that does not exist for the caller."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import ManualProvider

from conftest import Server, start_server, stop_server
from factories import node
from gpupool.api.services import ServiceLive
from gpupool.server.auth import Principal
from gpupool.server.services import history
from gpupool.server.services.history import HOUR_S, MINUTE_S
from gpupool.server.serving import history as service_history

API = "/api/v1"
ALPHA = Principal(token_id="t", tenant="alpha")


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    provider = ManualProvider([node("n0", devices=2, model="H100")])
    server = start_server(Path(tmp_path_factory.mktemp("svc-history")), provider=provider)
    admin = server.headers()
    for tenant in ("alpha", "beta"):
        assert server.client.post(f"{API}/tenants", json={"name": tenant}, headers=admin).status_code == 201
    answer = server.client.post(f"{API}/services", headers=admin, json={
        "tenant": "alpha", "name": "web", "command": ["serve"], "min_replicas": 2, "max_replicas": 4,
        "resources": {"gpus": 0.25}})
    assert answer.status_code == 201, answer.text
    yield server
    stop_server(server)


def token(pool: Server, tenant: str) -> dict[str, str]:
    answer = pool.client.post(f"{API}/tokens", json={"tenant": tenant, "name": f"page-{tenant}"},
                              headers=pool.headers())
    assert answer.status_code == 201, answer.text
    return pool.headers(answer.json()["token"])


def record(pool: Server, at: float, live: dict[str, ServiceLive]) -> None:
    points = history.sample(pool.rt, service_history.points(pool.rt, live))
    assert history.record(pool.rt, at, points) > 0


def series(body: dict, name: str) -> dict[float, float]:  # type: ignore[type-arg]
    return {t: v for t, v in next(s for s in body["series"] if s["name"] == name)["values"]}


def test_the_page_shows_replicas_traffic_latency_and_events_to_its_tenant_only(pool: Server) -> None:
    now = pool.rt.clock()
    first = history.minute_of(now) - 10 * MINUTE_S
    record(pool, first, {"alpha/web": ServiceLive(requests_per_s=12.5, in_flight=3, latency_p50_ms=4.0,
                                                  latency_p99_ms=20.0)})
    record(pool, first + MINUTE_S, {"alpha/web": ServiceLive(requests_per_s=7.5, in_flight=1,
                                                             latency_p50_ms=2.0, latency_p99_ms=9.0)})
    answer = pool.client.get(f"{API}/services/web/history", headers=token(pool, "alpha"))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["service"] == "alpha/web" and body["range"] == "1h" and body["step_s"] == 60
    assert body["router"] == "none" and body["live"] is None  # this pool has no --serve-port
    assert series(body, "desired")[first] == 2.0
    assert {t: v for t, v in series(body, "requests_per_s").items() if t in (first, first + 60)} == {
        first: 12.5, first + 60: 7.5}
    assert series(body, "latency_p50_ms") == {first: 4.0, first + 60: 2.0}
    assert series(body, "latency_p99_ms") == {first: 20.0, first + 60: 9.0}
    assert body["latency"] == "quantiles"
    assert body["events"], "its events since the range began"

    beta = pool.client.get(f"{API}/services/web/history", headers=token(pool, "beta"),
                           params={"tenant": "alpha"})
    assert beta.status_code == 404 and "No service 'web'" in beta.json()["message"]
    bad = pool.client.get(f"{API}/services/web/history", headers=pool.headers(),
                          params={"tenant": "alpha", "range": "2w"})
    assert bad.status_code == 422 and "use one of 1h, 24h, 7d" in bad.json()["message"]


def test_an_hour_of_latency_is_the_mean_of_the_minutes_that_measured_one(pool: Server) -> None:
    hour = float(int(pool.rt.clock() // HOUR_S) * HOUR_S) - 3 * HOUR_S
    record(pool, hour, {"alpha/web": ServiceLive(requests_per_s=30.0, in_flight=2, latency_p50_ms=10.0)})
    record(pool, hour + MINUTE_S, {"alpha/web": ServiceLive(requests_per_s=0.0, in_flight=0,
                                                            latency_p50_ms=20.0)})
    record(pool, hour + 2 * MINUTE_S, {})  # the router had not seen it: no traffic, no latency
    history.roll_up(pool.rt, hour + 2 * HOUR_S)
    now = pool.rt.clock()
    body = service_history.query(pool.rt, ALPHA, "web", None, "7d", now, None, "none").model_dump()
    assert series(body, "latency_p50_ms")[hour] == pytest.approx(15.0)  # not 10 (an idle minute is no 0 ms)
    assert series(body, "requests_per_s")[hour] == pytest.approx(10.0)  # traffic: a missing minute is 0


def test_haproxys_mean_is_shown_as_a_mean_never_as_a_quantile(pool: Server) -> None:
    live = {"alpha/web": ServiceLive(requests_per_s=100.0, in_flight=4, latency_mean_ms=3.5)}
    out = service_history.query(pool.rt, ALPHA, "web", None, "1h", pool.rt.clock(), live, "haproxy")
    assert out.latency == "mean" and out.live is not None and out.live.latency_mean_ms == 3.5
    assert out.live.latency_p50_ms is None and out.live.requests_per_s == 100.0


def test_the_pools_sampler_records_each_service_every_minute(pool: Server) -> None:
    extra = pool.client.app.state.history_sampler.extra  # type: ignore[attr-defined]
    points = {(p.series, p.key): p.value for p in extra()}
    assert points[("svc_desired", "alpha/web")] == 2.0 and ("svc_ready", "alpha/web") in points


def test_a_tenant_made_again_under_a_deleted_ones_name_sees_none_of_its_services_history(
        pool: Server) -> None:
    """Deleting a tenant deletes its services with it, and their history: a later tenant of the same
    name, whose service has the same name, read the deleted one's replicas and latency on its page."""
    api, admin = pool.client, pool.headers()
    spec = {"tenant": "gamma", "name": "web", "command": ["serve"], "min_replicas": 0, "max_replicas": 1,
            "replicas": 0, "resources": {"gpus": 0.25}}
    assert api.post(f"{API}/tenants", json={"name": "gamma"}, headers=admin).status_code == 201
    assert api.post(f"{API}/services", json=spec, headers=admin).status_code == 201
    first = history.minute_of(pool.rt.clock()) - 5 * MINUTE_S
    record(pool, first, {"gamma/web": ServiceLive(requests_per_s=9.0, in_flight=2, latency_p50_ms=1331.96),
                         "alpha/web": ServiceLive(requests_per_s=5.0, in_flight=1, latency_p50_ms=3.0)})
    assert api.delete(f"{API}/services/web", params={"tenant": "gamma"}, headers=admin).status_code == 200
    assert api.delete(f"{API}/tenants/gamma", headers=admin).status_code == 200
    assert api.post(f"{API}/tenants", json={"name": "gamma"}, headers=admin).status_code == 201
    assert api.post(f"{API}/services", json=spec, headers=admin).status_code == 201
    body = api.get(f"{API}/services/web/history", headers=token(pool, "gamma")).json()
    assert all(not s["values"] or s["name"] in ("ready", "desired") for s in body["series"]), body["series"]
    # another tenant's service of the same name keeps its own
    alpha = service_history.query(pool.rt, ALPHA, "web", None, "1h", pool.rt.clock(), None, "none")
    assert series(alpha.model_dump(), "requests_per_s")[first] == 5.0
    assert series(alpha.model_dump(), "latency_p50_ms")[first] == 3.0
