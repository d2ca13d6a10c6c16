"""The audit log: every admin action with who, what, when and from where; refused logins coalesced."""

from __future__ import annotations

import contextlib

import httpx

from conftest import Server
from gpupool.server import auth
from gpupool.server.ratelimit import TenantRates

API = "/api/v1"


def _audit(server: Server, **params: object) -> list[dict[str, object]]:
    answer = server.client.get(f"{API}/audit", params=params, headers=server.headers())
    assert answer.status_code == 200, answer.text
    return list(answer.json())


def _ok(answer: httpx.Response) -> dict[str, object]:
    status = answer.status_code
    assert status in (200, 201), answer.text
    return dict(answer.json())


def test_every_admin_action_is_recorded(server: Server) -> None:
    c, h = server.client, server.headers()
    _ok(c.post(f"{API}/tenants", json={"name": "team-a"}, headers=h))
    _ok(c.patch(f"{API}/tenants/team-a", json={"max_priority": 3}, headers=h))
    _ok(c.post(f"{API}/queues", json={"tenant": "team-a", "name": "batch"}, headers=h))
    _ok(c.patch(f"{API}/queues/team-a/batch", json={"quota_gpus": 2}, headers=h))
    token = _ok(c.post(f"{API}/tokens", json={"tenant": "team-a", "name": "ci"}, headers=h))
    _ok(c.delete(f"{API}/tokens/{token['id']}", headers=h))
    for verb in ("cordon", "uncordon", "drain"):
        _ok(c.post(f"{API}/nodes/n0/{verb}", headers=h))
    rows = _audit(server)
    assert [(r["action"], r["target"]) for r in reversed(rows)] == [
        ("tenant.create", "team-a"), ("tenant.update", "team-a"), ("queue.create", "team-a/batch"),
        ("queue.update", "team-a/batch"), ("token.create", token["id"]), ("token.revoke", token["id"]),
        ("node.cordon", "n0"), ("node.uncordon", "n0"), ("node.drain", "n0"),
    ]
    admin_id = c.get(f"{API}/tokens", params={}, headers=h).json()[0]["id"]
    assert {(r["actor"], r["token_id"], r["remote"]) for r in rows} == {("admin", admin_id, "testclient")}
    assert "max_priority=3" in str(rows[-2]["detail"])
    assert str(token["token"]) not in str(rows)  # never a secret


def test_a_tenant_revoking_its_own_token_is_recorded_as_that_tenant(server: Server) -> None:
    c, h = server.client, server.headers()
    _ok(c.post(f"{API}/tenants", json={"name": "team-a"}, headers=h))
    token = _ok(c.post(f"{API}/tokens", json={"tenant": "team-a"}, headers=h))
    _ok(c.delete(f"{API}/tokens/{token['id']}", headers=server.headers(str(token["token"]))))
    newest = _audit(server, limit=1)[0]
    assert (newest["actor"], newest["action"], newest["token_id"]) == ("team-a", "token.revoke", token["id"])


def test_only_the_admin_reads_the_log_and_since_and_limit_narrow_it(server: Server) -> None:
    c, h = server.client, server.headers()
    _ok(c.post(f"{API}/tenants", json={"name": "team-a"}, headers=h))
    token = _ok(c.post(f"{API}/tokens", json={"tenant": "team-a"}, headers=h))
    assert c.get(f"{API}/audit", headers=server.headers(str(token["token"]))).status_code == 403
    rows = _audit(server)
    assert len(_audit(server, limit=1)) == 1
    assert _audit(server, since_s=float(str(rows[0]["at_s"])) + 1) == []
    assert c.get(f"{API}/audit", params={"limit": 0}, headers=h).status_code == 422


def test_a_flood_of_bad_tokens_is_coalesced_into_a_few_rows_with_a_count(server: Server) -> None:
    for i in range(300):
        answer = server.client.get(f"{API}/workloads", headers={"Authorization": f"Bearer gp_bad{i}"})
        assert answer.status_code == 401
    assert server.client.get(f"{API}/nodes").status_code == 401  # no token at all
    server.wait_for(lambda: not server.rt.auth._flushing)
    refused = [r for r in _audit(server, limit=1000) if r["action"] == "auth.refused"]
    assert sum(int(str(r["count"])) for r in refused) == 301
    assert len(refused) <= 4  # the first of the minute at once, the rest together, per reason
    assert {r["detail"] for r in refused} == {"unknown token", "no token"}
    assert {r["remote"] for r in refused} == {"testclient"}


def test_refusals_are_written_at_most_once_per_window(server: Server) -> None:
    ticks = [10_000.0]
    server.rt.auth._monotonic = lambda: ticks[0]
    server.rt.auth._next_refusal_flush = 0.0
    for _ in range(3):
        for _ in range(50):
            server.client.get(f"{API}/pool", headers={"Authorization": "Bearer gp_bad"})
        server.wait_for(lambda: not server.rt.auth._flushing)
        ticks[0] += auth.REFUSAL_WINDOW_S / 3
    server.rt.auth.flush()
    refused = [r for r in _audit(server, limit=1000) if r["action"] == "auth.refused"]
    assert sum(int(str(r["count"])) for r in refused) == 150
    assert len(refused) <= 3  # three windows' worth at most, never one row per refusal


def test_too_many_addresses_are_counted_together(server: Server) -> None:
    a = server.rt.auth
    a._next_refusal_flush = float("inf")  # hold everything in memory
    for i in range(auth.MAX_REFUSAL_KEYS + 40):
        with contextlib.suppress(auth.Unauthorized):
            a.principal("Bearer gp_bad", remote=f"10.0.{i // 256}.{i % 256}")
    assert len(a._refusals) == auth.MAX_REFUSAL_KEYS + 1
    a.flush()
    refused = [r for r in _audit(server, limit=1000) if r["action"] == "auth.refused"]
    assert sum(int(str(r["count"])) for r in refused) == auth.MAX_REFUSAL_KEYS + 40


def test_a_tenant_probing_with_403s_leaves_a_coalesced_trace(server: Server) -> None:
    # A valid tenant token asking for the admin's routes was refused without a trace
    server.rt.tenant_rates = TenantRates("off")  # 80 requests at once: the trace, not the rate
    c, h = server.client, server.headers()
    _ok(c.post(f"{API}/tenants", json={"name": "mallory"}, headers=h))
    token = _ok(c.post(f"{API}/tokens", json={"tenant": "mallory", "name": "probe"}, headers=h))
    theirs = server.headers(str(token["token"]))
    for _ in range(40):
        assert c.get(f"{API}/audit", headers=theirs).status_code == 403
        assert c.post(f"{API}/tenants", json={"name": "x"}, headers=theirs).status_code == 403
        assert c.post(f"{API}/workloads", json={"command": ["true"], "tenant": "default"},
                      headers=theirs).status_code == 403  # through the submission fast path
    server.rt.auth.flush()
    forbidden = [r for r in _audit(server, limit=1000) if r["action"] == "auth.forbidden"]
    assert sum(int(str(r["count"])) for r in forbidden) == 120
    assert len(forbidden) <= 6  # coalesced per reason, never one row per request
    assert {(r["actor"], r["token_id"], r["remote"]) for r in forbidden} == {
        ("mallory", token["id"], "testclient")}
    assert any("it cannot act for 'default'" in str(r["detail"]) for r in forbidden)


def test_the_admin_cancelling_a_tenants_work_is_audited(server: Server) -> None:
    c, h = server.client, server.headers()
    _ok(c.post(f"{API}/tenants", json={"name": "team-a"}, headers=h))
    token = _ok(c.post(f"{API}/tokens", json={"tenant": "team-a"}, headers=h))
    theirs = server.headers(str(token["token"]))
    own = _ok(c.post(f"{API}/workloads", json={"command": ["true"]}, headers=theirs))
    mine = _ok(c.post(f"{API}/workloads", json={"command": ["true"]}, headers=theirs))
    array = _ok(c.post(f"{API}/workloads", json={"command": ["true"], "array": "0-3"}, headers=theirs))
    _ok(c.post(f"{API}/workloads/{own['id']}/cancel", headers=theirs))  # the tenant's own act
    _ok(c.post(f"{API}/workloads/{mine['id']}/cancel", headers=h))
    _ok(c.post(f"{API}/workloads/arrays/{array['id']}/cancel", headers=h))
    rows = [(r["actor"], r["action"], r["target"], r["detail"]) for r in _audit(server)
            if str(r["action"]).endswith(".cancel")]
    assert [row[:3] for row in rows] == [("admin", "array.cancel", array["id"]),
                                         ("admin", "workload.cancel", mine["id"])]
    assert rows[0][3] == "tenant=team-a tasks=4"
    assert str(rows[1][3]).startswith("tenant=team-a was=")  # pending or running: the loop runs
