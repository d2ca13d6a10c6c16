"""Token lifecycle through the API: scope, expiry, names, listing without secrets, revocation on
every server process, last use without a write per request, the admin token file, /metrics."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from fakes import ManualProvider
from sqlalchemy import select, update

from conftest import Server, make_runtime, start_server, stop_server
from factories import node
from gpupool.server import auth
from gpupool.server.auth import Authenticator
from gpupool.server.orm import TokenRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import tenants as tenants_service
from gpupool.server.services import tokens as tokens_service

API = "/api/v1"
DAY_S = 86400.0


def _token(server: Server, **body: object) -> dict[str, object]:
    return server.created("/tokens", body)


def _tenant(server: Server, name: str) -> None:
    server.created("/tenants", {"name": name})


def _get(server: Server, token: str, path: str = "/workloads") -> int:
    return server.client.get(f"{API}{path}", headers=server.headers(token)).status_code


def test_created_tokens_expire_after_90_days_by_default_and_when_asked(server: Server) -> None:
    _tenant(server, "team-a")
    default = _token(server, tenant="team-a", name="ci")
    assert default["expires_s"] == pytest.approx(float(default["created_s"]) + 90 * DAY_S)  # type: ignore[arg-type]
    short = _token(server, tenant="team-a", name="short", expires_in_s=3600)
    assert short["expires_s"] == pytest.approx(float(short["created_s"]) + 3600)  # type: ignore[arg-type]
    forever = _token(server, name="ops", never_expires=True)
    assert forever["expires_s"] is None and forever["tenant"] is None
    both = server.client.post(f"{API}/tokens", json={"name": "x", "expires_in_s": 5, "never_expires": True},
                              headers=server.headers())
    assert both.status_code == 422 and both.json()["code"] == "invalid_input"


def test_an_expired_token_gets_401_on_its_next_request(server: Server) -> None:
    _tenant(server, "team-a")
    created = _token(server, tenant="team-a", name="soon", expires_in_s=3600)
    token = str(created["token"])
    assert _get(server, token) == 200
    server.rt.clock = lambda: float(created["expires_s"]) + 1  # type: ignore[arg-type]
    answer = server.client.get(f"{API}/workloads", headers=server.headers(token))
    assert answer.status_code == 401 and "expired" in answer.json()["message"]


def test_names_are_unique_per_tenant_and_unnamed_tokens_are_named_by_their_id(server: Server) -> None:
    _tenant(server, "team-a")
    _tenant(server, "team-b")
    _token(server, tenant="team-a", name="ci")
    again = server.client.post(f"{API}/tokens", json={"tenant": "team-a", "name": "ci"},
                               headers=server.headers())
    assert again.status_code == 409 and "already has a token named 'ci'" in again.json()["message"]
    assert _token(server, tenant="team-b", name="ci")["tenant"] == "team-b"  # another tenant may
    unnamed = _token(server, tenant="team-a")
    assert unnamed["name"] == unnamed["id"]


def test_listing_shows_no_secret_and_tenants_see_only_their_own(server: Server) -> None:
    _tenant(server, "team-a")
    _tenant(server, "team-b")
    a = _token(server, tenant="team-a", name="a1")
    _token(server, tenant="team-b", name="b1")
    everything = server.client.get(f"{API}/tokens", headers=server.headers())
    assert everything.status_code == 200
    assert {t["name"] for t in everything.json()} == {"admin", "a1", "b1"}
    assert "token" not in everything.text and "sha256" not in everything.text
    assert str(a["token"]) not in everything.text
    own = server.client.get(f"{API}/tokens", headers=server.headers(str(a["token"])))
    assert [t["name"] for t in own.json()] == ["a1"]
    other = server.client.get(f"{API}/tokens", params={"tenant": "team-b"},
                              headers=server.headers(str(a["token"])))
    assert other.status_code == 403
    only_b = server.client.get(f"{API}/tokens", params={"tenant": "team-b"}, headers=server.headers())
    assert [t["name"] for t in only_b.json()] == ["b1"]


def test_tenants_cannot_create_tokens(server: Server) -> None:
    _tenant(server, "team-a")
    token = str(_token(server, tenant="team-a")["token"])
    answer = server.client.post(f"{API}/tokens", json={"tenant": "team-a"}, headers=server.headers(token))
    assert answer.status_code == 403


def test_revoked_token_is_refused_at_once_and_a_tenant_may_revoke_only_its_own(server: Server) -> None:
    _tenant(server, "team-a")
    _tenant(server, "team-b")
    a1 = _token(server, tenant="team-a", name="a1")
    a2 = _token(server, tenant="team-a", name="a2")
    b1 = _token(server, tenant="team-b", name="b1")
    a1_token = str(a1["token"])
    assert _get(server, a1_token) == 200
    foreign = server.client.delete(f"{API}/tokens/{b1['id']}", headers=server.headers(a1_token))
    assert foreign.status_code == 404  # another tenant's token does not exist for it
    answer = server.client.delete(f"{API}/tokens/{a2['id']}", headers=server.headers(a1_token))
    assert answer.status_code == 200 and answer.json()["revoked_s"] is not None
    assert _get(server, str(a2["token"])) == 401
    revoked = server.client.delete(f"{API}/tokens/{a1['id']}", headers=server.headers())
    assert revoked.status_code == 200
    refused = server.client.get(f"{API}/workloads", headers=server.headers(a1_token))
    assert refused.status_code == 401 and "revoked" in refused.json()["message"]
    again = server.client.delete(f"{API}/tokens/{a1['id']}", headers=server.headers())
    assert again.status_code == 200  # idempotent
    # A revoked name may be used again.
    assert _token(server, tenant="team-a", name="a1")["name"] == "a1"


def test_the_last_working_admin_token_cannot_be_revoked(server: Server) -> None:
    admin_id = server.client.get(f"{API}/tokens", headers=server.headers()).json()[0]["id"]
    refused = server.client.delete(f"{API}/tokens/{admin_id}", headers=server.headers())
    assert refused.status_code == 409 and "last working admin token" in refused.json()["message"]
    spare = _token(server, name="spare", never_expires=True)
    assert server.client.delete(f"{API}/tokens/{admin_id}", headers=server.headers()).status_code == 200
    assert _get(server, server.admin_token) == 401
    assert _get(server, str(spare["token"])) == 200


def test_a_revocation_reaches_another_server_process_within_the_cache_lifetime(
        server_factory: Callable[..., Server], db_url: str, tmp_path: Path) -> None:
    first = server_factory(db_url)
    _tenant(first, "team-a")
    created = _token(first, tenant="team-a", name="shared")
    token = str(created["token"])
    # A second process over the same store, with a clock for its cache that the test moves.
    second_rt, _ = make_runtime(db_url, tmp_path / "second", ManualProvider([node("n0")]))
    ticks = [1000.0]
    second = Authenticator(second_rt.store, monotonic=lambda: ticks[0])
    try:
        assert second.principal(f"Bearer {token}").tenant == "team-a"
        revoked = first.client.delete(f"{API}/tokens/{created['id']}", headers=first.headers())
        assert revoked.status_code == 200
        ticks[0] += auth.CACHE_TTL_S / 2
        assert second.principal(f"Bearer {token}").tenant == "team-a"  # still inside the cache lifetime
        ticks[0] += auth.CACHE_TTL_S
        with pytest.raises(auth.Unauthorized, match="revoked"):
            second.principal(f"Bearer {token}")
        assert auth.CACHE_TTL_S <= 1.0
    finally:
        second_rt.store.close()


def test_last_use_is_remembered_and_written_in_the_background(server: Server) -> None:
    _tenant(server, "team-a")
    created = _token(server, tenant="team-a", name="used")
    token = str(created["token"])
    for _ in range(20):
        assert _get(server, token) == 200
    server.rt.auth.flush()
    listed = server.client.get(f"{API}/tokens", params={"tenant": "team-a"}, headers=server.headers()).json()
    assert listed[0]["last_used_s"] is not None and listed[0]["last_used_s"] >= created["created_s"]


def test_last_use_is_not_a_store_write_per_request(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    _tenant(server, "team-a")
    token = str(_token(server, tenant="team-a")["token"])
    writes: list[int] = []
    real_write = Authenticator._write

    def counting(self: Authenticator, used: dict[str, float], refusals: dict[object, int]) -> None:
        writes.append(len(used))
        real_write(self, used, refusals)  # type: ignore[arg-type]

    monkeypatch.setattr(Authenticator, "_write", counting)
    server.wait_for(lambda: not server.rt.auth._flushing)
    ticks = [5000.0]
    server.rt.auth._monotonic = lambda: ticks[0]
    server.rt.auth._next_used_flush = ticks[0] + auth.LAST_USED_FLUSH_S
    for _ in range(50):
        assert _get(server, token) == 200
    assert writes == []  # fifty requests within one flush interval: nothing written yet
    ticks[0] += auth.LAST_USED_FLUSH_S
    assert _get(server, token) == 200
    server.wait_for(lambda: not server.rt.auth._flushing and len(writes) == 1)
    assert writes[0] >= 1  # one write, for every token used since the last


def test_metrics_needs_the_admin_or_a_metrics_token(server: Server) -> None:
    _tenant(server, "team-a")
    tenant_token = str(_token(server, tenant="team-a")["token"])
    metrics_token = str(_token(server, name="prometheus", scope="metrics")["token"])
    assert server.client.get("/metrics").status_code == 401
    assert server.client.get("/metrics", headers=server.headers(tenant_token)).status_code == 403
    ok = server.client.get("/metrics", headers=server.headers(metrics_token))
    assert ok.status_code == 200 and "gpupool_workloads" in ok.text
    assert server.client.get("/metrics", headers=server.headers()).status_code == 200
    # A metrics token reads nothing else, and cannot submit through the fast path either.
    assert _get(server, metrics_token) == 403
    submitted = server.client.post(f"{API}/workloads", json={"command": ["true"]},
                                   headers=server.headers(metrics_token))
    assert submitted.status_code == 403


def test_a_tenant_cannot_hold_a_metrics_token(server: Server) -> None:
    # /metrics names every tenant's use: a tenant-owned metrics token read all of it
    _tenant(server, "team-a")
    answer = server.client.post(f"{API}/tokens", json={"tenant": "team-a", "scope": "metrics"},
                                headers=server.headers())
    assert answer.status_code == 422, answer.text
    assert "only the admin owns one" in answer.json()["message"]
    # one stored before this rule is refused at /metrics (and, as any metrics token, elsewhere)
    from gpupool.server.auth import Scope, new_token
    from gpupool.server.services.tokens import token_row

    legacy = new_token()
    with server.rt.store.write() as session:
        session.add(token_row(legacy, "team-a", "old-prom", server.rt.clock(), scope=Scope.METRICS))
    refused = server.client.get("/metrics", headers=server.headers(legacy))
    assert refused.status_code == 403 and "admin metrics token" in refused.json()["message"]
    assert _get(server, legacy) == 403


def test_metrics_public_serves_without_a_token(tmp_path: Path) -> None:
    from dataclasses import replace

    server = start_server(tmp_path)
    try:
        server.rt.settings = replace(server.rt.settings, metrics_public=True)
        assert server.client.get("/metrics").status_code == 200
    finally:
        stop_server(server)


def test_metrics_public_is_refused_with_a_non_loopback_host() -> None:
    from gpupool.errors import InvalidInput
    from gpupool.server.settings import Settings

    with pytest.raises(InvalidInput, match="loopback"):
        Settings(host="0.0.0.0", metrics_public=True)
    assert Settings(host="127.0.0.1", metrics_public=True).metrics_public


def test_the_admin_token_file_is_written_privately_before_its_hash_is_stored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"

    def crash(path: Path, text: str) -> None:
        raise OSError("simulated crash while writing the token file")

    monkeypatch.setattr(tenants_service, "write_private_file", crash)
    rt = _bootstrap_fails(url, tmp_path)
    with rt.store.read() as session:
        assert session.scalars(select(TokenRow)).all() == []  # no hash without the file
    rt.store.close()
    monkeypatch.undo()
    rt, token = make_runtime(url, tmp_path, ManualProvider([node("n0")]))
    try:
        path = tmp_path / "admin-token"
        assert token is not None and path.read_text() == token + "\n"
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".admin-token")]  # no temp left
        with rt.store.read() as session:
            row = session.scalars(select(TokenRow)).one()
            assert row.tenant is None and row.expires_s is None  # the first admin token never expires
        again = tenants_service.bootstrap(rt)
        assert again is None and path.read_text() == token + "\n"  # a restart keeps both
    finally:
        rt.store.close()


def _bootstrap_fails(url: str, data_dir: Path) -> Runtime:
    from gpupool.server.db import Store
    from gpupool.server.settings import Settings

    rt = Runtime(settings=Settings(data_dir=data_dir, database_url=url), store=Store.open(url),
                 provider=ManualProvider([node("n0")]))
    with pytest.raises(OSError, match="simulated crash"):
        tenants_service.bootstrap(rt)
    return rt


def test_write_private_file_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    tokens_service.write_private_file(path, "one\n")
    tokens_service.write_private_file(path, "two\n")
    assert path.read_text() == "two\n" and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret"]


def test_existing_unnamed_tokens_get_their_id_as_name_on_upgrade(tmp_path: Path) -> None:
    from gpupool.server.db import make_engine, upgrade

    engine = make_engine(f"sqlite:///{tmp_path / 'old.sqlite'}")
    try:
        upgrade(engine, "0001")
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO tenants (name, created_s) VALUES ('team-a', 1.0)")
            conn.exec_driver_sql("INSERT INTO tokens (id, token_sha256, tenant, name, created_s) "
                                 "VALUES ('tok-old', 'abc', 'team-a', '', 1.0)")
        upgrade(engine)
        with engine.begin() as conn:
            token = conn.exec_driver_sql("SELECT name, scope, expires_s, revoked_s FROM tokens").one()
            tenant = conn.exec_driver_sql("SELECT max_priority, max_pending, unix_user FROM tenants").one()
            conn.execute(update(TokenRow).values(last_used_s=2.0))
        assert tuple(token) == ("tok-old", "full", None, None)
        assert tuple(tenant) == (0, 10_000, None)
    finally:
        engine.dispose()
