"""The dashboard tests' browser: not disturbed by the host's interfaces changing (private_net.py), and
what its watch counts as a page's problem.

Other tests add and remove veths and addresses on the host while these run; Chromium aborts what
it has in flight with ERR_NETWORK_CHANGED at each change it sees. This test makes such changes
itself, as fast as `ip` can, while the browser loads a page of twenty-one requests again and again
from a server on the host's 127.0.0.1: every request must be answered. On the host's own network
(the browser launched without its namespace) the same loads met 208 aborted requests in 15 pages.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ui import private_net
from ui.browser import Watched

IMAGES = 20
ADDRESS = "198.18.0.1/32"
PAGES = {
    "/": "<html><body>" + "".join(f'<img src="/{i}.png">' for i in range(IMAGES)) + "</body></html>",
    "/reads": "<html><body><script>fetch('/slow')</script></body></html>",
    "/cancels": "<html><body><script>const c = new AbortController(); fetch('/slow', {signal: c.signal})"
                ".catch(() => {}); setTimeout(() => c.abort(), 100)</script></body></html>",
}
"""The site's pages: one of images; one that reads something slow; one that gives that up itself."""


class _Page(http.server.BaseHTTPRequestHandler):
    """A page of IMAGES images, each answered 20 ms late (so requests are in flight at each change)."""

    def do_GET(self) -> None:
        time.sleep(2.0 if self.path == "/slow" else 0.02)
        html = PAGES.get(self.path)
        body = html.encode() if html is not None else b""
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if html is not None else "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def site() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _Churn:
    """Adds a veth pair with an address on the host, brings it up and removes it, over and over,
    counting the rounds. The address is of the range kept for benchmarks (RFC 2544), which no
    machine or test uses (the documentation ranges are not free: a machine's own network may be
    TEST-NET-1, and other tests name addresses of them)."""

    def __init__(self) -> None:
        self.name = f"gpch{os.getpid() % 100_000}"
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for argv in (["ip", "link", "add", self.name, "type", "veth", "peer", "name", self.name + "p"],
                         ["ip", "addr", "add", ADDRESS, "dev", self.name],
                         ["ip", "link", "set", self.name, "up"],
                         ["ip", "link", "del", self.name]):
                subprocess.run(argv, capture_output=True, check=False)
            self.rounds += 1

    def __enter__(self) -> _Churn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        subprocess.run(["ip", "link", "del", self.name], capture_output=True, check=False)


def test_pages_load_whole_while_the_hosts_interfaces_change(
        browser_network: private_net.BrowserNetwork | None, browser_page: Watched, site: str) -> None:
    if browser_network is None:
        why = private_net.unavailable() or "its own could not be made: see the warning"
        pytest.skip(f"the browser shares the host's network here ({why})")
    page = browser_page.page
    loads = 0
    with _Churn() as churn:
        # at least 15 pages, and on until the host's interfaces have changed 10 times meanwhile
        while (loads < 15 or churn.rounds < 10) and loads < 200:
            page.goto(site + "/")
            loads += 1
        rounds = churn.rounds
    assert rounds >= 10, f"the host's interfaces changed {rounds} times in {loads} pages"
    browser_page.assert_clean()


def test_a_request_cut_by_leaving_the_page_is_no_problem_but_one_cut_while_it_stays_is(
        browser_page: Watched, site: str) -> None:
    """The watch of each dashboard test (conftest.browser_page): a navigation aborts what its page
    still had in flight (net::ERR_ABORTED), which says nothing of the page; an abort while the page
    stays is reported."""
    page = browser_page.page
    with page.expect_request(site + "/slow"):
        page.goto(site + "/reads")
    with page.expect_event("requestfailed"):
        page.goto(site + "/")  # leaves /reads with its read in flight
    browser_page.assert_clean()
    with page.expect_event("requestfailed"):
        page.goto(site + "/cancels")
    with pytest.raises(AssertionError, match="ERR_ABORTED"):
        browser_page.assert_clean()
