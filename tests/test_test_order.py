"""The order pytest-xdist's workers take test files in (tests/conftest.py): longest first."""

from __future__ import annotations

import json

from work_units import DURATIONS, longest_first, recorded_durations, xdist_scope


def test_the_longest_recorded_unit_goes_first_and_unknown_units_count_their_tests() -> None:
    units = {"tests/a.py": {"x": False}, "tests/b.py": {"y": False, "z": False},
             "tests/new.py": {f"t{i}": False for i in range(100)}, "ray": {"r": False}}
    seconds = {"tests/a.py": 30.0, "tests/b.py": 2.0, "ray": 45.0}
    # new.py is unknown: 100 tests at 0.5 s is 50 s, before ray's 45
    assert longest_first(units, seconds) == ["tests/new.py", "ray", "tests/a.py", "tests/b.py"]


def test_ties_keep_one_order_whatever_the_collection_order() -> None:
    a = {"tests/b.py": {"x": False}, "tests/a.py": {"y": False}}
    b = {"tests/a.py": {"y": False}, "tests/b.py": {"x": False}}
    assert longest_first(a, {}) == longest_first(b, {}) == ["tests/a.py", "tests/b.py"]


def test_the_recorded_durations_name_units_that_exist() -> None:
    """A unit renamed or removed leaves a stale line: harmless to the order, but regenerate the file
    (`make test-durations`) when most of it no longer matches."""
    recorded = recorded_durations()
    assert recorded, f"{DURATIONS} is missing or unreadable"
    assert json.loads(DURATIONS.read_text()) == recorded
    root = DURATIONS.parent.parent
    known = [u for u in recorded if u == xdist_scope(u) and (u == "ray" or (root / u).exists())]
    assert len(known) >= 0.8 * len(recorded), sorted(set(recorded) - set(known))
