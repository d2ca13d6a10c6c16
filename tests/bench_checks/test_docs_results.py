"""The results page and the experiments pages stay usable: docs/benchmarks.md keeps the block that
bench/openb_grid.py --write-docs rewrites, stays short enough to read, and every link into it or into
docs/experiments/ (from README.md and docs/) names a file and a heading that exist."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RESULTS = DOCS / "benchmarks.md"
sys.path.insert(0, str(ROOT / "bench"))

import openb_grid  # noqa: E402

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted((DOCS / "experiments").glob("*.md"))]


def test_results_page_keeps_the_openb_grid_block_once() -> None:
    text = RESULTS.read_text(encoding="utf-8")
    assert text.count(openb_grid.START) == 1
    assert text.count(openb_grid.END) == 1
    assert text.index(openb_grid.START) < text.index(openb_grid.END)


def test_openb_grid_rewrites_only_its_block(tmp_path: Path) -> None:
    copy = tmp_path / "benchmarks.md"
    before = RESULTS.read_text(encoding="utf-8")
    copy.write_text(before, encoding="utf-8")
    openb_grid.write_docs(copy, "NEW GRID")
    after = copy.read_text(encoding="utf-8")
    head, rest = before.split(openb_grid.START, 1)
    tail = rest.split(openb_grid.END, 1)[1]
    assert after == head + openb_grid.START + "\nNEW GRID\n" + openb_grid.END + tail


def test_results_page_is_short() -> None:
    assert len(RESULTS.read_text(encoding="utf-8").splitlines()) < 600


def test_every_experiments_page_links_back_to_the_results_page() -> None:
    experiments = sorted((DOCS / "experiments").glob("*.md"))
    assert experiments
    for page in experiments:
        assert "../benchmarks.md#" in page.read_text(encoding="utf-8"), page.name


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_into_the_results_and_experiments_pages_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if "://" in target or (target.startswith("#") and page != RESULTS):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        if resolved != RESULTS and DOCS / "experiments" not in [resolved, *resolved.parents]:
            continue
        if not resolved.exists() or (anchor and resolved.is_file() and anchor not in anchors(resolved)):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"
