"""The overview shows which server leads the pool: its id, its epoch and the age of its lease, read
from `GET /servers` (admins only), for several `gpupool up --ha` servers on one PostgreSQL, and says
so for a single server; a tenant's overview asks nothing it may not see."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from gpupool.server import pgtemp
from ports import free_port
from server.upproc import UpProcess, until
from ui.browser import Watched

pytestmark = pytest.mark.slow
LEASE_S = 30.0
"""Nothing here waits for a lease to run out, so it is long: with 3 s, a leader a loaded machine held
up for 3 s lost its lease mid-test and the page rightly named the server that took over."""
LEASE = {"GPUPOOL_LEASE_S": f"{LEASE_S:g}", "GPUPOOL_LEASE_RENEW_S": "0.5"}


@pytest.fixture(scope="module")
def ha_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[UpProcess]]:
    reason = pgtemp.why_unavailable()
    if reason:
        pytest.skip(f"several servers need PostgreSQL: {reason}")
    pg = pgtemp.start(free_port=free_port)
    root = tmp_path_factory.mktemp("ha-ui")
    servers: list[UpProcess] = []
    try:
        env = {"GPUPOOL_DATABASE_URL": pg.create_database(), **LEASE}
        for name in ("a", "b"):
            servers.append(UpProcess(root / "data", ["--ha", "--simulate", "1x2xH100"], env=env,
                                     log_path=root / f"{name}.log").start())
        yield servers
    finally:
        for server in servers:
            server.stop()
        pg.stop()


def _overview(watched: Watched, server: UpProcess, token: str) -> Any:
    page = watched.page
    page.goto(server.url + "/")
    page.fill("#token", token)
    page.click("#login button[type=submit]")
    page.wait_for_selector("#nav:not([hidden])")
    return page


def _leader(server: UpProcess) -> dict[str, Any]:
    with server.client() as api:
        answer = api.get("/servers").json()
    lead = [s for s in answer["servers"] if s["leader"]]
    return dict(lead[0]) if lead else {}


def test_the_overview_names_the_leader_its_epoch_and_lease_age(ha_pool: list[UpProcess],
                                                               browser_page: Watched) -> None:
    until(lambda: _leader(ha_pool[0]) != {}, 30, "a leader elected")
    lead = _leader(ha_pool[0])
    follower = next(s for s in ha_pool if s.port != int(lead["address"].rsplit(":", 1)[1]))
    page = _overview(browser_page, follower, follower.token())  # asked of a follower: the same answer
    page.wait_for_selector("#leader:not([hidden])")
    text = page.text_content("#leader")
    assert f"Leader: {lead['id']} ({lead['address']}), epoch {lead['epoch']}" in text, text
    age = re.search(r"lease renewed (\d+\.\d) s ago; 1 other server follow", text)
    assert age and float(age.group(1)) < LEASE_S, text  # renewed within the lease
    browser_page.assert_clean()


def test_a_single_server_says_so(pool: UpProcess, browser_page: Watched) -> None:
    page = _overview(browser_page, pool, pool.token())
    page.wait_for_selector("#leader:not([hidden])")
    assert page.text_content("#leader") == "Single server (no --ha): it schedules the pool itself."
    browser_page.assert_clean()


def test_a_tenant_is_not_shown_the_servers(pool: UpProcess, browser_page: Watched) -> None:
    with pool.client() as api:
        if "viewer" not in {t["name"] for t in api.get("/tenants").json()}:
            assert api.post("/tenants", json={"name": "viewer"}).status_code == 201
        token = str(api.post("/tokens", json={"tenant": "viewer"}).json()["token"])
    page = _overview(browser_page, pool, token)
    page.wait_for_selector("#c-nodes")
    assert page.is_hidden("#leader")
    browser_page.assert_clean()  # no 403 for /servers: a tenant's overview never asks for it
