"""A tenant naming another tenant's ids locks nothing of its owner's (PostgreSQL, where a row lock
holds up every other writer of the row until the commit). Each case holds alice's row locked in a
transaction of its own, sends mallory's request, and looks at both: mallory's answer (404) must come
while the lock is still held; her request waiting on the lock fails the case. Before, each request
read the row FOR UPDATE and only then checked whose it was: repeated, it held up the scheduler's
admissions of alice's work (an array's cancel locked up to 10,000 of her rows)."""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from factories import node
from gpupool.server import pgtemp
from live import LiveServer, live_server
from server.fakes import ManualProvider

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


class World:
    def __init__(self, server: LiveServer, url: str, tokens: dict[str, str]) -> None:
        self.server, self.url, self.tokens = server, url, tokens

    def api(self, tenant: str) -> httpx.Client:
        return httpx.Client(base_url=f"{self.server.url}/api/v1", timeout=60,
                            headers={"Authorization": f"Bearer {self.tokens[tenant]}"})


@pytest.fixture(scope="module")
def world(postgres: pgtemp.TempPostgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    url = postgres.create_database()
    provider = ManualProvider([node("n0", devices=1)])
    with live_server(tmp_path_factory.mktemp("foreign"), provider, url) as server:
        tokens = {}
        with httpx.Client(base_url=f"{server.url}/api/v1",
                          headers={"Authorization": f"Bearer {server.admin_token}"}) as admin:
            admin.post("/nodes/n0/cordon").raise_for_status()  # alice's work stays pending
            for tenant in ("alice", "mallory"):
                admin.post("/tenants", json={"name": tenant}).raise_for_status()
                tokens[tenant] = admin.post("/tokens", json={"tenant": tenant}).json()["token"]
        yield World(server, url, tokens)


WAITING = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
           "AND datname = current_database() AND query ILIKE '%FOR UPDATE%'")
"""A locking read waits (the requests' reads: the server's loop writes the pending rows' reasons
with plain UPDATEs, which wait on the held rows too and are not the requests')."""


def _answered_while_locked(world: World, lock_sql: str, key: str, request: Callable[[], httpx.Response]
                           ) -> httpx.Response:
    """Lock alice's rows (`lock_sql` with :k = `key`), send `request` meanwhile; its answer, given
    while the lock was still held (fails when it waits on the lock instead)."""
    engine = create_engine(world.url)
    answer: dict[str, Any] = {}
    try:
        with engine.connect() as held, \
                engine.connect().execution_options(isolation_level="AUTOCOMMIT") as watch:
            held.execute(text("BEGIN"))
            assert held.execute(text(lock_sql), {"k": key}).all(), "nothing of alice's to lock"
            thread = threading.Thread(target=lambda: answer.update(done=request()))
            thread.start()
            deadline = time.monotonic() + 30
            while thread.is_alive():
                assert not watch.execute(text(WAITING)).scalar(), "the request waited on alice's locked row"
                assert time.monotonic() < deadline, "the request was not answered"
                time.sleep(0.01)
            held.execute(text("ROLLBACK"))
    finally:
        engine.dispose()
    done: httpx.Response = answer["done"]
    return done


WORKLOAD = "SELECT id FROM workloads WHERE id = :k FOR UPDATE"
ARRAY = "SELECT id FROM workloads WHERE array_id = :k FOR UPDATE"
SESSION = "SELECT id FROM remote_sessions WHERE id = :k FOR UPDATE"


def test_another_tenants_workload_is_not_locked_by_a_request_for_it(world: World) -> None:
    with world.api("alice") as alice, world.api("mallory") as mallory:
        workload_id = alice.post("/workloads", json={"command": ["x"]}).json()["id"]
        for verb in ("cancel", "hold", "requeue"):
            send = functools.partial(mallory.post, f"/workloads/{workload_id}/{verb}")
            refused = _answered_while_locked(world, WORKLOAD, workload_id, send)
            assert refused.status_code == 404, (verb, refused.text)
        refused = _answered_while_locked(world, WORKLOAD, workload_id, lambda: mallory.patch(
            f"/workloads/{workload_id}", json={"priority": 5}))
        assert refused.status_code == 404, refused.text
        assert alice.get(f"/workloads/{workload_id}").json()["status"] == "pending"


def test_another_tenants_array_is_not_locked_by_its_cancel(world: World) -> None:
    with world.api("alice") as alice, world.api("mallory") as mallory:
        array_id = alice.post("/workloads", json={"command": ["x"], "array": "0-3"}).json()["id"]
        refused = _answered_while_locked(world, ARRAY, array_id,
                                         lambda: mallory.post(f"/workloads/arrays/{array_id}/cancel"))
        assert refused.status_code == 404, refused.text
        assert alice.post(f"/workloads/arrays/{array_id}/cancel").json()["cancelled"] == 4


def test_another_tenants_session_is_not_locked_by_a_call_or_a_close(world: World) -> None:
    with world.api("alice") as alice, world.api("mallory") as mallory:
        session_id = alice.post("/calls/sessions", json={"python": PYTHON}).json()["id"]
        refused = _answered_while_locked(world, SESSION, session_id, lambda: mallory.post(
            f"/calls/sessions/{session_id}/calls", json={"payload": "AA=="}))
        assert refused.status_code == 404, refused.text
        refused = _answered_while_locked(world, SESSION, session_id,
                                         lambda: mallory.post(f"/calls/sessions/{session_id}/close"))
        assert refused.status_code == 404, refused.text
        assert alice.post(f"/calls/sessions/{session_id}/close").status_code == 200
