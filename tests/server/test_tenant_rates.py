"""Each tenant's requests to the API are bounded (server/ratelimit.py): past the limit a request is
answered 429 with Retry-After before anything of it is done, and the client sends it again."""

from __future__ import annotations

import httpx
import pytest

from conftest import Server
from gpupool.client import Client
from gpupool.errors import InvalidInput, TooManyRequests
from gpupool.server.auth import Principal, Scope
from gpupool.server.orm import WorkloadRow
from gpupool.server.ratelimit import TenantRates, request_cost
from gpupool.server.settings import DEFAULT_TENANT_REQUEST_RATE, Settings

API = "/api/v1"


def test_a_tenant_past_its_windows_is_refused_and_no_one_else_is_counted() -> None:
    rates = TenantRates("3/minute;5/hour")
    a, b = Principal("t1", "team-a"), Principal("t2", "team-b")
    for _ in range(3):
        rates.check(a)
    past = r"Tenant team-a sent more than 3 requests in one minute"
    with pytest.raises(TooManyRequests, match=past) as refused:
        rates.check(a)
    assert refused.value.details["retry_after_s"] >= 1 and refused.value.http_status == 429
    for _ in range(3):
        rates.check(b)  # each tenant has windows of its own
    for who in (Principal("admin", None), Principal("hub", None, scope=Scope.FEDERATION),
                Principal("hub", "team-a", scope=Scope.FEDERATION),
                Principal("m", None, scope=Scope.METRICS)):
        for _ in range(10):
            rates.check(who)  # the admin, a hub acting for a tenant, metrics: not counted
    TenantRates("off").check(a)
    with pytest.raises(InvalidInput, match=r"GPUPOOL_TENANT_REQUEST_RATE\) must be requests per window"):
        TenantRates("lots")


def test_the_rate_is_set_from_the_environment_and_checked_at_start() -> None:
    assert Settings().tenant_request_rate == DEFAULT_TENANT_REQUEST_RATE
    assert Settings().with_env({"GPUPOOL_TENANT_REQUEST_RATE": "off"}).tenant_request_rate == "off"
    with pytest.raises(InvalidInput, match="such as '100/second'"):
        Settings(tenant_request_rate="100 per fortnight")


def _pending(server: Server) -> int:
    with server.rt.store.read() as session:
        return session.query(WorkloadRow).count()


def test_a_flooding_tenant_gets_429_with_retry_after_and_stores_nothing_while_others_are_served(
        server: Server) -> None:
    server.created("/tenants", {"name": "team-a"})
    server.created("/tenants", {"name": "team-b"})
    a = str(server.created("/tokens", {"tenant": "team-a"})["token"])
    b = str(server.created("/tokens", {"tenant": "team-b"})["token"])
    server.rt.tenant_rates = TenantRates("5/minute")
    spec = {"command": ["true"], "resources": {"gpus": 0.25}}
    answers = [server.client.post(f"{API}/workloads", json=spec, headers=server.headers(a)) for _ in range(8)]
    assert [r.status_code for r in answers] == [201] * 5 + [429] * 3  # the submissions' fast path
    refused = answers[-1]
    assert refused.json()["code"] == "too_many_requests" and int(refused.headers["retry-after"]) >= 1
    assert "Tenant team-a sent more than 5 requests in one minute" in refused.json()["message"]
    assert _pending(server) == 5  # nothing of a refused submission was stored
    listing = server.client.get(f"{API}/workloads", headers=server.headers(a))
    assert listing.status_code == 429  # every route, not only submissions
    assert server.client.post(f"{API}/workloads", json=spec, headers=server.headers(b)).status_code == 201
    assert server.client.get(f"{API}/workloads", headers=server.headers()).status_code == 200  # the admin
    # a submission the fast path hands on to the route (an array) is counted once, not twice
    server.rt.tenant_rates = TenantRates("2/minute")
    array = {**spec, "array": "0-1"}
    assert server.client.post(f"{API}/workloads", json=array, headers=server.headers(b)).status_code == 201
    assert server.client.post(f"{API}/workloads", json=spec, headers=server.headers(b)).status_code == 201
    assert server.client.post(f"{API}/workloads", json=spec, headers=server.headers(b)).status_code == 429


def test_the_client_waits_as_told_and_sends_again(server: Server) -> None:
    server.created("/tenants", {"name": "team-a"})
    token = str(server.created("/tokens", {"tenant": "team-a"})["token"])
    server.rt.tenant_rates = TenantRates("2/3 seconds")  # two sent within 3 s however slow the machine
    statuses: list[int] = []

    def through(request: httpx.Request) -> httpx.Response:
        answer = server.client._transport.handle_request(request)
        answer.read()
        statuses.append(answer.status_code)
        return answer

    spec = {"command": ["true"], "resources": {"gpus": 0.25}}
    with Client("http://pool.test", token, transport=httpx.MockTransport(through)) as pool:
        ids = [pool.submit(spec) for _ in range(4)]
    assert len(set(ids)) == 4 and _pending(server) == 4  # each stored once
    assert statuses.count(201) == 4 and 429 in statuses  # the third waited for the window
    server.rt.tenant_rates = TenantRates("3/minute")
    with Client("http://pool.test", token, transport=httpx.MockTransport(through),
                retry_unavailable_s=0) as impatient:
        for _ in range(3):
            impatient.submit(spec)
        with pytest.raises(TooManyRequests, match="wait"):  # told to wait, and not waiting
            impatient.submit(spec)
    assert _pending(server) == 7


def test_a_listing_counts_by_the_rows_it_asks_for(server: Server) -> None:
    assert [request_cost(x) for x in (None, "x", "-3", "1", "19", "20", "200", "10000")] == \
        [1, 1, 1, 1, 1, 2, 11, 100]
    server.created("/tenants", {"name": "team-a"})
    a = server.headers(str(server.created("/tokens", {"tenant": "team-a"})["token"]))
    server.rt.tenant_rates = TenantRates("12/minute")
    assert server.client.get(f"{API}/workloads", params={"limit": 200}, headers=a).status_code == 200  # 11
    assert server.client.get(f"{API}/workloads", params={"limit": 1}, headers=a).status_code == 200  # 12
    refused = server.client.get(f"{API}/workloads", params={"limit": 1}, headers=a)
    assert refused.status_code == 429 and "per 20 rows" in refused.json()["message"]
    server.rt.tenant_rates = TenantRates("5/minute")  # a listing larger than the whole window passes alone
    assert server.client.get(f"{API}/workloads", params={"limit": 1000}, headers=a).status_code == 200
    assert server.client.get(f"{API}/workloads", params={"limit": 1}, headers=a).status_code == 429
