"""Each tenant's open requests are bounded (server/ratelimit.py, `--tenant-open-requests`): a followed
stream, a long poll or an exec holds a connection and a file descriptor of the server for as long as
it lasts, and without a bound one tenant could hold them all. The client library's stream waits for
room as its other requests do."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from factories import node
from gpupool.client import Client
from gpupool.errors import InvalidInput, TooManyRequests
from gpupool.server.auth import Principal, Scope
from gpupool.server.ratelimit import TenantRates
from gpupool.server.settings import DEFAULT_TENANT_OPEN_REQUESTS, Settings
from live import live_server
from server.fakes import ManualProvider

API = "/api/v1"


def test_a_tenant_with_its_limit_open_is_refused_until_one_ends() -> None:
    rates = TenantRates("2/minute", open_requests=2)
    a, b = Principal("t1", "team-a"), Principal("t2", "team-b")
    first, second = rates.admit(a), rates.admit(a)
    with pytest.raises(TooManyRequests, match="Tenant team-a has 2 requests open on this server") as refused:
        rates.admit(a)
    assert refused.value.details["retry_after_s"] == 1
    first()
    with pytest.raises(TooManyRequests, match="more than 2 requests in one minute"):
        rates.admit(a)  # the request refused for being open took no place in the window
    assert rates.open == {"team-a": 1}
    second()
    assert rates.open == {}
    releases = [rates.admit(b), rates.admit(b)]  # each tenant its own
    for who in (Principal("admin", None), Principal("hub", "team-a", scope=Scope.FEDERATION)):
        for _ in range(5):
            rates.admit(who)()  # not counted
    for release in releases:
        release()
    assert rates.open == {} and not TenantRates("off").max_open and TenantRates("off").off
    assert not TenantRates("off", open_requests=3).off


def test_the_bound_is_set_from_the_environment_and_checked_at_start() -> None:
    assert Settings().tenant_open_requests == DEFAULT_TENANT_OPEN_REQUESTS
    assert Settings().with_env({"GPUPOOL_TENANT_OPEN_REQUESTS": "0"}).tenant_open_requests == 0
    with pytest.raises(InvalidInput, match="GPUPOOL_TENANT_OPEN_REQUESTS must be 0"):
        Settings().with_env({"GPUPOOL_TENANT_OPEN_REQUESTS": "many"})
    with pytest.raises(InvalidInput, match="must be 0 \\(not bounded\\) or a number"):
        Settings(tenant_open_requests=-1)


def test_followed_streams_count_as_open_until_they_end(tmp_path: Path) -> None:
    provider = ManualProvider([node("n0", devices=2, model="H100")])
    with live_server(tmp_path, provider) as srv:
        admin = {"Authorization": f"Bearer {srv.admin_token}"}
        tokens = {}
        with httpx.Client(base_url=srv.url + API, headers=admin, timeout=20) as c:
            for name in ("team-a", "team-b"):
                assert c.post("/tenants", json={"name": name}).status_code == 201
                tokens[name] = c.post("/tokens", json={"tenant": name}).json()["token"]
        srv.rt.tenant_rates = TenantRates("off", open_requests=2)

        def client(tenant: str) -> httpx.Client:
            return httpx.Client(base_url=srv.url + API, timeout=20,
                                headers={"Authorization": f"Bearer {tokens[tenant]}"})

        a, b = client("team-a"), client("team-b")
        streams = [client("team-a") for _ in range(2)]
        held = [s.stream("GET", "/events/stream", params={"follow": "true"}) for s in streams]
        for stream in held:
            assert stream.__enter__().status_code == 200
        refused = a.get("/workloads")
        assert refused.status_code == 429 and refused.json()["code"] == "too_many_requests"
        assert "has 2 requests open" in refused.json()["message"] and refused.headers["retry-after"] == "1"
        assert b.get("/workloads").status_code == 200  # another tenant
        assert httpx.get(srv.url + API + "/workloads", headers=admin).status_code == 200  # the admin
        # the client library's stream waits for room as its requests do, and is then served
        statuses: list[int] = []
        inner = httpx.HTTPTransport()

        class Recording(httpx.BaseTransport):
            def handle_request(self, request: httpx.Request) -> httpx.Response:
                answer = inner.handle_request(request)
                statuses.append(answer.status_code)
                return answer

        outcome: list[object] = []

        def read_events() -> None:
            with Client(srv.url, tokens["team-a"], transport=Recording()) as pool:
                try:
                    outcome.append(list(pool.stream_events(follow=False)))
                except Exception as exc:  # reported by the assertion below
                    outcome.append(exc)

        reader = threading.Thread(target=read_events)
        reader.start()
        deadline = time.monotonic() + 15
        while 429 not in statuses:
            assert time.monotonic() < deadline and reader.is_alive(), (statuses, outcome)
            time.sleep(0.02)
        held[0].__exit__(None, None, None)  # the client goes: the stream ends with it
        streams[0].close()
        reader.join(timeout=30)
        assert outcome == [[]] and statuses[-1] == 200, (outcome, statuses)  # no events yet: an empty list
        deadline = time.monotonic() + 15
        while srv.rt.tenant_rates.open.get("team-a", 0) > 1:  # the reader's finished stream is released too
            assert time.monotonic() < deadline, srv.rt.tenant_rates.open
            time.sleep(0.01)
        while a.get("/workloads").status_code == 429:
            assert time.monotonic() < deadline, "the ended stream was still counted open"
            time.sleep(0.05)
        while srv.rt.tenant_rates.open != {"team-a": 1}:  # the listing's own release follows its answer
            assert time.monotonic() < deadline, srv.rt.tenant_rates.open
            time.sleep(0.01)
        held[1].__exit__(None, None, None)
        for c in (*streams, a, b):
            c.close()
