"""The dashboard in a real Chromium against a real `gpupool up --simulate`: a tenant sees only its
own work, work submitted through the API appears, runs and finishes on the page without a reload,
a failed node is marked, data never runs as script, and no page logs an error or fails a request."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.cli.usage import figure
from gpupool.money import money
from server.upproc import UpProcess, until
from ui.browser import Watched, screenshot

pytestmark = pytest.mark.slow
INJECTED = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script>'


def _tenant_token(pool: UpProcess, name: str) -> str:
    with pool.client() as api:
        if api.get("/tenants").json() and name in {t["name"] for t in api.get("/tenants").json()}:
            return str(api.post("/tokens", json={"tenant": name}).json()["token"])
        assert api.post("/tenants", json={"name": name}).status_code == 201
        answer = api.post("/tokens", json={"tenant": name})
        assert answer.status_code == 201, answer.text
        return str(answer.json()["token"])


def _submit(pool: UpProcess, token: str, **spec: Any) -> str:
    with httpx.Client(base_url=pool.api, headers={"Authorization": f"Bearer {token}"}, timeout=30) as api:
        answer = api.post("/workloads", json=spec)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])


def _status(pool: UpProcess, workload_id: str) -> str:
    with pool.client() as api:
        return str(api.get(f"/workloads/{workload_id}").json()["status"])


def _log_in(watched: Watched, pool: UpProcess, token: str, path: str = "/") -> Any:
    page = watched.page
    page.goto(pool.url + path)
    page.fill("#token", token)
    page.click("#login button[type=submit]")
    page.wait_for_selector("#nav:not([hidden])")
    page.evaluate("window.__sameDocument = true")  # gone if anything reloads the page
    return page


def _not_reloaded(page: Any) -> None:
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded"


def test_ui_answers_carry_a_strict_csp_and_the_root_leads_to_the_dashboard(pool: UpProcess) -> None:
    root = httpx.get(pool.url + "/", timeout=10)
    assert root.status_code == 307 and root.headers["location"] == "/ui/"
    for path in ("/ui/", "/ui/workloads/w-123", "/ui/assets/main.js", "/ui/assets/app.css"):
        answer = httpx.get(pool.url + path, timeout=10)
        assert answer.status_code == 200, path
        csp = answer.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp
        assert answer.headers["x-content-type-options"] == "nosniff"
    assert "content-security-policy" not in httpx.get(pool.api + "/health", timeout=10).headers
    page = httpx.get(pool.url + "/ui/", timeout=10).text
    assert "<script>" not in page and "http://" not in page and "https://" not in page  # no inline, no CDN


def test_whoami_says_what_a_token_is(pool: UpProcess) -> None:
    token = _tenant_token(pool, "whoami")
    with httpx.Client(base_url=pool.api, timeout=10) as api:
        mine = api.get("/whoami", headers={"Authorization": f"Bearer {token}"}).json()
        assert mine["admin"] is False and mine["tenant"] == "whoami"
        assert api.get("/whoami", headers={"Authorization": f"Bearer {pool.token()}"}).json()["admin"] is True
        assert api.get("/whoami").status_code == 401


def test_no_script_builds_markup_from_strings() -> None:
    static = Path(__file__).resolve().parents[2] / "src" / "gpupool" / "server" / "ui" / "static"
    scripts = sorted(static.glob("*.js"))
    assert scripts
    for script in scripts:
        text = script.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in text, f"{script.name} uses {sink}"


def test_a_tenant_sees_only_its_own_work_and_data_never_runs_as_script(
        pool: UpProcess, browser_page: Watched, gate_dir: Path) -> None:
    alpha, beta = _tenant_token(pool, "alpha"), _tenant_token(pool, "beta")
    gate = gate_dir / "go"
    # alpha's pod runs until the test lets it end, a tenth of a second after its start is on record
    # (committed with the workload's "running"): metered from that start to the reconciler's reading
    # of its end, an `echo` alone could end within the few milliseconds that round to 0 device-hours
    mine = _submit(pool, alpha, name="alpha-job", resources={"gpus": 0.25},
                   command=["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done; echo alpha"])
    theirs = _submit(pool, beta, name="beta-job", command=["sh", "-c", f"echo '{INJECTED}'"],
                     resources={"gpus": 0.25})
    until(lambda: _status(pool, mine) == "running", 60, "alpha's workload running")
    time.sleep(0.1)
    gate.touch()
    until(lambda: _status(pool, theirs) == "succeeded" and _status(pool, mine) == "succeeded", 60,
          "both workloads finishing")
    page = _log_in(browser_page, pool, alpha, "/ui/workloads")
    page.get_by_role("link", name=mine).wait_for()
    assert page.get_by_text("beta-job").count() == 0 and page.get_by_text(theirs).count() == 0
    page.click("#nav a[data-page=overview]")
    page.wait_for_selector("#h-tenants")
    tenants_table = page.locator("section[aria-labelledby=h-tenants] tbody")
    tenants_table.get_by_text("alpha").wait_for()
    assert tenants_table.get_by_text("beta").count() == 0
    assert page.locator("#who").text_content() == "tenant alpha"
    _check_usage(pool, page, alpha)
    _not_reloaded(page)
    browser_page.assert_clean()
    # the admin opens beta's workload: its command and log show as text, never as markup
    page.click("#logout")
    page = _log_in(browser_page, pool, pool.token(), f"/ui/workloads/{theirs}")
    page.locator("#log").get_by_text(INJECTED).wait_for()
    page.locator("dl.facts code").get_by_text(INJECTED, exact=False).wait_for()
    assert page.evaluate("window.__pwned === undefined")
    assert page.locator("main img").count() == 0 and page.locator("main script").count() == 0
    screenshot(page, "workload")
    browser_page.assert_clean()


def _check_usage(pool: UpProcess, page: Any, token: str) -> None:
    """The usage page's numbers are the API's as `gpupool usage` prints them (it reads the same
    route), and its CSV holds the same rows."""
    page.click("#nav a[data-page=usage]")
    row = page.locator("#usage-table tbody tr", has_text="alpha")
    row.wait_for()
    assert page.locator("#usage-table tbody tr").count() == 1  # its own tenant only
    with httpx.Client(base_url=pool.api, headers={"Authorization": f"Bearer {token}"}, timeout=30) as api:
        answer = api.get("/usage", params={"by": "tenant"}).json()
    (expected,) = answer["rows"]
    assert expected["tenant"] == "alpha" and expected["device_hours"] > 0
    for field in ("pods", "device_hours", "memory_gib_hours", "cost", "dedicated_cost", "saving"):
        shown = row.locator(f"[data-field={field}]").text_content()
        assert shown == figure(field, expected[field], answer["currency"]), field
    with page.expect_download() as download:
        page.click("#usage-csv")
    lines = Path(download.value.path()).read_text().splitlines()
    assert lines[0].startswith("tenant,simulated,pods,device_hours") and len(lines) == 2
    assert lines[1].startswith("alpha,")
    screenshot(page, "usage")


def test_submitted_work_appears_runs_and_finishes_without_a_reload(
        pool: UpProcess, browser_page: Watched, gate_dir: Path) -> None:
    token = _tenant_token(pool, "gamma")
    page = _log_in(browser_page, pool, token, "/ui/workloads")
    page.get_by_text("no workloads match").wait_for()
    gate = gate_dir / "go"
    workload_id = _submit(pool, token, name="live-job", resources={"gpus": 0.5}, command=[
        "sh", "-c", f"echo started; while [ -d {gate_dir} ] && [ ! -e {gate} ]; do sleep 0.05; done; "
        "echo finished"])
    row = page.locator("tr", has=page.get_by_role("link", name=workload_id))
    row.locator(".badge", has_text="running").wait_for()
    page.get_by_role("link", name=workload_id).click()
    page.locator("#log").get_by_text("started").wait_for()
    page.locator("section[aria-labelledby=h-pods] td", has_text="device").first.wait_for()  # its placement
    page.click("#nav a[data-page=nodes]")
    page.locator(".bar .seg[title*='live-job']").first.wait_for()  # its slice, drawn on its device
    page.go_back()
    page.locator("#log").get_by_text("started").wait_for()
    gate.touch()
    page.locator("h1 .badge", has_text="succeeded").wait_for()
    page.locator("#log").get_by_text("finished").wait_for()
    page.get_by_text("The log is complete.").wait_for()
    _not_reloaded(page)
    browser_page.assert_clean()


def test_an_unchanged_answer_finishes_its_request(pool: UpProcess, browser_page: Watched) -> None:
    # The nodes view polls with If-None-Match; a 304 leaves its (empty) body unread unless the app
    # reads it, and Chromium finishes a request only once its body is read: an unread one stays
    # open until the dropped answer is collected, then fails as net::ERR_ABORTED (it did, under load).
    page = _log_in(browser_page, pool, pool.token(), "/ui/nodes")
    unchanged: set[Any] = set()

    def note(response: Any) -> None:
        if response.status == 304 and response.url.endswith("/api/v1/nodes"):
            unchanged.add(response.request)

    page.on("response", note)
    page.wait_for_event("requestfinished", predicate=lambda request: request in unchanged, timeout=30_000)
    _not_reloaded(page)
    browser_page.assert_clean()


def test_a_failed_node_is_marked(pool: UpProcess, browser_page: Watched, gate_dir: Path) -> None:
    page = _log_in(browser_page, pool, pool.token(), "/ui/nodes")
    with pool.client() as api:
        first, name = (n["name"] for n in api.get("/nodes").json())
    card = page.locator(f"article.node[data-node='{name}']")
    card.locator(".badge", has_text="ready").wait_for()
    with pool.client() as api:
        assert api.post(f"/nodes/{name}/fail").status_code == 200
    try:
        page.locator(f"article.node.down[data-node='{name}']").wait_for()
        assert card.locator(".badge", has_text="unhealthy").count() == 1
        assert card.locator(".badge", has_text="fault injected").count() == 1
        assert page.locator("article.node.down").count() == 1  # only the failed one
        with pool.client() as api:
            assert api.post(f"/nodes/{first}/fail", params={"device": 1}).status_code == 200
        page.locator(f"article.node[data-node='{first}'] li.device.down[data-device='{first}/1']").wait_for()
        assert page.locator("li.device.down").count() == 1
        token = _tenant_token(pool, "delta")  # some work to show: two running, one that cannot fit now
        gate = gate_dir / "go"
        # (it also ends when the gate's directory goes, so no pod outlives the test)
        wait = ["sh", "-c", f"echo working; while [ -d {gate_dir} ] && [ ! -e {gate} ]; do sleep 0.05; done"]
        running = [_submit(pool, token, name=f"train-{i}", command=wait, resources={"gpus": g})
                   for i, g in enumerate((0.5, 0.25))]
        waiting = _submit(pool, token, name="wide", command=["true"], resources={"gpus": 4})
        page.locator(".bar .seg[title*='train-1']").first.wait_for()
        until(lambda: all(_status(pool, w) == "running" for w in running), 60, "two running")
        screenshot(page, "nodes")
        page.click("#nav a[data-page=queues]")
        page.locator("section[aria-labelledby=h-queues] td", has_text="delta").first.wait_for()
        screenshot(page, "queues")
        page.click("#nav a[data-page=workloads]")
        page.locator("td", has_text="wide").first.wait_for()
        screenshot(page, "workloads")
        page.click("#nav a[data-page=overview]")
        page.get_by_role("link", name=f"wide ({waiting})").wait_for()  # pending, with its reason
        page.locator("#history-allocation").wait_for()  # the history the store keeps, charted
        screenshot(page, "overview")
        _not_reloaded(page)
        browser_page.assert_clean()
    finally:
        (gate_dir / "go").touch()
        with pool.client() as api:
            api.post(f"/nodes/{name}/heal")
            api.post(f"/nodes/{first}/heal", params={"device": 1})


def _near(expected: float) -> Any:
    """Equal as shown: four significant digits, and the API's six decimals."""
    return pytest.approx(expected, rel=1e-3, abs=2e-6)


def _as_shown(amount: float, currency: str) -> set[str]:
    """`amount` as `gpupool usage` shows it, give or take the API's sixth decimal (metered again
    between the test's read and the page's)."""
    return {money(round(amount + k * 1e-6, 6), currency) for k in range(-2, 3)}


def _month_start_s() -> float:
    now = datetime.now(UTC)
    return datetime(now.year, now.month, 1, tzinfo=UTC).timestamp()


def _tenant_row(pool: UpProcess, name: str) -> dict[str, Any]:
    with pool.client() as api:
        return next(t for t in api.get("/tenants").json() if t["name"] == name)


def test_budget_bar_cost_card_and_a_budget_wait(pool: UpProcess, browser_page: Watched) -> None:
    """The queues page draws a tenant's budget as the API counts it, the overview's cost card is the
    usage since the month began, and work held by a spent budget says why on the overview."""
    token = _tenant_token(pool, "epsilon")
    done = _submit(pool, token, name="paid", command=["echo", "paid"], resources={"gpus": 0.25})
    until(lambda: _status(pool, done) == "succeeded", 60, "the paid job finishing")
    with httpx.Client(base_url=pool.api, headers={"Authorization": f"Bearer {token}"}, timeout=30) as api:
        usage = api.get("/usage", params={"by": "tenant", "since_s": _month_start_s()}).json()
    cost = usage["total"]["cost"]
    assert cost > 0
    with pool.client() as api:  # twice its spend: the bar half full, short of the warn mark
        assert api.patch("/tenants/epsilon", json={"budget": round(cost * 2, 6)}).status_code == 200
    until(lambda: _tenant_row(pool, "epsilon").get("spent") is not None, 30, "the spend counted")
    row = _tenant_row(pool, "epsilon")
    assert row["budget_exhausted"] is False and row["spent"] == _near(cost)
    page = _log_in(browser_page, pool, token, "/ui/")
    page.locator("#c-cost").wait_for()
    assert page.locator("#c-cost").text_content() in _as_shown(cost, usage["currency"])
    assert "your tenant" in (page.locator("#c-cost + .label").text_content() or "")
    page.click("#nav a[data-page=queues]")
    budget = page.locator(".budget[data-tenant=epsilon]")
    budget.wait_for()
    meter = budget.get_by_role("progressbar")
    assert "Budget of epsilon" in (meter.get_attribute("aria-label") or "")
    assert float(meter.get_attribute("aria-valuenow") or "nan") == _near(row["spent"])
    assert float(meter.get_attribute("aria-valuemax") or "nan") == _near(row["budget"])
    shown = float(budget.locator("[data-field=spent]").text_content() or "nan")
    assert shown == _near(row["spent"])
    assert budget.locator("[data-field=state]").count() == 0
    # half its spend: exhausted, said in words, and its new work waits with the catalogue's sentence
    with pool.client() as api:
        assert api.patch("/tenants/epsilon", json={"budget": round(cost / 2, 6)}).status_code == 200
    until(lambda: _tenant_row(pool, "epsilon")["budget_exhausted"], 30, "the budget exhausted")
    budget.locator("[data-field=state]", has_text="exhausted").wait_for()
    assert "exhausted" in (budget.get_by_role("progressbar").get_attribute("aria-valuetext") or "")
    held = _submit(pool, token, name="held", command=["true"], resources={"gpus": 0.25})
    with pool.client() as api:
        until(lambda: api.get(f"/workloads/{held}").json().get("reason") == "budget_exhausted", 30,
              "the held job's reason")
        sentence = api.get(f"/workloads/{held}").json()["reason_text"]
    assert "budget" in sentence
    screenshot(page, "budgets")
    page.click("#nav a[data-page=overview]")
    row_of_held = page.locator("tr", has=page.get_by_role("link", name=f"held ({held})"))
    row_of_held.get_by_text(sentence).wait_for()
    assert page.locator("#c-cost").text_content() in _as_shown(cost, usage["currency"])
    # a budget past four significant digits shows whole (it read 12350), as `tenant ls` shows it
    with pool.client() as api:
        api.post(f"/workloads/{held}/cancel")
        assert api.patch("/tenants/epsilon", json={"budget": 12345.67}).status_code == 200
    page.click("#nav a[data-page=queues]")
    budget.locator("[data-field=budget]", has_text=money(12345.67, usage["currency"])).wait_for()
    _not_reloaded(page)
    browser_page.assert_clean()
    with pool.client() as api:  # leave the module's pool as it was found
        api.patch("/tenants/epsilon", json={"budget": None})


def _usage_answer(currency: str) -> dict[str, Any]:
    """A usage answer by day: one pod over two days (two rows, one pod in all), amounts with more
    than four significant digits, a tie at the minor unit, and one small enough for extra digits."""
    days = [("2026-12-01", 1.0, 12345.6789, 1234567.891, 12345.67, 1234567.891),
            ("2026-12-02", 0.5, 0.0004, 2.25, 1002.5 if currency == "JPY" else 0.125, 0.005)]
    rows = [{"tenant": None, "queue": None, "model": None, "priority_class": None, "node": None, "day": day,
             "service": None, "simulated": False, "pods": 1, "device_hours": device_h,
             "memory_gib_hours": memory_h, "cost": cost, "dedicated_cost": dedicated,
             "saving": round(dedicated - cost, 6), "priced": True}
            for day, _, device_h, memory_h, cost, dedicated in days]
    total = {**rows[0], "day": None, "pods": 1}
    for field in ("device_hours", "memory_gib_hours", "cost", "dedicated_cost", "saving"):
        total[field] = round(sum(r[field] for r in rows), 6)
    return {"since_s": 0.0, "until_s": 86400.0 * 2, "by": ["day"], "currency": currency, "rows": rows,
            "total": total}


@pytest.mark.parametrize("currency", ["USD", "JPY", "BHD"])
def test_usage_page_and_cost_card_show_the_numbers_of_gpupool_usage(
        pool: UpProcess, browser_page: Watched, currency: str) -> None:
    """Every figure reads as `gpupool usage` prints it: money in the currency's minor unit (never
    rounded to four significant digits: 12345.67 is not 12350), device-hours to 3 decimals, memory
    GiB-hours to 1; the total row is the API's total (one pod over two days is one pod, not two)."""
    answer = _usage_answer(currency)
    page = browser_page.page
    page.route("**/api/v1/usage?*", lambda route: route.fulfill(
        status=200, content_type="application/json", body=json.dumps(answer)))
    page = _log_in(browser_page, pool, pool.token(), "/ui/")
    page.locator("#c-cost").wait_for()
    assert page.locator("#c-cost").text_content() == money(answer["total"]["cost"], currency)
    page.click("#nav a[data-page=usage]")
    page.locator("#usage-table tfoot").wait_for()
    body = page.locator("#usage-table tbody tr")
    assert body.count() == 2
    fields = ("pods", "device_hours", "memory_gib_hours", "cost", "dedicated_cost", "saving")
    for i, row in enumerate(answer["rows"]):
        shown = {f: body.nth(i).locator(f"[data-field={f}]").text_content() for f in fields}
        assert shown == {f: figure(f, row[f], currency) for f in fields}, row["day"]
    foot = page.locator("#usage-table tfoot")
    shown = {f: foot.locator(f"[data-field={f}]").text_content() for f in fields}
    assert shown == {f: figure(f, answer["total"][f], currency) for f in fields}
    assert shown["pods"] == "1"
    # the formatter itself, over amounts where rounding differs: ties, small ones, negative ones
    amounts = [12345.67, 1234567.891, 0.125, 0.375, 2.5, 1002.5, 0.005, 0.0123, 0.00004, -0.004, -0.0,
               0.336, 1.008, 1004.4, 99.995, 1e-9]
    formatted = page.evaluate("async (amounts) => { const m = await import('/ui/assets/money.js'); "
                              "return amounts.map((v) => m.money(v, '" + currency + "')); }", amounts)
    assert formatted == [money(v, currency) for v in amounts]
    _not_reloaded(page)
    browser_page.assert_clean()


def _service(pool: UpProcess, token: str, **spec: Any) -> None:
    with httpx.Client(base_url=pool.api, headers={"Authorization": f"Bearer {token}"}, timeout=30) as api:
        answer = api.post("/services", json=spec)
        assert answer.status_code == 201, answer.text


def _drop_service(pool: UpProcess, token: str, name: str) -> None:
    """A replica outlives its server (as any pod): a test's services go before the pool stops."""
    with httpx.Client(base_url=pool.api, headers={"Authorization": f"Bearer {token}"}, timeout=30) as api:
        assert api.delete(f"/services/{name}").status_code == 200
        until(lambda: api.get(f"/services/{name}").status_code == 404, 60, f"service {name} gone")


def test_services_tab_and_a_service_page_show_the_tenants_own_only(
        pool: UpProcess, browser_page: Watched) -> None:
    mine, theirs = _tenant_token(pool, "svc-own"), _tenant_token(pool, "svc-other")
    _service(pool, mine, name="web", command=["sleep", "600"], min_replicas=1, max_replicas=2,
             resources={"gpus": 0.25})
    _service(pool, theirs, name="hidden", command=["sleep", "600"], min_replicas=0, max_replicas=1,
             resources={"gpus": 0.25})
    try:
        page = _log_in(browser_page, pool, mine, "/ui/services")
        page.wait_for_selector("#service-table tr[data-service='svc-own/web']")
        assert page.locator("#service-table tr[data-service='svc-other/hidden']").count() == 0
        row = page.locator("#service-table tr[data-service='svc-own/web']")
        assert "no router" in (row.text_content() or "")  # this pool routes no traffic (no --serve-port)
        row.locator("a").click()
        page.wait_for_selector("#h-replicas")
        _not_reloaded(page)
        assert page.url.endswith("/ui/services/web")
        assert "no router serves" in (page.locator("#svc-latency").text_content() or "")
        assert "none: this pool routes no service traffic" in (page.locator("#svc-url").text_content() or "")
        page.wait_for_selector("#service-replicas-chart")  # its history, or a sentence until the first minute
        page.wait_for_selector("section[aria-labelledby=h-scale-events] table")
        until(lambda: page.locator("tr[data-replica]").count() == 1, 60, "its replica listed")
        # another tenant's service page does not exist for this tenant: the banner says so
        page.goto(pool.url + "/ui/services/hidden")
        page.wait_for_selector("#banner:not([hidden])")
        assert "No service 'hidden'" in (page.locator("#banner").text_content() or "")
        browser_page.problems[:] = [p for p in browser_page.problems if "404" not in p]
        browser_page.assert_clean()
    finally:
        _drop_service(pool, mine, "web")
        _drop_service(pool, theirs, "hidden")
