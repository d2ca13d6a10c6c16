"""Requests with tokens this pool does not know (server/auth.py, server/ratelimit.py): each costs a
store read, so a refused token is remembered, and an address whose refused tokens pass a tenant's
request rate has its next tokens that are not the pool's answered 429 unread. A stranger's made-up
tokens took the API from every tenant before (bench/tenant_flood.py --flood-token random)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import pytest

from conftest import Server
from gpupool.errors import TooManyRequests, Unauthorized
from gpupool.server import auth as auth_module
from gpupool.server.auth import Authenticator
from gpupool.server.orm import AuditRow
from gpupool.server.ratelimit import TenantRates

API = "/api/v1"


def _count_loads(monkeypatch: pytest.MonkeyPatch, auth: Authenticator) -> list[str]:
    """The digests `auth` reads from the store, in order."""
    loads: list[str] = []
    real: Callable[..., Any] = auth._load

    def counted(digest: str, mono: float) -> Any:
        loads.append(digest)
        return real(digest, mono)

    monkeypatch.setattr(auth, "_load", counted)
    return loads


def _bearer(token: str) -> str:
    return f"Bearer {token}"


def test_a_refused_token_is_read_from_the_store_once_a_while(server: Server,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    auth = Authenticator(server.rt.store, monotonic=lambda: now[0])
    loads = _count_loads(monkeypatch, auth)
    for _ in range(5):
        with pytest.raises(Unauthorized, match="The token is not valid"):
            auth.principal(_bearer("gp_made-up"))
    assert len(loads) == 1
    server.created("/tenants", {"name": "team-a"})
    made = server.created("/tokens", {"tenant": "team-a"})
    token = str(made["token"])
    assert auth.principal(_bearer(token)).tenant == "team-a"
    assert server.client.delete(f"{API}/tokens/{made['id']}", headers=server.headers()).status_code == 200
    now[0] += auth_module.CACHE_TTL_S + 1  # the revocation is read once the resolved token is stale
    for _ in range(3):
        with pytest.raises(Unauthorized, match="revoked"):
            auth.principal(_bearer(token))
    assert len(loads) == 3  # the unknown one, the valid one's second look, the revoked one once
    now[0] += auth_module.REFUSED_TTL_S + 1
    with pytest.raises(Unauthorized, match="not valid"):
        auth.principal(_bearer("gp_made-up"))
    assert len(loads) == 4  # read again after a while
    auth.forget()
    with pytest.raises(Unauthorized, match="not valid"):
        auth.principal(_bearer("gp_made-up"))
    assert len(loads) == 5 and not auth.may_be_valid(_bearer("gp_made-up"))


def test_the_refused_tokens_kept_are_bounded(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth_module, "MAX_REFUSED_KEPT", 3)
    auth = Authenticator(server.rt.store)
    loads = _count_loads(monkeypatch, auth)
    for name in ("a", "b", "c", "d"):
        with pytest.raises(Unauthorized):
            auth.principal(_bearer(name))
    assert len(auth._refused_tokens) == 3
    with pytest.raises(Unauthorized):
        auth.principal(_bearer("d"))  # the newest is kept
    with pytest.raises(Unauthorized):
        auth.principal(_bearer("a"))  # the oldest went first
    assert len(loads) == 5


def test_an_address_sending_unknown_tokens_is_answered_429_unread_past_the_bound(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    server.created("/tenants", {"name": "team-a"})
    used = str(server.created("/tokens", {"tenant": "team-a", "name": "used"})["token"])
    fresh = str(server.created("/tokens", {"tenant": "team-a", "name": "fresh"})["token"])
    assert server.client.get(f"{API}/workloads", headers=server.headers(used)).status_code == 200
    server.rt.tenant_rates = TenantRates("5/minute")
    now = [1000.0]
    monkeypatch.setattr(server.rt.auth, "_monotonic", lambda: now[0])
    loads = _count_loads(monkeypatch, server.rt.auth)

    def made_up() -> int:
        made = server.headers(secrets.token_urlsafe(16))
        return server.client.get(f"{API}/workloads", headers=made).status_code

    assert [made_up() for _ in range(5)] == [401] * 5
    assert len(loads) == 5  # one store read each: the route finds the gate's refusal remembered
    refused = server.client.get(f"{API}/workloads", headers=server.headers(secrets.token_urlsafe(16)))
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert refused.json()["code"] == "too_many_requests"
    assert "carried a token this pool does not know; this one was not read" in refused.json()["message"]
    assert [made_up() for _ in range(20)] == [429] * 20
    assert len(loads) == 5  # none of them read
    # the pool's tokens still pass from that address: one that worked here before, one never seen
    # here (found among the store's tokens), the admin's
    for token in (used, fresh, server.admin_token):
        assert server.client.get(f"{API}/workloads", headers=server.headers(token)).status_code == 200
    # one made since the store's tokens were last read waits until they are read again
    later = str(server.created("/tokens", {"tenant": "team-a", "name": "later"})["token"])
    assert server.client.get(f"{API}/workloads", headers=server.headers(later)).status_code == 429
    now[0] += auth_module.DIGESTS_MAX_AGE_S + 0.1
    assert server.client.get(f"{API}/workloads", headers=server.headers(later)).status_code == 200
    revoked = server.created("/tokens", {"tenant": "team-a", "name": "revoked"})
    assert server.client.delete(f"{API}/tokens/{revoked['id']}", headers=server.headers()).status_code == 200
    now[0] += auth_module.DIGESTS_MAX_AGE_S + 0.1
    answer = server.client.get(f"{API}/workloads", headers=server.headers(str(revoked["token"])))
    assert answer.status_code == 429  # not among the pool's tokens any more
    server.rt.auth.flush()
    with server.rt.store.read() as session:
        rows = session.query(AuditRow).filter(AuditRow.action == "auth.refused").all()
    throttled = [r for r in rows if r.detail == "too many refused tokens from this address"]
    assert sum(r.count for r in throttled) == 23 and {r.remote for r in throttled} == {"testclient"}
    assert sum(r.count for r in rows if r.detail == "unknown token") == 5  # each recorded by its route


def test_a_worker_pods_call_tokens_are_not_counted_or_read(server: Server,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    server.rt.tenant_rates = TenantRates("2/minute")
    loads = _count_loads(monkeypatch, server.rt.auth)
    for _ in range(6):  # checked by their signature at their one route
        answer = server.client.post(f"{API}/calls/worker/next", json={"wait_s": 0},
                                    headers=server.headers(f"gpf_pod-{secrets.token_hex(4)}.bad"))
        assert answer.status_code == 401, answer.text
    assert loads == []
    # elsewhere a call token is a token like any other
    assert [server.client.get(f"{API}/workloads", headers=server.headers("gpf_x.y")).status_code
            for _ in range(3)] == [401, 401, 429]


def test_counting_starts_no_thread_and_sweeps_what_left_every_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`limits`' storage started a timer thread 10 ms after any count to sweep every key: with
    20,000 addresses counted that took 0.79 of a core under light traffic (bench/rate_storage.py)."""
    import threading

    from limits import parse_many
    from limits.storage import memory
    from limits.strategies import MovingWindowRateLimiter

    from gpupool.server.ratelimit import SweptMemoryStorage

    storage = SweptMemoryStorage()
    limiter = MovingWindowRateLimiter(storage)
    (item,) = parse_many("5/second")
    before = {t.ident for t in threading.enumerate()}
    for i in range(50):
        limiter.hit(item, "refused", f"10.0.{i}.1")
    assert {t.ident for t in threading.enumerate()} <= before  # no sweeping thread started
    assert len(storage.events) == 50
    now = memory.time.time()
    monkeypatch.setattr(memory.time, "time", lambda: now + 2)  # every entry has left its window
    limiter.hit(item, "refused", "10.9.9.9")
    assert len(storage.events) == 51  # swept at most once a second
    storage._next_sweep = 0.0
    assert limiter.hit(item, "refused", "10.9.9.9")
    assert [key.split("/")[2] for key in storage.events] == ["10.9.9.9"]  # the others were swept


def test_an_ipv6_network_is_counted_as_one_address() -> None:
    rates = TenantRates("2/minute")
    rates.note_refused("2001:db8::1")
    rates.note_refused("2001:db8::abcd:2")  # the same /64: one count
    with pytest.raises(TooManyRequests, match="from 2001:db8::ffff"):
        rates.check_address("2001:db8::ffff")
    rates.check_address("2001:db8:0:1::1")  # another /64
    rates.note_refused("::ffff:10.0.0.1")
    rates.note_refused("10.0.0.1")  # an IPv4 address, however it arrives
    with pytest.raises(TooManyRequests):
        rates.check_address("10.0.0.1")
    rates.check_address("10.0.0.2")
