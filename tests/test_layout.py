"""The test tree's own rules: test modules outside packages need unique basenames (pytest imports
them by basename, and two alike fail collection on a clean checkout)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).parent


def test_test_modules_have_unique_basenames() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if (path.parent / "__init__.py").exists():
            continue  # inside a package: imported by its dotted name
        seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: where for name, where in seen.items() if len(where) > 1}
    assert not clashes, f"rename one of each: {clashes}"
