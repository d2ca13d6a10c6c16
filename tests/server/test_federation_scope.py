"""The federation token scope on a member pool: a hub's token submits, reads and cancels work only
as the tenant it names, reads usage and the pool's summary, and nothing else (docs/federation.md)."""

from __future__ import annotations

import pytest

from conftest import Server

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
