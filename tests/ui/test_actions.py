"""An operator acts from the dashboard, in a real Chromium against a real `gpupool up --simulate`:
cancel, hold, release, requeue, drain, uncordon and heal, each through its confirmation dialog, each
checked in the API afterwards and in the audit log; "Keep as it is" changes nothing; a tenant's page
shows no admin action and the calls it could forge are refused. Also: array tasks collapse into one
row, the class, node and elapsed columns, the history charts from the store, and a pool without a
fabric hides the Fabric tab and never asks for the fabric."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.upproc import UpProcess, until
from ui.browser import SCREENSHOTS, Watched, screenshot
from ui.test_dashboard import _log_in, _not_reloaded, _status, _submit, _tenant_token

pytestmark = pytest.mark.slow


def _wait_cmd(gate_dir: Path) -> list[str]:
    """Runs until the test creates the gate file (or the gate's directory goes): no pod outlives it."""
    gate = gate_dir / "go"
    return ["sh", "-c", f"while [ -d {gate_dir} ] && [ ! -e {gate} ]; do sleep 0.05; done"]


def _workload(pool: UpProcess, workload_id: str) -> dict[str, Any]:
    with pool.client() as api:
        return dict(api.get(f"/workloads/{workload_id}").json())


def _audited(pool: UpProcess, action: str, target: str) -> bool:
    with pool.client() as api:
        return any(r["action"] == action and r["target"] == target and r["actor"] == "admin"
                   for r in api.get("/audit", params={"limit": 200}).json())


def _act(page: Any, button: Any, expected_text: str) -> None:
    """Click an action, read its confirmation, confirm, and wait for the page to say it was done."""
    button.click()
    dialog = page.locator("dialog#confirm")
    dialog.wait_for(state="visible")
    assert expected_text in (page.locator("#confirm-text").text_content() or "")
    page.click("#confirm-yes")
    dialog.wait_for(state="hidden")
    page.locator("#action-result", has_text="Done").wait_for()


@pytest.fixture
def busy_pool(pool: UpProcess, gate_dir: Path) -> Iterator[tuple[str, str, str]]:
    """Both nodes held whole by two running workloads, and a third waiting for room (pending)."""
    token = _tenant_token(pool, "ops")
    blockers = [_submit(pool, token, name=f"block-{i}", command=_wait_cmd(gate_dir), resources={"gpus": 4})
                for i in range(2)]
    until(lambda: all(_status(pool, b) == "running" for b in blockers), 60, "both nodes held")
    waiting = _submit(pool, token, name="waiter", command=_wait_cmd(gate_dir), resources={"gpus": 1})
    try:
        yield blockers[0], blockers[1], waiting
    finally:
        (gate_dir / "go").touch()
        with pool.client() as api:
            for w in (*blockers, waiting):
                api.post(f"/workloads/{w}/cancel")


def test_hold_release_requeue_and_cancel_through_the_confirmation(
        pool: UpProcess, browser_page: Watched, busy_pool: tuple[str, str, str]) -> None:
    first, _, waiting = busy_pool
    assert _status(pool, waiting) == "pending"
    page = _log_in(browser_page, pool, pool.token(), f"/ui/workloads/{waiting}")
    # "Keep as it is" does nothing
    page.locator("button[data-action=cancel]").click()
    page.locator("dialog#confirm").wait_for(state="visible")
    page.click("#confirm-no")
    page.locator("dialog#confirm").wait_for(state="hidden")
    assert _status(pool, waiting) == "pending" and not _audited(pool, "workload.cancel", waiting)
    # hold, then release
    _act(page, page.locator("button[data-action=hold]"), "Hold waiter")
    assert _workload(pool, waiting)["held"] == "admin" and _audited(pool, "workload.hold", waiting)
    page.locator("#wl-held", has_text="held by the admin").wait_for()
    _act(page, page.locator("button[data-action=release]"), "Release waiter")
    assert _workload(pool, waiting)["held"] == "" and _audited(pool, "workload.release", waiting)
    # cancel it
    _act(page, page.locator("button[data-action=cancel]"), "Cancel waiter")
    assert _status(pool, waiting) == "cancelled" and _audited(pool, "workload.cancel", waiting)
    page.locator("h1 .badge", has_text="cancelled").wait_for()
    assert page.locator("button.action").count() == 0  # nothing left to do to finished work
    # requeue a running one
    page.goto(pool.url + f"/ui/workloads/{first}")
    _act(page, page.locator("button[data-action=requeue]"), "send it back to pending")
    with pool.client() as api:
        reasons = [e["reason"] for e in api.get(f"/workloads/{first}/events").json()]
    assert "requeued_by_user" in reasons and _audited(pool, "workload.requeue", first)
    browser_page.assert_clean()


def test_drain_uncordon_and_heal_a_node(pool: UpProcess, browser_page: Watched) -> None:
    with pool.client() as api:
        name = api.get("/nodes").json()[-1]["name"]
    page = _log_in(browser_page, pool, pool.token(), "/ui/nodes")
    card = page.locator(f"article.node[data-node='{name}']")
    card.locator(".badge", has_text="ready").wait_for()
    assert card.locator("button[data-action=uncordon]").count() == 0  # a ready node: nothing to undo
    if SCREENSHOTS:
        card.locator("button[data-action=drain]").click()
        page.locator("dialog#confirm").wait_for(state="visible")
        screenshot(page, "confirm")
        page.click("#confirm-no")
        page.locator("dialog#confirm").wait_for(state="hidden")
    _act(page, card.locator("button[data-action=drain]"), f"Drain {name}")
    with pool.client() as api:
        assert api.get(f"/nodes/{name}").json()["draining"] is True
    assert _audited(pool, "node.drain", name)
    _act(page, card.locator("button[data-action=uncordon]"), f"Uncordon {name}")
    with pool.client() as api:
        node = api.get(f"/nodes/{name}").json()
    assert node["draining"] is False and node["cordoned"] is False and node["state"] == "ready"
    assert _audited(pool, "node.uncordon", name)
    with pool.client() as api:
        assert api.post(f"/nodes/{name}/fail", params={"device": 2}).status_code == 200
    _act(page, card.locator("button[data-action=heal]"), f"Heal {name}")
    with pool.client() as api:
        assert api.get(f"/nodes/{name}").json()["unhealthy_devices"] == []
    assert _audited(pool, "node.heal", name)
    card.locator("button[data-action=heal]").wait_for(state="detached")
    _not_reloaded(page)
    browser_page.assert_clean()


def test_a_tenant_gets_no_admin_action_and_forged_calls_are_refused(
        pool: UpProcess, browser_page: Watched, busy_pool: tuple[str, str, str]) -> None:
    first, _, _ = busy_pool
    token = _tenant_token(pool, "intruder")
    page = _log_in(browser_page, pool, token, "/ui/nodes")
    page.locator("article.node").first.wait_for()
    assert page.locator("button.action").count() == 0
    browser_page.assert_clean()
    with pool.client() as admin:
        nodes = [n["name"] for n in admin.get("/nodes").json()]
    with httpx.Client(base_url=pool.api, headers={"Authorization": f"Bearer {token}"}, timeout=30) as api:
        for verb in ("drain", "uncordon", "heal", "cordon"):
            answer = api.post(f"/nodes/{nodes[0]}/{verb}")
            assert answer.status_code == 403 and answer.json()["message"], verb
        for verb in ("cancel", "hold", "requeue", "release"):  # another tenant's work does not exist for it
            assert api.post(f"/workloads/{first}/{verb}").status_code == 404, verb
        assert api.get("/history", params={"metric": "allocation"}).status_code == 403
    assert _status(pool, first) == "running"
    with pool.client() as api:
        assert all(n["state"] == "ready" for n in api.get("/nodes").json())


def test_arrays_collapse_and_the_class_node_and_elapsed_columns(
        pool: UpProcess, browser_page: Watched, gate_dir: Path) -> None:
    token = _tenant_token(pool, "arrays")
    array = _submit(pool, token, name="sweep", array="0-4", command=_wait_cmd(gate_dir),
                    resources={"gpus": 0.25})
    single = _submit(pool, token, name="solo", command=_wait_cmd(gate_dir), resources={"gpus": 0.25})
    try:
        until(lambda: _status(pool, single) == "running", 60, "solo running")
        page = _log_in(browser_page, pool, token, "/ui/workloads")
        row = page.locator(f"tr.array-row[data-array='{array}']")
        row.wait_for()
        # the row counts its tasks by status: waited for until all five run (a poll between their
        # launches draws the row with fewer running and the rest admitted or pending)
        running = row.locator("[data-status=running]")
        until(lambda: running.count() == 1 and (running.text_content() or "").split()[-1:] == ["5"], 60,
              "the five tasks running, counted in one row")
        assert page.locator(f"tr[data-array-task='{array}']").count() == 0  # collapsed: one row
        row.get_by_role("button").click()
        until(lambda: page.locator(f"tr[data-array-task='{array}']").count() == 5, 10, "five tasks shown")
        solo = page.locator("tr", has=page.get_by_role("link", name=single))
        cells = solo.locator("td").all_text_contents()
        headers = page.locator("thead th").all_text_contents()
        node = _workload(pool, single)["pods"][0]["node"]
        assert cells[headers.index("Node")] == node
        assert cells[headers.index("Elapsed")].endswith((" s", " min"))
        assert "Class" in headers
        _not_reloaded(page)
        browser_page.assert_clean()
    finally:
        (gate_dir / "go").touch()


def test_history_charts_come_from_the_store(pool: UpProcess, browser_page: Watched) -> None:
    page = _log_in(browser_page, pool, pool.token(), "/ui/")
    page.locator("#history-allocation").wait_for()  # the sampler records the minute it starts in
    page.locator("#history-devices td", has_text="simulated: not measured").first.wait_for()
    with page.expect_request(lambda r: "/api/v1/history" in r.url and "range=7d" in r.url):
        page.click("button[data-range='7d']")
    assert page.locator("button[data-range='7d']").get_attribute("aria-pressed") == "true"
    page.click("#logout")
    token = _tenant_token(pool, "charted")
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url) if "/api/v1/history" in r.url else None)
    _log_in(browser_page, pool, token, "/ui/")
    page.locator("#history-tenants, #history-charts p.summary").first.wait_for()
    assert seen and all("metric=tenants" in url for url in seen)
    assert page.locator("#history-devices").count() == 0
    browser_page.assert_clean()


def test_without_a_fabric_the_tab_is_hidden_and_the_fabric_never_asked(
        pool: UpProcess, browser_page: Watched) -> None:
    asked: list[str] = []
    page = browser_page.page
    page.on("request", lambda r: asked.append(r.url) if "/api/v1/fabric" in r.url else None)
    page = _log_in(browser_page, pool, pool.token(), "/ui/fabric")
    page.locator("#fabric-absent", has_text="without a fabric").wait_for()
    assert page.locator("#nav a[data-page=fabric]").is_hidden()
    # several polls later the page has still not asked
    for _ in range(3):
        before = page.locator("#updated").text_content()
        until(lambda b=before: page.locator("#updated").text_content() != b, 10, "another poll")
    assert asked == []
    browser_page.assert_clean()


def test_a_tenant_acts_on_its_own_work_but_cannot_release_the_admins_hold(
        pool: UpProcess, browser_page: Watched, busy_pool: tuple[str, str, str]) -> None:
    _, _, waiting = busy_pool
    with pool.client() as api:
        assert api.post(f"/workloads/{waiting}/hold").status_code == 200
    token = _tenant_token(pool, "ops")  # the tenant the busy pool's work belongs to
    page = _log_in(browser_page, pool, token, f"/ui/workloads/{waiting}")
    page.locator("#wl-held", has_text="held by the admin").wait_for()
    assert page.locator("button[data-action=release]").count() == 0  # only the admin releases it
    _act(page, page.locator("button[data-action=cancel]"), "Cancel waiter")
    assert _status(pool, waiting) == "cancelled"
    with pool.client() as api:
        events = api.get(f"/workloads/{waiting}/events").json()
    assert events[-1]["reason"] == "cancelled_by_user"
    assert not _audited(pool, "workload.cancel", waiting)  # the audit log is the admin's actions
    browser_page.assert_clean()
