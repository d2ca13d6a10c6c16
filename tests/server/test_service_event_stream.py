"""Service events as a stream (GET /events/services/stream, `gpupool events --services`): a tenant's
own services only, resumable after an id (Last-Event-ID), narrowed to named services, and a bad
filter answered with a sentence before the stream starts."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import ManualProvider

from conftest import Server, start_server, stop_server
from factories import node

API = "/api/v1"
NAMES = itertools.count()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    provider = ManualProvider([node("n0", devices=2, model="H100")])
    server = start_server(Path(tmp_path_factory.mktemp("svc-events")), provider=provider)
    admin = server.headers()
    for tenant, name in (("alpha", "web"), ("beta", "rival")):
        assert server.client.post(f"{API}/tenants", json={"name": tenant}, headers=admin).status_code == 201
        answer = server.client.post(f"{API}/services", headers=admin, json={
            "tenant": tenant, "name": name, "command": ["serve"], "min_replicas": 0, "max_replicas": 3,
            "resources": {"gpus": 0.25}})
        assert answer.status_code == 201, answer.text
    yield server
    stop_server(server)


def token(pool: Server, tenant: str) -> dict[str, str]:
    answer = pool.client.post(f"{API}/tokens", json={"tenant": tenant, "name": f"ev-{next(NAMES)}"},
                              headers=pool.headers())
    assert answer.status_code == 201, answer.text
    return pool.headers(answer.json()["token"])


def stored(pool: Server, headers: dict[str, str], **params: Any) -> tuple[int, list[dict[str, Any]]]:
    """(the id the stream starts after, its events) of a finite stream."""
    answer = pool.client.get(f"{API}/events/services/stream", headers=headers, params=params)
    assert answer.status_code == 200, answer.text
    start, events = -1, []
    for block in answer.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if "data" in lines:
            events.append(json.loads(lines["data"]))
        elif "id" in lines:
            start = int(lines["id"])
    return start, events


def scale(pool: Server, tenant: str, name: str, replicas: int) -> None:
    answer = pool.client.post(f"{API}/services/{name}/scale", params={"tenant": tenant},
                              json={"replicas": replicas, "reason": "a test"}, headers=pool.headers())
    assert answer.status_code == 200, answer.text


def test_a_tenant_streams_its_own_services_events_and_resumes_after_an_id(pool: Server) -> None:
    alpha, beta = token(pool, "alpha"), token(pool, "beta")
    scale(pool, "alpha", "web", 2)
    scale(pool, "beta", "rival", 1)
    start, mine = stored(pool, alpha)
    assert start == 0 and {e["service"] for e in mine} == {"web"} and {e["tenant"] for e in mine} == {"alpha"}
    assert [e["reason"] for e in mine][:1] == ["created"]
    assert any(e["reason"] == "scaled" and e["message"] == "scaled 0 → 2: a test" for e in mine)
    assert {e["service"] for e in stored(pool, beta)[1]} == {"rival"}
    everyone = stored(pool, pool.headers())[1]
    assert {(e["tenant"], e["service"]) for e in everyone} >= {("alpha", "web"), ("beta", "rival")}

    last = mine[-1]["id"]
    assert stored(pool, alpha, after=last)[1] == []
    scale(pool, "alpha", "web", 1)
    newer = stored(pool, {**alpha, "Last-Event-ID": str(last)})[1]
    assert [e["message"] for e in newer] == ["scaled 2 → 1: a test"] and newer[0]["id"] > last


def test_a_filter_names_only_the_callers_own(pool: Server) -> None:
    alpha = token(pool, "alpha")
    theirs = stored(pool, pool.headers(), tenant="beta", service="rival")[1]
    assert theirs and {e["service"] for e in theirs} == {"rival"}
    for params, said in (({"tenant": "beta"}, "it streams only tenant alpha's events"),
                         ({"service": "rival"}, "No service 'rival'")):
        answer = pool.client.get(f"{API}/events/services/stream", headers=alpha, params=params)
        assert answer.status_code == 404 and said in answer.json()["message"], answer.text
    bad = pool.client.get(f"{API}/events/services/stream", headers={**alpha, "Last-Event-ID": "x"})
    assert bad.status_code == 422 and "is not an event id" in bad.json()["message"]


@pytest.mark.parametrize("path", ["/events/stream", "/events/services/stream"])
def test_a_last_event_id_beyond_any_event_id_is_refused_before_the_stream(pool: Server, path: str) -> None:
    """Like ?after= (at most 2**62): a larger Last-Event-ID is a 422 sentence, not a 200 stream that
    dies on SQLite's INTEGER; an id at the bound still streams, and a negative id still starts at 0."""
    alpha = token(pool, "alpha")
    huge = "9" * 39
    bad = pool.client.get(f"{API}{path}", headers={**alpha, "Last-Event-ID": huge})
    assert bad.status_code == 422, bad.text
    body = bad.json()
    assert body["code"] == "invalid_input"
    assert f"Last-Event-ID '{huge}' is larger than any event id (at most {2**62})" in body["message"]
    beyond = pool.client.get(f"{API}{path}", headers={**alpha, "Last-Event-ID": str(2**62 + 1)})
    assert beyond.status_code == 422 and "larger than any event id" in beyond.json()["message"]
    for header, start in ((str(2**62), 2**62), ("-5", 0)):
        answer = pool.client.get(f"{API}{path}", headers={**alpha, "Last-Event-ID": header})
        assert answer.status_code == 200, answer.text
        assert answer.text.startswith(f": start\nid: {start}\n\n")
        assert start == 0 or "data:" not in answer.text  # nothing stored after the bound
    for malformed in ("abc", "1e3"):
        answer = pool.client.get(f"{API}{path}", headers={**alpha, "Last-Event-ID": malformed})
        assert answer.status_code == 422 and "is not an event id" in answer.json()["message"], answer.text
