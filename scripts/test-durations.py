#!/usr/bin/env python3
"""Write tests/durations.json from a pytest JUnit XML report: the seconds each scheduling unit took
(a test file, or the one unit of every test that starts Ray), summed over its tests' setup, call and
teardown. tests/conftest.py hands the longest units to pytest-xdist's workers first.

    .venv/bin/pytest -q -n 3 --junitxml=junit.xml && .venv/bin/python scripts/test-durations.py junit.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from work_units import DURATIONS, xdist_scope  # noqa: E402


def test_file(classname: str) -> str | None:
    """`tests.server.test_x.TestClass` → `tests/server/test_x.py` (the longest prefix that is a file)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (ROOT / path).is_file():
            return path
    return None


def main(report: str) -> int:
    seconds: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        path = test_file(case.get("classname", ""))
        if path is None:
            continue
        unit = xdist_scope(f"{path}::{case.get('name', '')}")
        seconds[unit] = seconds.get(unit, 0.0) + float(case.get("time") or 0.0)
    if not seconds:
        print(f"{report}: no test cases found; {DURATIONS.name} left as it was", file=sys.stderr)
        return 1
    ordered = dict(sorted(((k, round(v, 1)) for k, v in seconds.items()), key=lambda kv: (-kv[1], kv[0])))
    DURATIONS.write_text(json.dumps(ordered, indent=0) + "\n")
    total = sum(ordered.values())
    print(f"{len(ordered)} units, {total:.0f} s in all; the longest: "
          + ", ".join(f"{k} {v:.0f} s" for k, v in list(ordered.items())[:5]))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(sys.argv[1]))
