"""Helpers of the dashboard tests: a watched browser page and the documentation's screenshots."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCREENSHOTS = os.environ.get("GPUPOOL_SCREENSHOTS") == "1"
"""Write a screenshot of each page to docs/img/ (docs/dashboard.md shows them); off in CI."""
IMG_DIR = Path(__file__).resolve().parents[2] / "docs" / "img"


@dataclass
class Watched:
    """A browser page and every problem it met."""

    page: Any
    problems: list[str] = field(default_factory=list)
    navigations: int = 0
    """How many times the page's main frame has navigated (the test's `goto`s and the app's own)."""
    aborted: list[tuple[str, int]] = field(default_factory=list)
    """Requests the browser aborted, each with `navigations` as it was when the request was sent."""

    def assert_clean(self) -> None:
        # A navigation aborts the requests its page still had in flight (a log being read when the
        # test goes to another workload): not a problem of the page, unlike an abort while it stayed.
        problems = self.problems + [what for what, sent_at in self.aborted if sent_at == self.navigations]
        assert not problems, "the page met problems:\n" + "\n".join(problems)


def screenshot(page: Any, name: str) -> None:
    """docs/img/dashboard-NAME.png when GPUPOOL_SCREENSHOTS=1."""
    if SCREENSHOTS:
        IMG_DIR.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(IMG_DIR / f"dashboard-{name}.png"), full_page=True)
