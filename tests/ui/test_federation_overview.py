"""At a federation hub (`gpupool up --federation`) the overview shows a Members panel: each member's
name, region, up or down, devices free of all, queue and price per GPU-hour now, read from
`GET /federation/members`; a pool that is no hub shows no such panel and asks for no such route."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpupool.federation.loopback import Federation, start_federation, until
from ports import free_port
from server.upproc import UpProcess, spawn_gpupool
from ui.browser import Watched

pytestmark = pytest.mark.slow
LONG = {"GPUPOOL_FAKE_DURATION_S": "3600"}


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    federation = start_federation(tmp_path_factory.mktemp("fed-ui"), ("east", "west"), ghost=True,
                                  free_port=free_port,
                                  spawn=spawn_gpupool)
    yield federation
    federation.stop()


def _login(watched: Watched, url: str, token: str) -> Any:
    page = watched.page
    page.goto(url + "/")
    page.fill("#token", token)
    page.click("#login button[type=submit]")
    page.wait_for_selector("#nav:not([hidden])")
    return page


def _members(fed: Federation, token: str) -> dict[str, dict[str, Any]]:
    with fed.hub_api(token) as api:
        return {m["name"]: m for m in api.get("/federation/members").json()}


def test_the_hub_overview_shows_each_members_capacity_queue_and_price(fed: Federation,
                                                                       browser_page: Watched) -> None:
    assert fed.hub is not None
    with fed.hub_api() as api:  # east (alice's home) full, one more waiting there
        for _ in range(2):
            assert api.post("/workloads", json={"command": ["x"], "resources": {"gpus": 4},
                                                "env": LONG}).status_code == 201
    admin = (fed.hub.data_dir / "admin-token").read_text().strip()
    until(lambda: (lambda m: m["allocated_gpus"] == 4 and m["pending"] == 1)(_members(fed, admin)["east"]),
          30, "east's summary read by the hub")
    members = _members(fed, admin)
    page = _login(browser_page, fed.hub.url, admin)
    page.wait_for_selector("#members tr[data-member=ghost]")
    rows = {name: [c.strip() for c in page.locator(f"#members tr[data-member={name}] td").all_text_contents()]
            for name in ("east", "west", "ghost")}
    currency = members["east"]["currency"]
    assert rows["east"] == ["east", "east", "up", "0 of 4", "1", "1", f"1.00 {currency}"], rows
    assert rows["west"] == ["west", "west", "up", "4 of 4", "0", "0", f"0.90 {currency}"], rows
    assert rows["ghost"][:2] == ["ghost", "ghost"] and rows["ghost"][2].startswith("down ("), rows
    assert page.text_content("#c-devices") == "8"  # the totals are the members' added up
    browser_page.assert_clean()


def test_a_pool_that_is_no_hub_shows_no_members_panel(pool: UpProcess, browser_page: Watched) -> None:
    page = _login(browser_page, pool.url, pool.token())
    page.wait_for_selector("#c-nodes")
    assert page.is_hidden("#members")
    browser_page.assert_clean()  # and no 404 for /federation/members: it was never asked
