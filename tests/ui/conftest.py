"""Fixtures for the dashboard tests: a real `gpupool up --simulate`, and Debian's Chromium driven by
Playwright (never Playwright's own browser downloads); a page that records every console error,
uncaught exception, failed request and error answer, which each test then asserts is empty."""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from server.upproc import UpProcess
from ui import private_net
from ui.browser import Watched

CHROMIUM = os.environ.get("GPUPOOL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]


@pytest.fixture(scope="package")
def browser_network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[private_net.BrowserNetwork | None]:
    """The browser's own network (private_net.py: the host's interfaces, which other tests change,
    would abort its requests), or None where it cannot have one."""
    if private_net.unavailable():
        yield None
        return
    network = private_net.BrowserNetwork(tmp_path_factory.mktemp("browser-net"))
    try:
        network.start()
    except (RuntimeError, OSError) as exc:  # the tests may then meet the host's changes
        warnings.warn(f"the browser shares the host's network: its own could not be made ({exc})",
                      stacklevel=1)
        yield None
        return
    try:
        yield network
    finally:
        network.close()


@pytest.fixture(scope="package")
def chromium(browser_network: private_net.BrowserNetwork | None) -> Iterator[Any]:
    """A headless Chromium, or skip with the reason; on its own network where it can have one.
    Package-scoped: Playwright's sync API keeps an asyncio loop running in the main thread while it
    is open, so it must be closed before a worker goes on to other packages' tests (asyncio.run()
    refuses to start inside a running loop)."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"Chromium not found at {CHROMIUM}; as root `make test` installs Debian's chromium")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is a dev dependency: "
                                   "pip install -e '.[dev]'")
    executable = browser_network.wrap(CHROMIUM) if browser_network is not None else CHROMIUM
    with sync_api.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    server = UpProcess(tmp_path_factory.mktemp("ui") / "data",
                       ["--simulate", "2x4xH100", "--placement", "first-fit"]).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def gate_dir() -> Iterator[Path]:
    """A directory pods (running as other accounts) can look into: a test releases a waiting pod
    by creating a file here, so no test waits on a clock."""
    path = Path(tempfile.mkdtemp(prefix="gpupool-ui-gate-"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def browser_page(chromium: Any) -> Iterator[Watched]:
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    watched = Watched(page)

    def note(problem: str, when: bool = True) -> None:
        if when:
            watched.problems.append(problem)

    page.on("console", lambda m: note(f"console: {m.text}", m.type == "error"))
    page.on("pageerror", lambda e: note(f"uncaught: {e}"))
    sent_at: dict[Any, int] = {}

    def navigated(frame: Any) -> None:
        if frame == page.main_frame:
            watched.navigations += 1

    def failed(request: Any) -> None:
        problem = f"failed: {request.url} {request.failure}"
        if "ERR_ABORTED" in (request.failure or ""):
            watched.aborted.append((problem, sent_at.pop(request, watched.navigations)))
        else:
            note(problem)

    page.on("framenavigated", navigated)
    page.on("request", lambda r: sent_at.__setitem__(r, watched.navigations))
    page.on("requestfinished", lambda r: sent_at.pop(r, None))
    page.on("requestfailed", failed)
    page.on("response", lambda r: note(f"answer {r.status}: {r.url}", r.status >= 400))
    try:
        yield watched
    finally:
        context.close()
