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

    def assert_clean(self) -> None:
        assert not self.problems, "the page met problems:\n" + "\n".join(self.problems)


def screenshot(page: Any, name: str) -> None:
    """docs/img/dashboard-NAME.png when GPUPOOL_SCREENSHOTS=1."""
    if SCREENSHOTS:
        IMG_DIR.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(IMG_DIR / f"dashboard-{name}.png"), full_page=True)
