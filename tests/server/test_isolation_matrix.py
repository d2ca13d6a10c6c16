"""Tenant isolation, route by route from the OpenAPI listing: a tenant token aimed at another tenant's
objects gets 403 or 404 and never its data; admin-only routes are 403; listings hold only its own.

The routes come from the served schema at test time, so a route added without a row in EXPECTED
fails `test_every_route_has_an_expectation` until its developer says what a tenant must get there.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import Server, start_server, stop_server
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.write import to_ibnetdiscover
from gpupool.server.services.fabric import open_live_fabric

API = "/api/v1"
SECRET = "victim-secret-51d3"
"""In the victim's command and environment: it must appear in no answer the intruder gets."""
VICTIM_MARK = "victim"
"""Every name the victim owns contains it, so no answer the intruder reads with 200 may contain it."""


@dataclass(frozen=True)
class Victim:
    """The other tenant's real objects, created in setup."""

    tenant: str = "victim-corp"
    queue: str = "victim-q"
    workload_id: str = ""
    array_id: str = ""
    token_id: str = ""
    token_name: str = "victim-token"
    node: str = "n0"
    session_id: str = ""
    """The victim's remote-function session (its workload's id) and a call queued on it."""
    call_id: str = ""
    secret_name: str = "victim-api"
    """The victim's secret: its value is SECRET, which no answer may hold."""
    service_name: str = "victim-svc"
    """The victim's inference service (no replicas: its listing of workloads stays as it was)."""

    def value(self, key: str) -> str:
        return str(getattr(self, key))


Body = Callable[[Victim], object]


@dataclass(frozen=True)
class Public:
    """Needs no token and serves no tenant's data (health)."""


@dataclass(frozen=True)
class Admin:
    """Admin-only: a tenant token gets 403 whatever it names."""

    params: Mapping[str, str] = field(default_factory=dict)
    """path parameter -> Victim attribute; unnamed ones are taken from DEFAULT_PARAMS."""
    body: Body | None = None


@dataclass(frozen=True)
class Others:
    """Acts on the other tenant's object: 404 (it does not exist for this tenant) or 403."""

    params: Mapping[str, str] = field(default_factory=dict)
    body: Body | None = None
    codes: frozenset[int] = frozenset({403, 404})


@dataclass(frozen=True)
class Readable:
    """A tenant may read it: 200 without any of the other tenant's names or ids. `probe` names query
    parameters to set to the other tenant's values: the answer is then 403, 404, or a 200 without them."""

    params: Mapping[str, str] = field(default_factory=dict)
    probe: Mapping[str, str] = field(default_factory=dict)


Expectation = Public | Admin | Others | Readable
DEFAULT_PARAMS = {"workload_id": "workload_id", "tenant": "tenant", "name": "tenant", "token_id": "token_id",
                  "array_id": "array_id", "session_id": "session_id", "call_id": "call_id"}
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"

EXPECTED: dict[tuple[str, str], Expectation] = {
    ("GET", "/health"): Public(),
    ("GET", "/whoami"): Readable(),  # the caller's own identity: never the other tenant's
    # Workloads
    ("POST", "/workloads"): Others(body=lambda v: {"command": ["true"], "tenant": v.tenant},
                                   codes=frozenset({403})),
    ("GET", "/workloads"): Readable(probe={"tenant": "tenant", "queue": "queue"}),
    ("GET", "/workloads/{workload_id}"): Others(),
    ("POST", "/workloads/{workload_id}/cancel"): Others(),
    ("PATCH", "/workloads/{workload_id}"): Others(body=lambda v: {"priority": 1}),
    ("POST", "/workloads/{workload_id}/hold"): Others(),
    ("POST", "/workloads/{workload_id}/release"): Others(),
    ("POST", "/workloads/{workload_id}/requeue"): Others(),
    ("GET", "/workloads/{workload_id}/events"): Others(),
    ("GET", "/workloads/{workload_id}/logs"): Others(),
    ("GET", "/workloads/{workload_id}/checkpoint"): Others(),
    ("PUT", "/workloads/{workload_id}/checkpoint"): Others(body=lambda v: {"not": "a tar"}),
    ("GET", "/events/stream"): Readable(probe={"tenant": "tenant", "workload": "workload_id"}),
    ("GET", "/events/services/stream"): Readable(probe={"tenant": "tenant", "service": "service_name"}),
    ("POST", "/workloads/arrays/{array_id}/cancel"): Others(),
    # Nodes and the pool
    ("GET", "/nodes"): Readable(),
    ("GET", "/nodes/{name}"): Readable(params={"name": "node"}),
    ("POST", "/nodes/{name}/cordon"): Admin(params={"name": "node"}),
    ("POST", "/nodes/{name}/uncordon"): Admin(params={"name": "node"}),
    ("POST", "/nodes/{name}/drain"): Admin(params={"name": "node"}),
    ("POST", "/nodes/{name}/fail"): Admin(params={"name": "node"}),
    ("POST", "/nodes/{name}/heal"): Admin(params={"name": "node"}),
    ("GET", "/pool"): Readable(),
    # Tenants, queues, tokens
    ("GET", "/tenants"): Readable(),
    ("POST", "/tenants"): Admin(body=lambda v: {"name": "intruder"}),
    ("PATCH", "/tenants/{name}"): Admin(body=lambda v: {"max_priority": 1000}),
    ("DELETE", "/tenants/{name}"): Admin(),
    ("GET", "/queues"): Readable(probe={"tenant": "tenant"}),
    ("POST", "/queues"): Admin(body=lambda v: {"tenant": v.tenant, "name": "intruder"}),
    ("PATCH", "/queues/{tenant}/{name}"): Admin(params={"name": "queue"}, body=lambda v: {"quota_gpus": 0}),
    ("POST", "/tokens"): Admin(body=lambda v: {"tenant": v.tenant, "name": "intruder"}),
    ("GET", "/tokens"): Readable(probe={"tenant": "tenant"}),
    ("DELETE", "/tokens/{token_id}"): Others(),
    # Audit, configuration
    ("GET", "/audit"): Admin(),
    ("GET", "/config"): Admin(),
    ("GET", "/servers"): Admin(),
    # Usage and chargeback
    ("GET", "/usage"): Readable(probe={"tenant": "tenant"}),
    ("GET", "/history"): Readable(),  # its own usage series; the pool-wide metrics are the admin's
    # Remote function calls
    ("POST", "/calls/sessions"): Others(body=lambda v: {"python": PYTHON, "tenant": v.tenant},
                                       codes=frozenset({403})),
    ("GET", "/calls/sessions/{session_id}"): Others(),
    ("POST", "/calls/sessions/{session_id}/calls"): Others(body=lambda v: {"payload": ""}),
    ("POST", "/calls/sessions/{session_id}/close"): Others(),
    ("GET", "/calls/{call_id}"): Others(),
    ("POST", "/calls/{call_id}/cancel"): Others(),
    # The live fabric: every token reads it (a gang's path: its own only); changes are the admin's
    ("GET", "/fabric"): Readable(probe={"workload": "workload_id"}),
    ("POST", "/fabric/links/fail"): Admin(body=lambda v: {"link": "leaf-0:1"}),
    ("POST", "/fabric/links/heal"): Admin(body=lambda v: {"link": "leaf-0:1"}),
    # Container images: the pool's, listed to every token; imported and removed by the admin only
    ("GET", "/images"): Readable(),
    ("POST", "/images"): Admin(),
    ("DELETE", "/images/{name}"): Admin(),
    ("POST", "/fabric/telemetry"): Admin(body=lambda v: {"ports": [{"node": "leaf-0", "port": 1,
                                                                     "utilization": 0.5}]}),
    # Secrets: a tenant's own only; another's reads as one that does not exist (or 403 when named)
    ("POST", "/secrets"): Others(body=lambda v: {"name": v.secret_name, "tenant": v.tenant, "replace": True,
                                                 "data": {"k": "aW50cnVkZXI="}}, codes=frozenset({403})),
    ("GET", "/secrets"): Readable(probe={"tenant": "tenant"}),
    ("DELETE", "/secrets/{name}"): Others(params={"name": "secret_name"}, codes=frozenset({404})),
    # Inference services: a tenant's own only; another's does not exist for it
    ("POST", "/services"): Others(body=lambda v: {"name": v.service_name, "command": ["true"],
                                                  "tenant": v.tenant}, codes=frozenset({403})),
    ("GET", "/services"): Readable(probe={"tenant": "tenant"}),
    ("GET", "/services/{name}"): Others(params={"name": "service_name"}, codes=frozenset({404})),
    ("GET", "/services/{name}/partners"): Others(params={"name": "service_name"}, codes=frozenset({404})),
    ("GET", "/services/{name}/history"): Others(params={"name": "service_name"}, codes=frozenset({404})),
    ("PATCH", "/services/{name}"): Others(params={"name": "service_name"}, codes=frozenset({404}),
                                          body=lambda v: {"changes": {"command": ["evil"]}}),
    ("POST", "/services/{name}/scale"): Others(params={"name": "service_name"}, codes=frozenset({404}),
                                               body=lambda v: {"replicas": 1}),
    ("DELETE", "/services/{name}"): Others(params={"name": "service_name"}, codes=frozenset({404})),
}


@dataclass
class World:
    server: Server
    intruder: str
    victim_token: str
    victim: Victim
    routes: list[tuple[str, str]]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Two tenants: the intruder (a token, a workload) and the victim (a queue, a workload, a token)."""
    data = Path(tmp_path_factory.mktemp("isolation"))
    server = start_server(data)
    (data / "tree.topo").write_text(to_ibnetdiscover(fat_tree(4)))
    server.rt.fabric = open_live_fabric(data / "tree.topo", server.rt.nodes())
    client, admin = server.client, server.headers()

    def ok(answer: Any) -> Any:
        assert answer.status_code < 300, answer.text
        return answer.json()

    for tenant in ("intruder-corp", "victim-corp"):
        ok(client.post(f"{API}/tenants", json={"name": tenant}, headers=admin))
    ok(client.post(f"{API}/queues", json={"tenant": "victim-corp", "name": "victim-q", "quota_gpus": 2},
                   headers=admin))
    intruder = ok(client.post(f"{API}/tokens", json={"tenant": "intruder-corp", "name": "mine"},
                              headers=admin))["token"]
    victim_token = ok(client.post(f"{API}/tokens", json={"tenant": "victim-corp", "name": "victim-token"},
                                  headers=admin))
    spec = {"command": ["echo", SECRET], "name": "victim-job", "queue": "victim-q",
            "env": {"VICTIM_KEY": SECRET}, "resources": {"gpus": 0.5}}
    workload = ok(client.post(f"{API}/workloads", json=spec, headers=server.headers(victim_token["token"])))
    array = ok(client.post(f"{API}/workloads", json={**spec, "array": "0-3", "resources": {"gpus": 2}},
                           headers=server.headers(victim_token["token"])))
    ok(client.post(f"{API}/workloads", json={"command": ["true"]}, headers=server.headers(intruder)))
    ok(client.post(f"{API}/secrets", headers=server.headers(victim_token["token"]), json={
        "name": "victim-api", "data": {"VICTIM_KEY": base64.b64encode(SECRET.encode()).decode()}}))
    session = ok(client.post(f"{API}/calls/sessions", headers=server.headers(victim_token["token"]), json={
        "python": PYTHON, "name": "victim-fn", "queue": "victim-q", "env": {"VICTIM_KEY": SECRET},
        "call": {"payload": base64.b64encode(SECRET.encode()).decode()}}))
    ok(client.post(f"{API}/services", headers=server.headers(victim_token["token"]), json={
        "name": "victim-svc", "command": ["serve", SECRET], "env": {"VICTIM_KEY": SECRET}, "min_replicas": 0,
        "replicas": 0}))
    server.wait_for(lambda: server.status(workload["id"]) == "running")
    schema = ok(client.get(f"{API}/openapi.json"))
    routes = sorted((method.upper(), path.removeprefix(API))
                    for path, item in schema["paths"].items() for method in item)
    victim = Victim(workload_id=workload["id"], array_id=array["id"], token_id=victim_token["id"],
                    session_id=session["id"], call_id=session["call"]["id"])
    yield World(server, intruder, victim_token["token"], victim, routes)
    stop_server(server)


def test_every_route_has_an_expectation(world: World) -> None:
    missing = [f"{m} {p}" for m, p in world.routes if (m, p) not in EXPECTED]
    stale = [f"{m} {p}" for m, p in EXPECTED if (m, p) not in world.routes]
    assert not missing, (
        f"Routes in the OpenAPI schema without an isolation check: {missing}. Add each to EXPECTED in "
        "tests/server/test_isolation_matrix.py, saying what a tenant token aimed at another tenant's "
        "objects must get there (Public, Admin, Others or Readable).")
    assert not stale, f"EXPECTED names routes the schema no longer lists: {stale}; remove them."


def _path(template: str, params: Mapping[str, str], victim: Victim) -> str:
    path = template
    while "{" in path:
        name = path[path.index("{") + 1:path.index("}")]
        path = path.replace("{" + name + "}", victim.value(params.get(name, DEFAULT_PARAMS[name])))
    return API + path


def _problems(world: World, method: str, template: str, expectation: Expectation) -> list[str]:
    """What is wrong with the answers the intruder gets on this route (empty when all is well)."""
    if isinstance(expectation, Public):
        answer = world.server.client.request(method, API + template)
        ok = answer.status_code == 200 and SECRET not in answer.text
        return [] if ok else [f"{method} {template}: {answer.status_code} {answer.text}"]
    if isinstance(expectation, Readable):
        return _read_problems(world, method, template, expectation)
    return _refusal_problems(world, method, template, expectation)


def _read_problems(world: World, method: str, template: str, expectation: Readable) -> list[str]:
    victim, headers = world.victim, world.server.headers(world.intruder)
    path = _path(template, expectation.params, victim)
    calls: list[tuple[dict[str, str], frozenset[int]]] = [({}, frozenset({200}))]
    if expectation.probe:
        calls.append(({k: victim.value(v) for k, v in expectation.probe.items()}, frozenset({200, 403, 404})))
    problems = []
    for query, codes in calls:
        answer = world.server.client.request(method, path, params=query, headers=headers)
        where = f"{method} {template} {query}"
        if answer.status_code not in codes:
            problems.append(f"{where}: got {answer.status_code}, expected one of {sorted(codes)}")
        elif answer.status_code == 200 and VICTIM_MARK in answer.text:
            problems.append(f"{where}: the answer shows the other tenant's objects: {answer.text}")
    return problems


def _refusal_problems(world: World, method: str, template: str, expectation: Admin | Others) -> list[str]:
    path = _path(template, expectation.params, world.victim)
    body = expectation.body(world.victim) if expectation.body else None
    codes = frozenset({403}) if isinstance(expectation, Admin) else expectation.codes
    headers = world.server.headers(world.intruder)
    answer = world.server.client.request(method, path, json=body, headers=headers)
    where = f"{method} {template} as {path}"
    if answer.status_code not in codes:
        return [f"{where}: got {answer.status_code}, expected one of {sorted(codes)}: {answer.text}"]
    if set(answer.json()) != {"code", "message", "details"} or SECRET in answer.text:
        return [f"{where}: the refusal is not one error body without the other tenant's data: {answer.text}"]
    return []


WEBSOCKETS: dict[str, frozenset[int]] = {
    "/workloads/{workload_id}/exec": frozenset({404}),  # gpupool exec: another tenant's pod does not exist
}
"""WebSocket routes (the OpenAPI schema does not list them) -> the refusal an intruder gets, as the
status of the one error message the route sends before it closes."""


def test_every_websocket_is_the_owners_alone(world: World) -> None:
    import importlib
    import pkgutil

    from starlette.routing import WebSocketRoute

    import gpupool.server.routers as routers

    paths = sorted(r.path for info in pkgutil.iter_modules(routers.__path__)
                   for r in importlib.import_module(f"{routers.__name__}.{info.name}").router.routes
                   if isinstance(r, WebSocketRoute))
    assert paths == sorted(WEBSOCKETS), f"WebSocket routes {paths}: give each a row in WEBSOCKETS"
    for template, codes in WEBSOCKETS.items():
        path = _path(template, {}, world.victim)
        with world.server.client.websocket_connect(path, headers=world.server.headers(world.intruder)) as ws:
            ws.send_text(json.dumps({"command": ["cat", "/proc/self/environ"]}))
            answer = json.loads(ws.receive_text())
        assert answer.get("status") in codes and SECRET not in json.dumps(answer), (template, answer)


def test_a_tenant_reaches_nothing_of_another_tenant(world: World) -> None:
    problems = [p for m, t in world.routes if (m, t) in EXPECTED
                for p in _problems(world, m, t, EXPECTED[(m, t)])]
    assert not problems, "\n".join(problems)


def test_every_route_but_health_needs_a_token(world: World) -> None:
    wrong = []
    for method, template in world.routes:
        if isinstance(EXPECTED.get((method, template)), Public):
            continue
        answer = world.server.client.request(method, _path(template, {}, world.victim))
        if answer.status_code != 401 or answer.json().get("code") != "unauthorized":
            wrong.append(f"{method} {template}: {answer.status_code} {answer.text}")
    assert not wrong, "\n".join(wrong)


def test_the_refusals_changed_nothing(world: World) -> None:
    """After the whole matrix ran, the victim's workload, queue, token and the nodes are as they were."""
    test_a_tenant_reaches_nothing_of_another_tenant(world)
    client, admin, victim = world.server.client, world.server.headers(), world.victim
    assert world.server.status(victim.workload_id) == "running"
    queue = client.get(f"{API}/queues", params={"tenant": victim.tenant}, headers=admin).json()
    assert {q["name"]: q["quota_gpus"] for q in queue} == {"default": None, "victim-q": 2}
    own = client.get(f"{API}/workloads", headers=world.server.headers(world.victim_token)).json()
    assert sorted(w["id"] for w in own["items"]) == sorted(
        [victim.workload_id, victim.session_id, *(f"{victim.array_id}_{i}" for i in range(4))])
    call = client.get(f"{API}/calls/{victim.call_id}", headers=world.server.headers(world.victim_token))
    assert call.json()["status"] in ("queued", "running"), "the call was not cancelled"
    assert all(w["status"] in ("pending", "running") for w in own["items"]), "nothing was cancelled"
    assert not any(n["cordoned"] for n in client.get(f"{API}/nodes", headers=admin).json())
    tenants = {t["name"] for t in client.get(f"{API}/tenants", headers=admin).json()}
    assert "intruder" not in tenants
    secrets = client.get(f"{API}/secrets", headers=world.server.headers(world.victim_token)).json()
    assert [(x["name"], x["keys"], x["created_s"] == x["updated_s"]) for x in secrets] == [
        ("victim-api", ["VICTIM_KEY"], True)], "the secret was replaced or deleted"
    services = client.get(f"{API}/services", headers=world.server.headers(world.victim_token)).json()
    assert [(x["name"], x["desired"], x["version"], x["spec"]["command"]) for x in services] == [
        ("victim-svc", 0, 1, ["serve", SECRET])], "the service was scaled, changed or deleted"


def test_a_tenant_sees_its_own_objects(world: World) -> None:
    """The listings the matrix found clean are not clean because they are empty."""
    client, headers = world.server.client, world.server.headers(world.intruder)
    assert client.get(f"{API}/workloads", headers=headers).json()["total"] == 1
    assert [t["name"] for t in client.get(f"{API}/tenants", headers=headers).json()] == ["intruder-corp"]
    assert {q["tenant"] for q in client.get(f"{API}/queues", headers=headers).json()} == {"intruder-corp"}
    assert [t["name"] for t in client.get(f"{API}/tokens", headers=headers).json()] == ["mine"]
    by_tenant = client.get(f"{API}/pool", headers=headers).json()["by_tenant"]
    assert [t["tenant"] for t in by_tenant] == ["intruder-corp"]


def test_a_tenant_cannot_submit_for_another(world: World) -> None:
    spec = {"command": ["true"], "tenant": world.victim.tenant}
    headers = world.server.headers(world.intruder)
    answer = world.server.client.post(f"{API}/workloads", json=spec, headers=headers)
    assert answer.status_code == 403, answer.text
    assert answer.json()["code"] == "forbidden"


def test_metrics_need_a_token(world: World) -> None:
    """/metrics is outside the schema; it names every tenant, so it is not public."""
    client = world.server.client
    assert client.get("/metrics").status_code == 401
    refused = client.get("/metrics", headers=world.server.headers(world.intruder))
    assert refused.status_code == 403, refused.text
    assert VICTIM_MARK not in refused.text
    assert client.get("/metrics", headers=world.server.headers()).status_code == 200


def test_the_node_listing_is_clean_for_a_tenant_because_it_is_filtered(world: World) -> None:
    """/nodes names the workloads holding each device's slices: the admin sees the victim's there,
    the victim its own, and the intruder (whose answer the matrix found clean) none of them."""
    client, victim = world.server.client, world.victim

    def holders(token: str | None) -> set[str]:
        nodes = client.get(f"{API}/nodes", headers=world.server.headers(token)).json()
        return {s["workload"] for n in nodes for d in n["devices"] for s in d["held"]}

    assert victim.workload_id in holders(None)
    assert victim.workload_id in holders(world.victim_token)
    assert victim.workload_id not in holders(world.intruder)


def test_the_admin_opens_no_session_for_another_tenant(shared_server: Server) -> None:
    """A session's results are pickles the opener's SDK loads, and code running as the tenant's
    account can post them (the worker's call token is readable from /proc by that account): the
    admin token opens sessions of the default tenant (its own trials) only."""
    server = shared_server
    server.client.post(f"{API}/tenants", json={"name": "fn-team"}, headers=server.headers())
    body = {"python": PYTHON, "tenant": "fn-team", "resources": {"gpus": 0.25}}
    refused = server.client.post(f"{API}/calls/sessions", json=body, headers=server.headers())
    assert refused.status_code == 403 and "fn-team's tokens" in refused.json()["message"]
    own = server.client.post(f"{API}/calls/sessions", json={**body, "tenant": None}, headers=server.headers())
    assert own.status_code == 201, own.text
    server.client.post(f"{API}/calls/sessions/{own.json()['id']}/close", headers=server.headers())
