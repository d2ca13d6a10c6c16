"""Writes that depend on a read, raced on PostgreSQL (where transactions run at once): each must be
serialised by a row lock, so that of two requests that are each valid alone, the second sees the
first. Every case failed on most rounds before its lock (two admins revoking each other left no
admin token; two tenants mapped to one Unix account; a quota and a lending limit stored as an
invalid pair, which stopped the scheduler; two admin tokens of one name; a 500 for two services of
one name)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from factories import node
from gpupool.server import pgtemp
from gpupool.server.orm import QueueRow, TenantRow, TokenRow
from live import LiveServer, live_server
from server.fakes import ManualProvider

ROUNDS = 5


@pytest.fixture(scope="module")
def srv(postgres: pgtemp.TempPostgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    provider = ManualProvider([node("n0", devices=8, model="H100")])
    with live_server(tmp_path_factory.mktemp("races"), provider, postgres.create_database()) as server:
        yield server


def api(server: LiveServer, token: str | None = None) -> httpx.Client:
    return httpx.Client(base_url=f"{server.url}/api/v1", timeout=60,
                        headers={"Authorization": f"Bearer {token or server.admin_token}"})


def at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls together (released by one barrier); their results in order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def count(server: LiveServer, query: Any) -> int:
    with server.rt.store.read() as session:
        return int(session.scalar(query) or 0)


def test_admin_tokens_of_one_name(srv: LiveServer) -> None:
    clients = [api(srv) for _ in range(8)]
    for r in range(ROUNDS):
        name = f"ci-{r}"
        codes = at_once([lambda c=c, n=name: c.post("/tokens", json={"name": n}).status_code
                         for c in clients])
        assert sorted(codes) == [201] + [409] * 7, codes
        assert count(srv, select(func.count()).select_from(TokenRow).where(
            TokenRow.tenant.is_(None), TokenRow.name == f"ci-{r}", TokenRow.revoked_s.is_(None))) == 1


def test_two_admins_revoking_each_other_keep_one_token(srv: LiveServer) -> None:
    with api(srv) as admin:
        for token in admin.get("/tokens").json():  # the bootstrap's token stays; the rest go
            if token["tenant"] is None and token["revoked_s"] is None and token["name"].startswith("ci-"):
                admin.delete(f"/tokens/{token['id']}")
        for r in range(ROUNDS):
            b, c = (admin.post("/tokens", json={"name": f"{x}{r}"}).json() for x in "bc")
            others = [t for t in admin.get("/tokens").json() if t["tenant"] is None and t["revoked_s"] is None
                      and t["scope"] == "full" and t["id"] not in (b["id"], c["id"])]
            for token in others:  # the admin's own last: b and c are then the only working ones
                assert api(srv, b["token"]).delete(f"/tokens/{token['id']}").status_code == 200
            codes = at_once([lambda x=b, y=c: api(srv, x["token"]).delete(f"/tokens/{y['id']}").status_code,
                             lambda x=c, y=b: api(srv, x["token"]).delete(f"/tokens/{y['id']}").status_code])
            # the loser is refused as the last token (409), or finds its own token revoked (401)
            assert codes.count(200) == 1 and set(codes) - {200} <= {401, 409}, codes
            left = b if codes[0] == 200 else c
            admin = api(srv, left["token"])  # the one left working
            assert count(srv, select(func.count()).select_from(TokenRow).where(
                TokenRow.tenant.is_(None), TokenRow.revoked_s.is_(None), TokenRow.scope == "full")) == 1
    srv.admin_token = left["token"]  # for the tests after this one


@pytest.mark.parametrize("how", ["create", "update"])
def test_two_tenants_are_never_mapped_to_one_account(srv: LiveServer, how: str) -> None:
    with api(srv) as admin:
        for r in range(ROUNDS):
            names = [f"{how[0]}{r}x{i}" for i in range(4)]
            if how == "update":
                for name in names:
                    assert admin.post("/tenants", json={"name": name}).status_code == 201
            calls = [(lambda n=n: api(srv).post("/tenants", json={"name": n, "unix_user": "nobody"}))
                     if how == "create" else
                     (lambda n=n: api(srv).patch(f"/tenants/{n}", json={"unix_user": "nobody"}))
                     for n in names]
            codes = sorted(answer.status_code for answer in at_once(calls))
            assert codes[-1] < 500 and count(srv, select(func.count()).select_from(TenantRow).where(
                TenantRow.unix_user == "nobody")) == 1, codes
            with srv.rt.store.write() as session:  # unmapped again for the next round
                for row in session.scalars(select(TenantRow).where(TenantRow.unix_user == "nobody")):
                    row.unix_user = None


def test_a_quota_and_a_lending_limit_changed_at_once_stay_a_valid_pair(srv: LiveServer) -> None:
    with api(srv) as admin:
        queue = {"tenant": "default", "name": "q", "quota_gpus": 10}
        assert admin.post("/queues", json=queue).status_code == 201
        for _ in range(ROUNDS):
            reset = {"quota_gpus": 10, "lending_limit_gpus": None}
            assert admin.patch("/queues/default/q", json=reset).status_code == 200
            codes = at_once([lambda: api(srv).patch("/queues/default/q", json={"lending_limit_gpus": 8}),
                             lambda: api(srv).patch("/queues/default/q", json={"quota_gpus": 4})])
            assert sorted(c.status_code for c in codes) == [200, 422], [c.text for c in codes]
            with srv.rt.store.read() as session:
                row = session.get(QueueRow, ("default", "q"))
                assert row is not None
                assert row.lending_limit_milli is None or row.lending_limit_milli <= row.quota_device_milli
        assert admin.get("/queues").status_code == 200


def test_two_services_of_one_name_at_once_are_one_and_a_409(srv: LiveServer, tmp_path: Path) -> None:
    for r in range(ROUNDS):
        body = {"name": f"svc{r}", "command": ["sleep", "1000"], "min_replicas": 0}
        codes = at_once([lambda b=body: api(srv).post("/services", json=b).status_code for _ in range(4)])
        assert sorted(codes) == [201, 409, 409, 409], codes
