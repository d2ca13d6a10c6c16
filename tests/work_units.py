"""The units pytest-xdist's workers take whole, and the order they are handed out in (used by
tests/conftest.py's scheduler and by scripts/test-durations.py)."""

from __future__ import annotations

import json
from pathlib import Path


def xdist_scope(nodeid: str) -> str:
    """The unit of work a pytest-xdist worker takes whole: a test file (its module-scoped servers and
    the order its tests rely on stay as written), except that every test that starts Ray shares one
    unit: two Ray clusters starting side by side on a small machine time out, and the package's
    tests share one cluster; the node agent's tests share one (below), and so do the dashboard's."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(("tests/ray_provider/", "tests/ray_netns/")) or "[ray" in nodeid:
        return "ray"
    if path.startswith("tests/agent/"):
        # one unit: side by side, one file's pool swept another's pod named alike, and found the
        # tenant chain another pool of tenant "bob" still used in the host's table; both now carry
        # their agent's or pool's identity (leftovers.agent_mark, netns.tenant_key), but the files
        # were not yet run apart on many workers
        return "tests/agent/"
    if path.startswith("tests/ui/"):
        # one unit: the package's Chromium (and the browser's own network) then starts once per run,
        # not once for each file on whichever worker takes it: about 3 s of CPU a start
        return "tests/ui/"
    return path


DURATIONS = Path(__file__).parent / "durations.json"
"""Seconds each scheduling unit took in a recent run (`make test-durations` rewrites it): only the
order units are handed out in depends on it, never what runs."""
UNKNOWN_TEST_S = 0.5
"""What a test of a unit missing from DURATIONS is taken to cost (a new file)."""


def longest_first(units: dict[str, dict[str, bool]], seconds: dict[str, float]) -> list[str]:
    """The units in the order to hand them out: the longest first (LPT: with the longest last, one
    worker runs it alone at the end while the others idle), ties by name so the order is stable."""
    def expected(unit: str) -> float:
        return seconds.get(unit, UNKNOWN_TEST_S * len(units[unit]))
    return sorted(units, key=lambda unit: (-expected(unit), unit))


def recorded_durations() -> dict[str, float]:
    try:
        data = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}
