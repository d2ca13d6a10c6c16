"""The dashboard at scale: first render of the overview and the delay of a live update, in a real
Chromium (Debian's, driven by Playwright) against `gpupool up --provider fake --simulate NxGxH100`
holding W workloads (targets from issue 16: first render < 1 s and an update visible < 2 s at
1,000 nodes / 10,000 workloads; the API routes the pages use p99 < 100 ms).

Workloads ask one whole device each and run for a day (fake provider), spread over four tenants,
so the pool is full and the rest waits with a reason. Then, N times each:
  - first render: a fresh tab opens /ui/ (token already in the tab's sessionStorage) until the
    overview's totals and pending table are drawn (the page's own clock, from navigation start);
  - live update: a workload is submitted through the API while the overview is open; the time
    from the API's answer until its id shows on the page (polling every 1 s: the expected delay is
    half that plus a refresh);
  - the overview's totals drawn (the cards, from GET /pool alone) on the way to its first render;
  - the nodes page's first render (every device's slices, from GET /nodes);
  - each API route the pages poll, timed alone (p50 and p99), and GET /nodes sent back its ETag
    (If-None-Match: 304 while nothing changed, as the nodes page polls it).

Top-level figures for bench/side_by_side.py --metric: overview_ms, overview_cards_ms, update_ms,
nodes_page_ms, and <route>_p99_ms for pool, nodes, queues and pending.

    .venv/bin/python bench/dashboard.py [--nodes 1000] [--devices 8] [--workloads 10000] [--samples 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from _control_plane import RawHttpClient, gpupool_up, percentile_ms, write_json

CHROMIUM = os.environ.get("GPUPOOL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
TENANTS = ("alpha", "beta", "gamma", "delta")
CONNECTIONS = 4
DAY_S = "86400"
ROUTES = {
    "GET /pool": ("/pool", {}),
    "GET /workloads pending (25)": ("/workloads", {"status": "pending", "limit": 25}),
    "GET /nodes": ("/nodes", {}),
    "GET /nodes (If-None-Match, unchanged)": ("/nodes", {}),
    "GET /queues": ("/queues", {}),
    "GET /workloads running (page of 1000; CLI/SDK, no page uses it)": (
        "/workloads", {"status": "admitted,running", "limit": 1000}),
    "GET /workloads (table, 50)": ("/workloads", {"limit": 50}),
}


async def _fill(url: str, token: str, count: int) -> None:
    async def one_connection(index: int, n: int) -> None:
        client = RawHttpClient(url)
        for k in range(n):
            spec = {"command": ["true"], "tenant": TENANTS[(index + k) % len(TENANTS)],
                    "resources": {"gpus": 1}, "env": {"GPUPOOL_FAKE_DURATION_S": DAY_S}}
            status, body = await client.send(client.request_bytes("POST", "/api/v1/workloads", token, spec))
            if status != 201:
                raise RuntimeError(f"submit answered {status}: {body[:200]!r}")
        await client.close()

    share = [count // CONNECTIONS + (i < count % CONNECTIONS) for i in range(CONNECTIONS)]
    await asyncio.gather(*(one_connection(i, n) for i, n in enumerate(share)))


def _settle(api: httpx.Client, count: int, devices: int, timeout_s: float = 1800) -> float:
    """Wait until the loop placed all it can: min(count, devices) running."""
    began = time.monotonic()
    want = min(count, devices)
    while time.monotonic() - began < timeout_s:
        counts = api.get("/pool").json()["workloads"]
        if counts["running"] + counts["admitted"] >= want:
            return time.monotonic() - began
        time.sleep(1)
    raise RuntimeError(f"the pool did not place {want} workloads within {timeout_s:g} s")


def _page(browser: Any, url: str, token: str) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(f"sessionStorage.setItem('gpupool.token', {token!r});")
    page = context.new_page()
    page.set_default_timeout(120_000)
    return page


def _first_render(browser: Any, url: str, token: str, path: str, ready: str,
                  early: str = "") -> tuple[float, float, float]:
    """ms from navigation start until `ready` is on the page (the page's own clock), until the
    page's files were loaded and run (DOMContentLoaded), and until `early` was (0 without one)."""
    page = _page(browser, url, token)
    try:
        page.goto(url + path)
        first = 0.0
        if early:
            page.wait_for_selector(early, state="attached")
            first = float(page.evaluate("performance.now()"))
        page.wait_for_selector(ready, state="attached")
        drawn = float(page.evaluate("performance.now()"))
        loaded = float(page.evaluate(
            "performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd"))
        return drawn, loaded, first
    finally:
        page.context.close()


def _update_delays(browser: Any, url: str, token: str, samples: int) -> list[float]:
    """Seconds from a submission's answer until its id shows on the open overview."""
    page = _page(browser, url, token)
    delays = []
    try:
        page.goto(url + "/ui/")
        page.wait_for_selector("#h-pending")
        with httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                          timeout=60) as api:
            for _ in range(samples):
                answer = api.post("/workloads", json={"command": ["true"], "resources": {"gpus": 1},
                                                      "env": {"GPUPOOL_FAKE_DURATION_S": DAY_S}})
                answer.raise_for_status()
                answered = time.perf_counter()
                page.get_by_role("link", name=answer.json()["id"]).wait_for()
                delays.append(time.perf_counter() - answered)
    finally:
        page.context.close()
    return delays


def _routes(url: str, token: str, samples: int) -> dict[str, dict[str, float]]:
    timed: dict[str, dict[str, float]] = {}
    with httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                      timeout=120) as api:
        for name, (path, params) in ROUTES.items():
            took = []
            headers = {}
            if "If-None-Match" in name:
                headers["If-None-Match"] = api.get(path, params=params).headers.get("etag", "")
            for _ in range(samples):
                began = time.perf_counter()
                answer = api.get(path, params=params, headers=headers)
                if answer.status_code != 304:
                    answer.raise_for_status()
                took.append(time.perf_counter() - began)
            timed[name] = {"p50_ms": round(percentile_ms(took, 50), 1),
                           "p99_ms": round(percentile_ms(took, 99), 1)}
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--workloads", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--route-samples", type=int, default=200,
                        help="Requests per route; p99 needs a few hundred (at 30 it is the slowest but one).")
    parser.add_argument("--json", default="")
    opts = parser.parse_args()
    from playwright.sync_api import sync_playwright

    pool = f"{opts.nodes}x{opts.devices}xH100"
    with gpupool_up("--provider", "fake", "--simulate", pool) as server:
        headers = {"Authorization": f"Bearer {server.token}"}
        with httpx.Client(base_url=server.url + "/api/v1", headers=headers, timeout=120) as api:
            for tenant in TENANTS:
                answer = api.post("/tenants", json={"name": tenant, "max_pending": opts.workloads + 1000})
                answer.raise_for_status()
            began = time.perf_counter()
            asyncio.run(_fill(server.url, server.token, opts.workloads))
            fill_s = time.perf_counter() - began
            settle_s = _settle(api, opts.workloads, opts.nodes * opts.devices)
            counts = api.get("/pool").json()["workloads"]
        with sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                overview = [_first_render(browser, server.url, server.token, "/ui/", "#h-pending", "#c-nodes")
                            for _ in range(opts.samples)]
                nodes = [_first_render(browser, server.url, server.token, "/ui/nodes", "article.node")
                         for _ in range(max(1, opts.samples // 2))]
                delays = _update_delays(browser, server.url, server.token, opts.samples)
            finally:
                browser.close()
        routes = _routes(server.url, server.token, opts.route_samples)
    results = {
        "overview first render (ms)": _summary([drawn for drawn, _, _ in overview]),
        "overview: page's files loaded (ms)": _summary([loaded for _, loaded, _ in overview]),
        "overview: totals drawn (ms)": _summary([first for _, _, first in overview]),
        "nodes page first render (ms)": _summary([drawn for drawn, _, _ in nodes]),
        "live update visible after (ms)": _summary([d * 1000 for d in delays]),
    }
    table = Table(title=f"Dashboard on {pool} with {opts.workloads} workloads ({counts['running']} running, "
                  f"{counts['pending']} pending; filled in {fill_s:.0f} s, placed in {settle_s:.0f} s)")
    for column in ("measure", "p50", "max / p99", "target"):
        table.add_column(column)
    targets = {"overview first render (ms)": "< 1000", "live update visible after (ms)": "< 2000"}
    for name, row in results.items():
        table.add_row(name, f"{row['p50']:.0f}", f"{row['max']:.0f}", targets.get(name, ""))
    for name, row in routes.items():
        target = "" if "no page uses it" in name else "p99 < 100 ms"
        table.add_row(name, f"{row['p50_ms']:.1f} ms", f"{row['p99_ms']:.1f} ms", target)
    Console().print(table)
    payload: dict[str, object] = {
        "pool": pool, "workloads": opts.workloads, "counts": counts, "fill_s": round(fill_s, 1),
        "settle_s": round(settle_s, 1), **results, "routes": routes,
        "overview_ms": results["overview first render (ms)"]["p50"],
        "overview_cards_ms": results["overview: totals drawn (ms)"]["p50"],
        "update_ms": results["live update visible after (ms)"]["p50"],
        "nodes_page_ms": results["nodes page first render (ms)"]["p50"],
        **{f"{short}_p99_ms": routes[name]["p99_ms"] for short, name in (
            ("pool", "GET /pool"), ("nodes", "GET /nodes"), ("queues", "GET /queues"),
            ("pending", "GET /workloads pending (25)"))},
        "load_average_1m": os.getloadavg()[0],
    }
    print(f"JSON: {write_json(opts.json, 'dashboard', payload)}")


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": round(ordered[len(ordered) // 2], 1), "max": round(ordered[-1], 1), "n": len(ordered)}


if __name__ == "__main__":
    main()
