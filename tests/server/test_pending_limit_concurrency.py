"""Many submitters at once never push a tenant past max_pending: one server on SQLite and on
PostgreSQL, and two server processes' worth of writers over one PostgreSQL store."""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from fakes import ManualProvider
from sqlalchemy import func, select

from factories import node
from gpupool.server.orm import WorkloadRow
from live import LiveServer, live_server

LIMIT = 25
THREADS = 8
EACH = 10


def _prepare(srv: LiveServer) -> str:
    with httpx.Client(base_url=srv.url + "/api/v1",
                      headers={"Authorization": f"Bearer {srv.admin_token}"}) as admin:
        admin.post("/nodes/n0/cordon").raise_for_status()  # everything stays pending
        admin.post("/tenants", json={"name": "team-a", "max_pending": LIMIT}).raise_for_status()
        return str(admin.post("/tokens", json={"tenant": "team-a"}).json()["token"])


def _flood(urls: list[str], token: str) -> Counter[int]:
    codes: Counter[int] = Counter()
    lock = threading.Lock()

    def submitter(url: str) -> None:
        with httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                          timeout=60) as client:
            for _ in range(EACH):
                answer = client.post("/workloads", json={"command": ["x"], "resources": {"gpus": 0.5}})
                with lock:
                    codes[answer.status_code] += 1

    threads = [threading.Thread(target=submitter, args=(urls[i % len(urls)],)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


def _pending(srv: LiveServer) -> int:
    with srv.rt.store.read() as session:
        query = select(func.count()).select_from(WorkloadRow).where(
            WorkloadRow.tenant == "team-a", WorkloadRow.status == "pending")
        return int(session.scalar(query) or 0)


def test_concurrent_submitters_never_exceed_max_pending(tmp_path: Path, db_url: str) -> None:
    with live_server(tmp_path, ManualProvider([node("n0", devices=8, model="H100")]), db_url) as srv:
        token = _prepare(srv)
        codes = _flood([srv.url], token)
        assert codes == Counter({201: LIMIT, 429: THREADS * EACH - LIMIT})
        assert _pending(srv) == LIMIT


def test_two_server_processes_on_one_postgresql_store_never_exceed_max_pending(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    postgres = request.getfixturevalue("postgres")
    url = postgres.create_database()
    with ExitStack() as stack:
        servers = [stack.enter_context(live_server(tmp_path / f"s{i}",
                                                   ManualProvider([node("n0", devices=8, model="H100")]),
                                                   url))
                   for i in range(2)]
        token = _prepare(servers[0])
        codes = _flood([s.url for s in servers], token)
        assert codes == Counter({201: LIMIT, 429: THREADS * EACH - LIMIT})
        assert _pending(servers[0]) == LIMIT
