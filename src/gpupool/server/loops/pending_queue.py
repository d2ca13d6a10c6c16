"""The pending queue the scheduling loop keeps across cycles, in the store's order.

A full pass hands the core cycle the pending work it read from the store. Handed a fresh list, the
cycle's `PendingBook` compares it with the last one (passes over every waiting workload); handed
one `PendingQueue` kept from cycle to cycle, it reads the queue's log of what joined and left.
`StoreQueue` is such a queue whose sequence is the store's order (priority descending, submit
time, id: `load`'s ORDER BY), so the cycle decides exactly as on the list read afresh.

`KeptPending` keeps it in step: the loop tells it what it knows (submissions it took, admissions
it committed, work it requeued, the cancels and holds the API committed), and every full pass
queues the joiners it was told of, then checks the queue against what the store read returned,
object by object (a pass in C: where the loop knew every change, that is all). Whatever the loop
could not know (a release, a dependency met, an array cancelled, another process writing the
store, a restart, an admission that lost its compare-and-set, work past the read's cap) shows
there as a difference: the queue then takes the read's arrivals and departures (found by the
read's ids, in C; `resyncs` counts these passes), or, when the read's order is not the key's (a
collation), the cycle is handed the read itself (`rebuilds`). The queue handed is always the
read, in its order.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from itertools import compress
from operator import attrgetter, is_, is_not

from gpupool.core.model import Workload
from gpupool.core.scheduling.pending import PendingQueue

StoreKey = tuple[int, float, str]
_id = attrgetter("id")
MAX_EXPECTED_SLACK = 4096
"""`KeptPending.expected` is cleared past twice the queue plus this many ids."""


def store_key(w: Workload) -> StoreKey:
    """Where `w` stands in the store's order of pending work (`load`'s ORDER BY)."""
    return (-w.priority, w.submit_time_s, w.id)


class StoreQueue(PendingQueue):
    """A `PendingQueue` whose sequence is in `store_key` order: a workload joins where that order
    puts it (at the end, for the usual arrival). Its log's arrivals are handed in the same order,
    so a cycle reading the log finds what a cycle comparing lists finds."""

    __slots__ = ("_keys",)

    def __init__(self, workloads: Iterable[Workload] = ()) -> None:
        self._keys: list[StoreKey] = []
        """`store_key` of each workload queued, in the queue's order (sorted)."""
        super().__init__()
        self.join(workloads)

    def add(self, w: Workload) -> None:
        self.join((w,))

    def join(self, workloads: Iterable[Workload]) -> None:
        """Queue `workloads` (one leaves first where another of its id waits), each at its place."""
        joining = sorted({w.id: w for w in workloads}.values(), key=store_key)
        for w in joining:
            self.pop(w.id)
        if not joining:
            return
        keys, items = self._keys, self._items
        if not keys or store_key(joining[0]) > keys[-1]:  # all after the last: appended
            for w in joining:
                items[w.id] = w
                keys.append(store_key(w))
        else:
            # ids and workloads apart, zipped back: no tuple per queued workload is kept alive
            ids, queued = list(items), list(items.values())
            for w in reversed(joining):  # from the back, so the places found still hold
                key = store_key(w)
                at = bisect_right(keys, key)
                keys.insert(at, key)
                ids.insert(at, w.id)
                queued.insert(at, w)
            self._items = dict(zip(ids, queued, strict=True))
        for w in joining:
            self._note(True, w)

    def pop(self, workload_id: str) -> Workload | None:
        w = super().pop(workload_id)
        if w is not None:
            del self._keys[bisect_left(self._keys, store_key(w))]
        return w

    def changes_since(self, position: int) -> list[tuple[bool, Workload]] | None:
        """The net changes since `position`: what left, then what joined, in the queue's order
        (as a comparison of the lists finds the arrivals), each object by its last change."""
        changes = super().changes_since(position)
        if changes is None:
            return None
        last: dict[int, tuple[bool, Workload]] = {}
        for change in changes:
            last.pop(id(change[1]), None)
            last[id(change[1])] = change
        left = [c for c in last.values() if not c[0]]
        joined = sorted((c for c in last.values() if c[0]), key=lambda c: store_key(c[1]))
        return left + joined


class KeptPending:
    """The loop's `StoreQueue` with what it was told since the last full pass (module docstring)."""

    def __init__(self) -> None:
        self.queue = StoreQueue()
        self.expected: dict[str, Workload] = {}
        """Workloads the loop knows have joined pending since the last full pass (submitted, or
        requeued by it): the next pass queues them before it compares (one the read does not hold,
        held, waiting on a dependency or past the cap, then leaves again)."""
        self.resyncs = 0
        """Full passes whose read differed from the queue with what the loop knew (a change it
        could not know, or a joiner it was told of that the read does not hold)."""
        self.rebuilds = 0
        """Full passes whose read was not in `store_key` order (handed the read itself)."""
        self.last_resynced = False
        """Whether the last `follow` counted a resync (or a rebuild)."""

    def expect(self, workloads: Iterable[Workload]) -> None:
        expected = self.expected
        expected.update((w.id, w) for w in workloads)
        if len(expected) > 2 * len(self.queue) + MAX_EXPECTED_SLACK:
            expected.clear()  # (no full pass for long: the next one finds them in its read)

    def left(self, workload_id: str) -> None:
        """`workload_id` left pending by a committed write: the loop's admission, the API's cancel
        or hold."""
        self.expected.pop(workload_id, None)
        self.queue.pop(workload_id)

    def follow(self, read: Sequence[Workload]) -> PendingQueue:
        """The queue, made the pending work a full pass read (`read`, in the store's order); a
        queue of the read as it is when that order is not `store_key`'s."""
        queue, known = self.queue, self.expected
        self.expected = {}
        self.last_resynced = False
        if known:
            queue.join(known.values())
        listed = queue.listed()
        if len(listed) == len(read) and all(map(is_, listed, read)):
            return queue
        self.resyncs += 1
        self.last_resynced = True
        # what the read holds that the queue does not (as this very object), by the read's ids:
        # passes in C over the read, no set of every workload built
        queued = queue.by_id()
        new = list(compress(read, map(is_not, map(queued.get, map(_id, read)), read)))
        if len(listed) + len(new) == len(read):
            gone: list[Workload] = []  # every queued object was read
        else:
            there = dict(zip(map(_id, read), read, strict=True))
            gone = list(compress(listed, map(is_not, map(there.get, queue.ids()), listed)))
        for w in gone:
            if queued.get(w.id) is w:
                queue.pop(w.id)
        queue.join(new)
        if len(queue) == len(read) and all(map(is_, queue.listed(), read)):
            return queue
        # the store's order is not the key's (a collation): the read as it is, compared whole
        self.rebuilds += 1
        return PendingQueue(read)
