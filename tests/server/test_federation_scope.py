"""The federation token scope on a member pool: a hub's token submits, reads and cancels work only
as the tenant it names, reads usage and the pool's summary, and nothing else (docs/federation.md)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from conftest import Server
from gpupool.pods import PodLaunch
from gpupool.server.orm import ServiceRow, WorkloadRow

ON_BEHALF = "X-Gpupool-On-Behalf-Of"


@pytest.fixture(scope="module")
def fed(shared_server: Server) -> tuple[Server, str, str]:
    server = shared_server
    for tenant in ("alice", "bob"):
        server.created("/tenants", {"name": tenant})
    token = str(server.created("/tokens", {"tenant": None, "name": "hub", "scope": "federation"})["token"])
    bob = str(server.created("/tokens", {"tenant": "bob", "name": "bob"})["token"])
    return server, token, bob


def _h(token: str, tenant: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"}
    if tenant:
        headers[ON_BEHALF] = tenant
    return headers


def test_submits_reads_and_cancels_as_the_tenant_it_names(fed: tuple[Server, str, str]) -> None:
    server, token, _ = fed
    body = {"command": ["true"], "resources": {"gpus": 1}}
    created = server.client.post("/api/v1/workloads", json=body, headers=_h(token, "alice"))
    assert created.status_code == 201, created.text
    wid = created.json()["id"]
    shown = server.client.get(f"/api/v1/workloads/{wid}", headers=_h(token, "alice"))
    assert shown.json()["tenant"] == "alice"
    assert server.client.get(f"/api/v1/workloads/{wid}", headers=_h(token, "bob")).status_code == 404
    cancelled = server.client.post(f"/api/v1/workloads/{wid}/cancel", headers=_h(token, "alice"))
    assert cancelled.status_code == 200
    # a spec naming another tenant is refused: the header is who it acts for
    spoof = server.client.post("/api/v1/workloads", json={**body, "tenant": "bob"},
                               headers=_h(token, "alice"))
    assert spoof.status_code == 403, spoof.text


def test_needs_a_tenant_to_act_and_an_existing_one(fed: tuple[Server, str, str]) -> None:
    server, token, _ = fed
    body = {"command": ["true"]}
    bare = server.client.post("/api/v1/workloads", json=body, headers=_h(token))
    assert bare.status_code == 403 and ON_BEHALF in bare.json()["message"]
    ghost = server.client.post("/api/v1/workloads", json=body, headers=_h(token, "mallory"))
    assert ghost.status_code == 403 and "no tenant 'mallory'" in ghost.json()["message"]


def test_reads_usage_and_the_pool_without_a_tenant(fed: tuple[Server, str, str]) -> None:
    server, token, _ = fed
    assert server.client.get("/api/v1/usage", headers=_h(token)).status_code == 200
    assert server.client.get("/api/v1/pool", headers=_h(token)).status_code == 200


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/api/v1/tenants"), ("POST", "/api/v1/tenants"), ("GET", "/api/v1/tokens"),
    ("POST", "/api/v1/tokens"), ("GET", "/api/v1/secrets"), ("GET", "/api/v1/nodes"),
    ("POST", "/api/v1/nodes/n0/cordon"), ("GET", "/api/v1/audit"), ("GET", "/metrics"),
    ("GET", "/api/v1/events/stream"),
])
def test_nothing_more(fed: tuple[Server, str, str], method: str, path: str) -> None:
    server, token, _ = fed
    for tenant in (None, "alice"):
        answer = server.client.request(method, path, headers=_h(token, tenant), json={})
        assert answer.status_code == 403, (method, path, tenant, answer.text)


def test_only_the_admin_owns_one_and_the_header_gives_a_tenant_nothing(fed: tuple[Server, str, str]) -> None:
    server, _, bob = fed
    refused = server.client.post("/api/v1/tokens", json={"tenant": "bob", "scope": "federation"},
                                 headers=server.headers())
    assert refused.status_code == 422 and "--admin --scope federation" in refused.json()["message"]
    # bob's own token with the header still acts as bob, never as alice
    created = server.client.post("/api/v1/workloads", json={"command": ["true"]}, headers=_h(bob, "alice"))
    assert created.status_code == 201
    shown = server.client.get(f"/api/v1/workloads/{created.json()['id']}", headers=_h(bob))
    assert shown.json()["tenant"] == "bob"


def test_holds_updates_and_requeues_only_as_the_tenant_it_names(fed: tuple[Server, str, str]) -> None:
    """Job control forwarded by a hub (docs/federation.md): the tenant's own acts, on its own work."""
    server, token, _ = fed
    created = server.client.post("/api/v1/workloads", json={"command": ["true"], "resources": {"gpus": 1}},
                                 headers=_h(token, "alice"))
    wid = created.json()["id"]
    for method, leaf in (("POST", "/hold"), ("PATCH", ""), ("POST", "/requeue"), ("POST", "/release")):
        body = {"priority": 0} if method == "PATCH" else None
        mine = server.client.request(method, f"/api/v1/workloads/{wid}{leaf}", json=body,
                                     headers=_h(token, "alice"))
        assert mine.status_code in (200, 409), (method, leaf, mine.text)  # allowed; 409: not in that state
        theirs = server.client.request(method, f"/api/v1/workloads/{wid}{leaf}", json=body,
                                       headers=_h(token, "bob"))
        assert theirs.status_code == 404, (method, leaf, theirs.text)
    server.client.post(f"/api/v1/workloads/{wid}/cancel", headers=_h(token, "alice"))


def test_only_the_tenants_own_token_runs_work_with_its_secrets(fed: tuple[Server, str, str]) -> None:
    """A hub's federation token, or the admin's, submitting as a tenant with the tenant's secret
    could read the value back from the pod's logs: both are refused; the tenant's own token is not.
    The same holds for a service, at its creation and at a change of what its replicas run."""
    import base64

    server, hub, bob = fed
    value = base64.b64encode(b"hunter2").decode()
    made = server.client.post("/api/v1/secrets", json={"name": "db", "data": {"pw": value}},
                              headers=_h(bob))
    assert made.status_code == 201, made.text
    body = {"command": ["sh", "-c", "echo $pw"], "resources": {"gpus": 1}, "secrets": [{"name": "db"}]}
    for headers, by in ((_h(hub, "bob"), "a federation token"), (server.headers(), "the admin's token")):
        sent = {**body, "tenant": "bob"} if by.startswith("the admin") else body
        refused = server.client.post("/api/v1/workloads", json=sent, headers=headers)
        assert refused.status_code == 403, refused.text
        assert f"not {by}" in refused.json()["message"]
    own = server.client.post("/api/v1/workloads", json=body, headers=_h(bob))
    assert own.status_code == 201, own.text
    server.client.post(f"/api/v1/workloads/{own.json()['id']}/cancel", headers=_h(bob))
    service = {"name": "svc", "command": ["sleep", "1000"], "tenant": "bob", "secrets": [{"name": "db"}]}
    refused = server.client.post("/api/v1/services", json=service, headers=server.headers())
    assert refused.status_code == 403 and "not the admin's token" in refused.json()["message"]
    service.pop("tenant")
    created = server.client.post("/api/v1/services", json=service, headers=_h(bob))
    assert created.status_code == 201, created.text
    change = {"changes": {"command": ["sh", "-c", "echo $pw; sleep 1000"]}}
    refused = server.client.patch("/api/v1/services/svc?tenant=bob", json=change, headers=server.headers())
    assert refused.status_code == 403, refused.text
    bounds = server.client.patch("/api/v1/services/svc?tenant=bob", json={"changes": {"max_replicas": 2}},
                                 headers=server.headers())
    assert bounds.status_code == 200, bounds.text  # what runs is unchanged: the admin may
    assert server.client.delete("/api/v1/services/svc", headers=_h(bob)).status_code == 200


def test_work_the_hub_or_the_admin_writes_for_a_tenant_runs_as_its_on_behalf_account(
        fed: tuple[Server, str, str]) -> None:
    """What the server stores and launches: the hub's and the admin's work for bob is marked with who
    wrote it and launched as bob's on-behalf account (PodLaunch.on_behalf), bob's own is not; nobody
    may set the mark themselves."""
    server, hub, bob = fed
    body = {"command": ["true"], "resources": {"gpus": 1}}
    ids: dict[str | None, str] = {}
    for by, headers, sent in (("federation", _h(hub, "bob"), body),
                              ("admin", server.headers(), {**body, "tenant": "bob"}), (None, _h(bob), body)):
        made = server.client.post("/api/v1/workloads", json=sent, headers=headers)
        assert made.status_code == 201, made.text
        ids[by] = made.json()["id"]
    try:
        pods = server.provider.launched
        server.wait_for(lambda: {p.workload_id for p in pods.values()} >= set(ids.values()))
        launched = {p.workload_id: p.on_behalf for p in pods.values()}
        assert {by: launched[wid] for by, wid in ids.items()} == {"federation": True, "admin": True,
                                                                 None: False}
        with server.rt.store.read() as session:
            stored = {row.id: row.spec.get("on_behalf") for row in session.scalars(
                select(WorkloadRow).where(WorkloadRow.id.in_(ids.values())))}
        assert {by: stored[wid] for by, wid in ids.items()} == {"federation": "federation", "admin": "admin",
                                                               None: None}
        for headers in (_h(bob), _h(hub, "bob"), server.headers()):
            forged = server.client.post("/api/v1/workloads", json={**body, "on_behalf": "admin"},
                                        headers=headers)
            assert forged.status_code == 422, forged.text
            assert "on_behalf is set by the server" in forged.json()["message"]
    finally:
        for wid in ids.values():
            server.client.post(f"/api/v1/workloads/{wid}/cancel", headers=server.headers())


def test_a_service_the_admin_writes_for_a_tenant_runs_apart_and_is_given_no_secret(
        fed: tuple[Server, str, str]) -> None:
    """A service the admin creates for bob, or whose replicas' command it changes, is marked: its
    replicas run as bob's on-behalf account, so bob cannot give it a secret there (every such pod of
    bob's shares that account); bounds the admin changes leave bob's own service as it was."""
    import base64

    server, _, bob = fed
    made = server.client.post("/api/v1/secrets", json={"name": "api", "data": {"k": base64.b64encode(
        b"v").decode()}}, headers=_h(bob))
    assert made.status_code == 201, made.text

    def marks() -> dict[str, object]:
        with server.rt.store.read() as session:
            return {row.name: row.spec.get("on_behalf") for row in session.scalars(
                select(ServiceRow).where(ServiceRow.tenant == "bob"))}

    base = {"command": ["sleep", "1000"], "min_replicas": 0, "replicas": 0}
    forged = server.client.post("/api/v1/services", json={**base, "name": "x", "on_behalf": "admin"},
                                headers=_h(bob))
    assert forged.status_code == 422 and "on_behalf is set by the server" in forged.json()["message"]
    theirs = server.client.post("/api/v1/services", json={**base, "name": "helper", "tenant": "bob"},
                                headers=server.headers())
    own = server.client.post("/api/v1/services", json={**base, "name": "own"}, headers=_h(bob))
    assert theirs.status_code == own.status_code == 201, (theirs.text, own.text)
    try:
        assert marks() == {"helper": "admin", "own": None}
        secret = server.client.patch("/api/v1/services/helper", headers=_h(bob),
                                     json={"changes": {"secrets": [{"name": "api"}]}})
        assert secret.status_code == 403, secret.text
        said = "its replicas run as bob's on-behalf account, which is given no secrets"
        assert said in secret.json()["message"]
        bounds = server.client.patch("/api/v1/services/own?tenant=bob", headers=server.headers(),
                                     json={"changes": {"max_replicas": 3}})
        assert bounds.status_code == 200 and marks() == {"helper": "admin", "own": None}
        for change in ({"readiness": {"kind": "tcp"}}, {"resources": {"gpus": 0.5}}):  # rolls, no code
            rolled = server.client.patch("/api/v1/services/own?tenant=bob", headers=server.headers(),
                                         json={"changes": change})
            assert rolled.status_code == 200 and marks() == {"helper": "admin", "own": None}, change
        command = server.client.patch("/api/v1/services/own?tenant=bob", headers=server.headers(),
                                      json={"changes": {"command": ["sleep", "999"]}})
        assert command.status_code == 200 and marks() == {"helper": "admin", "own": "admin"}
        # the provider keeps every pod it launched: an earlier test's replica of bob's may be among them
        before = set(server.provider.launched)
        scaled = server.client.post("/api/v1/services/own/scale", json={"replicas": 1}, headers=_h(bob))
        assert scaled.status_code == 200, scaled.text

        def replicas() -> list[PodLaunch]:
            return [p for pid, p in list(server.provider.launched.items())
                    if pid not in before and p.env.get("GPUPOOL_TENANT") == "bob" and p.serve_port]

        server.wait_for(lambda: bool(replicas()))
        assert [p.on_behalf for p in replicas()] == [True]
    finally:
        for name in ("helper", "own"):
            server.client.delete(f"/api/v1/services/{name}", headers=_h(bob))
        server.client.delete("/api/v1/secrets/api", headers=_h(bob))


def test_a_session_runs_calls_of_the_side_that_opened_it_only(fed: tuple[Server, str, str]) -> None:
    """A call is code that runs in the session's worker beside the other calls, whose results their
    caller loads: the hub cannot send one to bob's own session, nor bob to the hub's."""
    import sys

    server, hub, bob = fed
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    opened = {}
    for by, headers in (("own", _h(bob)), ("hub", _h(hub, "bob"))):
        made = server.client.post("/api/v1/calls/sessions", json={"python": python}, headers=headers)
        assert made.status_code == 201, made.text
        opened[by] = made.json()["id"]
    try:
        for target, headers, said in (
                ("own", _h(hub, "bob"), "opened with one of tenant bob's own tokens"),
                ("hub", _h(bob), "was opened by the federation for tenant bob")):
            refused = server.client.post(f"/api/v1/calls/sessions/{opened[target]}/calls",
                                         json={"payload": "AA=="}, headers=headers)
            assert refused.status_code == 403, refused.text
            assert said in refused.json()["message"]
        for target, headers in (("own", _h(bob)), ("hub", _h(hub, "bob"))):
            taken = server.client.post(f"/api/v1/calls/sessions/{opened[target]}/calls",
                                       json={"payload": "AA=="}, headers=headers)
            assert taken.status_code == 201, taken.text
    finally:
        for sid in opened.values():
            server.client.post(f"/api/v1/calls/sessions/{sid}/close", headers=server.headers())


def test_the_tenant_does_not_exec_into_work_the_hub_submitted_for_it(fed: tuple[Server, str, str]) -> None:
    """Such work runs as bob's on-behalf account, beside the hub's other work for bob (its sessions'
    workers among it): bob's exec there is refused with the reason; into its own work it is not."""
    import json

    server, hub, bob = fed
    body = {"command": ["sleep", "100"], "resources": {"gpus": 1}}
    ids = {}
    for by, headers in (("hub", _h(hub, "bob")), ("own", _h(bob))):
        made = server.client.post("/api/v1/workloads", json=body, headers=headers)
        assert made.status_code == 201, made.text
        ids[by] = made.json()["id"]
    try:
        server.wait_for(lambda: all(server.status(wid) == "running" for wid in ids.values()))
        answers = {}
        for by, wid in ids.items():
            with server.client.websocket_connect(f"/api/v1/workloads/{wid}/exec", headers=_h(bob)) as ws:
                ws.send_text(json.dumps({"command": ["id"]}))
                answers[by] = json.loads(ws.receive_text())
        assert answers["hub"] == {"status": 403, "error": (
            f"Workload {ids['hub']} was submitted by the federation for tenant bob and runs as bob's "
            "on-behalf account, which gpupool exec does not enter: exec runs inside the tenant's own work. "
            "Submit it with one of bob's tokens to exec into it.")}
        assert answers["own"].get("status") != 403, answers["own"]
    finally:
        for wid in ids.values():
            server.client.post(f"/api/v1/workloads/{wid}/cancel", headers=server.headers())
