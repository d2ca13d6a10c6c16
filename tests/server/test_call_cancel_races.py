"""A cancel of a remote call raced by its worker on PostgreSQL (where transactions run at once): the
worker's write is held open until the cancel waits on it, then committed, so each case is the same
interleaving on every run. What the cancel does must follow the status the worker left, never the one
it read before: a call handed out meanwhile is running, and only stopping its pod ends it; an answer
committed meanwhile stands."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Connection, create_engine, text

from factories import node
from gpupool.server import pgtemp
from gpupool.server.orm import RemoteCallRow, WorkloadRow
from live import LiveServer, live_server
from server.fakes import ManualProvider

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


Srv = tuple[LiveServer, str, str]
"""The server, alice's token, the store's URL."""


@pytest.fixture(scope="module")
def srv(postgres: pgtemp.TempPostgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Srv]:
    url = postgres.create_database()
    provider = ManualProvider([node("n0", devices=1)])
    with live_server(tmp_path_factory.mktemp("callraces"), provider, url) as server:
        with httpx.Client(base_url=f"{server.url}/api/v1",
                          headers={"Authorization": f"Bearer {server.admin_token}"}) as admin:
            admin.post("/nodes/n0/cordon").raise_for_status()  # every session's workload stays pending
            admin.post("/tenants", json={"name": "alice"}).raise_for_status()
            token = admin.post("/tokens", json={"tenant": "alice"}).json()["token"]
        yield server, token, url


def _call(server: LiveServer, api: httpx.Client) -> tuple[str, str]:
    """A session with one queued call: the session's id and the call's."""
    opened = api.post("/calls/sessions", json={"python": PYTHON, "call": {"payload": "AA=="}})
    assert opened.status_code == 201, opened.text
    return opened.json()["id"], opened.json()["call"]["id"]


HAND_OUT = [  # next_call: the session's row, then its oldest queued call to this pod
    "SELECT id FROM remote_sessions WHERE id = :s FOR UPDATE",
    "UPDATE remote_calls SET status = 'running', pod_id = 'p-1', attempts = attempts + 1 WHERE id = :c"]
ANSWER = [  # finish_call: the call this pod holds, answered
    "UPDATE remote_calls SET status = 'succeeded', result = 'ok', payload = '' "
    "WHERE id = :c AND status = 'running' AND pod_id = 'p-1'"]
WAITING = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
           "AND datname = current_database() AND query ILIKE '%remote_calls%'")


def _run(conn: Connection, statements: list[str], session_id: str, call_id: str) -> None:
    for sql in statements:
        conn.execute(text(sql), {k: v for k, v in (("s", session_id), ("c", call_id)) if f":{k}" in sql})


def _cancel_while(url: str, worker: list[str], api: httpx.Client, session_id: str,
                  call_id: str) -> dict[str, Any]:
    """Run the worker's statements in a transaction left open, cancel the call meanwhile, commit the
    worker's once the cancel waits on its locks; the cancel's answer."""
    engine = create_engine(url)
    answer: dict[str, Any] = {}

    def cancel() -> None:
        answer.update(api.post(f"/calls/{call_id}/cancel").json())

    try:
        with engine.connect() as held, \
                engine.connect().execution_options(isolation_level="AUTOCOMMIT") as watch:  # fresh reads
            held.execute(text("BEGIN"))
            _run(held, worker, session_id, call_id)
            thread = threading.Thread(target=cancel)
            thread.start()
            deadline = time.monotonic() + 30
            while not watch.execute(text(WAITING)).scalar():
                assert thread.is_alive(), f"the cancel did not wait on the worker's locks: {answer}"
                assert time.monotonic() < deadline, "the cancel never reached the worker's locks: " + repr([
                    tuple(r) for r in watch.execute(text(
                        "SELECT state, wait_event_type, wait_event, left(query, 120) FROM pg_stat_activity "
                        "WHERE datname = current_database()"))])
                time.sleep(0.01)
            held.execute(text("COMMIT"))
            thread.join(60)
    finally:
        engine.dispose()
    return answer


def _row(server: LiveServer, kind: type[Any], key: str) -> Any:
    with server.rt.store.read() as session:
        row = session.get(kind, key)
        assert row is not None
        return row


def _api(server: LiveServer, token: str) -> httpx.Client:
    return httpx.Client(base_url=f"{server.url}/api/v1", headers={"Authorization": f"Bearer {token}"},
                        timeout=60)


def test_a_call_handed_out_while_it_is_cancelled_stops_its_workload(srv: Srv) -> None:
    server, token, url = srv
    with _api(server, token) as api:
        session_id, call_id = _call(server, api)
        answer = _cancel_while(url, HAND_OUT, api, session_id, call_id)
    assert answer["status"] == "cancelled" and "was cancelled too" in answer["error"], answer
    # the pod that holds it is stopped with its workload: read as queued, it would run on, unanswered
    assert _row(server, WorkloadRow, session_id).status == "cancelled"
    assert _row(server, RemoteCallRow, call_id).status == "cancelled"


def test_an_answer_committed_while_its_call_is_cancelled_stands(srv: Srv) -> None:
    server, token, url = srv
    with _api(server, token) as api:
        session_id, call_id = _call(server, api)
        engine = create_engine(url)
        try:
            with engine.begin() as conn:  # handed out already
                _run(conn, HAND_OUT, session_id, call_id)
        finally:
            engine.dispose()
        answer = _cancel_while(url, ANSWER, api, session_id, call_id)
    assert answer["status"] == "succeeded", answer  # the cancel found it answered: nothing to cancel
    assert _row(server, RemoteCallRow, call_id).status == "succeeded"
    workload = _row(server, WorkloadRow, session_id)
    assert workload.status == "pending", (workload.status, workload.message)  # its session goes on
