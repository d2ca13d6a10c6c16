"""The shared "which gangs are due to move off congestion" rule (core/scheduling/congestion.py)."""

from __future__ import annotations

from gpupool.core.scheduling.congestion import due_to_move


def test_a_gang_is_due_once_hot_for_the_hold_time_and_leaves_the_clock() -> None:
    due, since = due_to_move({"b", "a"}, {}, 100.0, 300.0)
    assert due == [] and since == {"a": 100.0, "b": 100.0}
    due, since = due_to_move({"a", "b"}, since, 399.0, 300.0)
    assert due == [] and since == {"a": 100.0, "b": 100.0}
    due, since = due_to_move({"b", "a"}, since, 400.0, 300.0)
    assert due == ["a", "b"] and since == {}


def test_a_break_in_the_heat_restarts_the_clock() -> None:
    _, since = due_to_move({"a", "b"}, {}, 0.0, 300.0)
    _, since = due_to_move({"b"}, since, 200.0, 300.0)  # a cooled down
    assert since == {"b": 0.0}
    due, since = due_to_move({"a", "b"}, since, 300.0, 300.0)
    assert due == ["b"] and since == {"a": 300.0}


def test_no_hold_time_moves_at_the_first_hot_sample_and_nothing_hot_moves_nobody() -> None:
    assert due_to_move({"z", "y"}, {}, 5.0, 0.0) == (["y", "z"], {})
    assert due_to_move(set(), {"a": 0.0}, 1000.0, 300.0) == ([], {})
