"""A caller's `PendingQueue` hands each cycle its changes: the view's `PendingBook` reads them from
the queue's log and ends where comparing the whole list with the last one ends."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import test_admission_properties as props
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import cluster
from gpupool.core.model import Workload
from gpupool.core.scheduling import cycle, pending
from gpupool.core.scheduling.cycle import CycleResult, Policies, cycle_on
from gpupool.core.scheduling.pending import PendingBook, PendingQueue
from gpupool.core.scheduling.view import ClusterView

VIEW = ClusterView.empty(cluster(1, devices=4), props.QUOTA)


def _meta(w: Workload):  # type: ignore[no-untyped-def]
    return VIEW.meta(w, None)


def _job(i: int, tenant: str = "a", cls: str = "normal") -> Workload:
    return props._workload(i, (tenant, cls, (1, 1000), 1, 10.0), float(i))


def _same_books(read: PendingBook, compared: PendingBook) -> None:
    assert read.ids == compared.ids
    assert read.counts == compared.counts
    assert read.keys == compared.keys and read.invalid.keys() == compared.invalid.keys()
    assert sorted(map(id, read.departed)) == sorted(map(id, compared.departed))


# one change to the queue: (what, which)
change = st.tuples(st.sampled_from(["add", "again", "replace", "pop", "pop-absent"]), st.integers(0, 10**6))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(change, max_size=12), min_size=1, max_size=8),
       st.sampled_from([pending.MAX_LOG_SLACK, 0]))
def test_the_log_read_gives_what_comparing_lists_gives(rounds: list, slack: int) -> None:
    """Rounds of changes (new workloads, one added again, another object under a listed id, one
    taken out, an id not listed taken out); after each, a book reading the queue and a book
    comparing its list end alike: the same arrivals in the same order, departures, counts. With
    no slack the log is cut short now and then: a reader behind it compares lists instead."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pending, "MAX_LOG_SLACK", slack)
        queue = PendingQueue()
        plain: dict[str, Workload] = {}
        read, compared = PendingBook(), PendingBook()
        serial = 0
        for changes in rounds:
            for what, pick in changes:
                listed = sorted(plain)
                if what == "add" or not listed:
                    serial += 1
                    tenant = "nobody" if pick % 7 == 0 else "abc"[pick % 3]  # some feed no ClusterQueue
                    w = _job(serial, tenant, props.CLASSES[pick % 4])
                elif what == "again":
                    w = plain[listed[pick % len(listed)]]
                elif what == "replace":
                    w = replace(plain[listed[pick % len(listed)]], submit_time_s=float(pick))
                else:
                    wid = listed[pick % len(listed)] if what == "pop" else "absent"
                    assert queue.pop(wid) is plain.pop(wid, None)
                    continue
                queue.add(w)
                plain.pop(w.id, None)
                plain[w.id] = w
            assert list(queue) == list(plain.values()) and len(queue) == len(plain)
            arrivals = read.update(queue, _meta)
            expected = compared.update(list(plain.values()), _meta)
            assert arrivals is not None and expected is not None
            assert list(map(id, arrivals)) == list(map(id, expected))
            _same_books(read, compared)


def test_a_book_handed_another_list_meanwhile_compares_the_queue_whole() -> None:
    """The log says what changed since the book last read the queue; a list handed over in between
    (the caller's own, or another queue) leaves the book in another state, so it compares."""
    queue = PendingQueue([_job(1), _job(2)])
    book, compared = PendingBook(), PendingBook()
    book.update(queue, _meta)
    compared.update(list(queue), _meta)
    third = _job(3)
    book.update([third], _meta)  # another list: the queue's jobs left the book
    compared.update([third], _meta)
    queue.add(_job(4))
    arrivals = book.update(queue, _meta)
    expected = compared.update(list(queue), _meta)
    assert arrivals is not None and [w.id for w in arrivals] == ["w1", "w2", "w4"] == [
        w.id for w in expected or []]
    _same_books(book, compared)
    other = PendingQueue([_job(5)])
    assert [w.id for w in book.update(other, _meta) or []] == ["w5"]
    queue.pop("w1")
    assert [w.id for w in book.update(queue, _meta) or []] == ["w2", "w4"]
    assert book.position == queue.position  # the next read starts after what this one read
    assert sorted(w.id for w in book.departed) == ["w5"]


def test_the_log_stays_bounded() -> None:
    queue = PendingQueue()
    for i in range(3 * pending.MAX_LOG_SLACK):
        queue.add(_job(i))
        queue.pop(f"w{i}")
    assert len(queue) == 0 and queue.position == 6 * pending.MAX_LOG_SLACK
    assert queue.changes_since(0) is None  # cut: a reader this far behind compares lists
    assert queue.changes_since(queue.position) == []


def _drive(sequence: list, policies: Policies, kept: bool) -> list[CycleResult]:  # type: ignore[type-arg]
    """Arrivals, completions, preemptions requeued, admissions taken out, a waiting workload
    withdrawn now and then: each cycle handed the queue itself (`kept`) or a fresh list of it."""
    view = ClusterView.empty(cluster(2, devices=4), policies.quota, policies.priority_classes)
    rng, order = random.Random(5), random.Random(6)
    queue = PendingQueue()
    results = []
    for step, (op, spec) in enumerate(sequence):
        now = float(step * 5)
        if op == "finish" and view.running:
            view.remove(sorted(view.running)[order.randrange(len(view.running))])
        elif op == "leave" and len(queue):
            queue.pop(queue[order.randrange(len(queue))].id)
        queue.add(props._workload(step, spec, now))
        running = {wid: r.workload for wid, r in view.running.items()}
        result = cycle_on(view, queue if kept else list(queue), policies, now, rng)
        for stop in result.preempted:
            queue.add(running[stop.workload_id])
        for admission in result.admitted:
            queue.pop(admission.workload_id)
        for rejection in result.rejected:
            if rejection.final:
                queue.pop(rejection.workload_id)
        results.append(result)
    return results


@pytest.mark.parametrize("seed", range(24))
def test_cycles_handed_the_queue_decide_as_cycles_handed_lists(seed: int) -> None:
    """Whole cycles, every rejection in order included (a queue of a dozen or more, most of it passed
    over), and as with the book off altogether."""
    rng = random.Random(seed)
    sizes = [(1, 250), (1, 1000), (2, 1000)]
    sequence = [(rng.choice(["arrive", "arrive", "finish", "leave"]),
                 (rng.choice("abc"), rng.choice(props.CLASSES), rng.choice(sizes), rng.randint(1, 4), 10.0))
                for _ in range(30)]
    policies = replace(props.BASE, ordering=rng.choice(["fifo", "priority-fifo", "drf", "las"]),
                       preemption=rng.random() < 0.7, backfill=True)
    handed = _drive(sequence, policies, kept=True)
    assert handed == _drive(sequence, policies, kept=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle._Cycle, "keep_pending", False)
        assert handed == _drive(sequence, policies, kept=True)
