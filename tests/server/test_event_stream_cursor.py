"""The event stream's cursor (server/services/event_stream.py): where commits become visible out of
id order (PostgreSQL), an id missing below a newer one is waited for, delivered once when it shows,
and stepped past only after GAP_WAIT_S; on SQLite (no `present` ids) it simply follows."""

from __future__ import annotations

from gpupool.api.workloads import EventOut
from gpupool.server.services.event_stream import GAP_WAIT_S, Cursor, Page


def _event(event_id: int) -> EventOut:
    return EventOut(id=event_id, workload_id="w-1", pod_id="", from_status="", to_status="pending",
                    reason="submitted", message="", at_s=0.0)


def _ids(events: list[EventOut]) -> list[int]:
    return [e.id for e in events]


def test_a_late_commit_below_a_delivered_id_is_still_delivered_once() -> None:
    cursor = Cursor(done=0)
    # 1 and 3 committed, 2 (another transaction) not yet: 3 goes out, 2 is waited for
    assert _ids(cursor.take(Page([_event(1), _event(3)], 3, frozenset({1, 3})), 100.0)) == [1, 3]
    assert cursor.done == 1 and cursor.gaps == {2: 100.0}
    # the next read starts after `done`, so it sees 3 again (not sent twice) and 2 once it commits
    assert _ids(cursor.take(Page([_event(3)], 3, frozenset({3})), 100.5)) == []
    late = Page([_event(2), _event(3), _event(4)], 4, frozenset({2, 3, 4}))
    assert _ids(cursor.take(late, 101.0)) == [2, 4]
    assert cursor.done == 4 and not cursor.gaps and not cursor.sent


def test_another_streams_events_are_no_gap_and_a_rolled_back_id_is_passed_after_the_wait() -> None:
    cursor = Cursor(done=10)
    # 11 is stored but filtered out (another tenant's), 12 was never committed (rolled back)
    assert _ids(cursor.take(Page([_event(13)], 13, frozenset({11, 13})), 0.0)) == [13]
    assert cursor.done == 11 and set(cursor.gaps) == {12}
    assert _ids(cursor.take(Page([_event(13)], 13, frozenset({13})), GAP_WAIT_S - 0.1)) == []
    assert cursor.done == 11
    assert _ids(cursor.take(Page([], 13, frozenset({13})), GAP_WAIT_S)) == []
    assert cursor.done == 13 and not cursor.gaps


def test_without_out_of_order_commits_the_cursor_follows_the_newest_id() -> None:
    cursor = Cursor(done=0)
    assert _ids(cursor.take(Page([_event(1), _event(5)], 5), 0.0)) == [1, 5]
    assert cursor.done == 5 and not cursor.gaps
    assert _ids(cursor.take(Page([_event(5), _event(6)], 6), 0.0)) == [6]


def test_a_read_that_shows_nothing_of_this_stream_still_moves_it_on() -> None:
    """A quiet tenant's stream must not read the same growing range of others' events forever."""
    cursor = Cursor(done=7)
    assert _ids(cursor.take(Page([], 900), 0.0)) == [] and cursor.done == 900  # ids in order
    cursor = Cursor(done=7)
    assert _ids(cursor.take(Page([], 10, frozenset({8, 9, 10})), 0.0)) == [] and cursor.done == 10
