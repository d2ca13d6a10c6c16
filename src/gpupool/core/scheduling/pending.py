"""The pending queue a view keeps across cycles: who waits, counted by (queue, shape, rank).

A cycle is handed the whole pending list. `PendingBook` compares it with the list of the last cycle
by object identity (set operations over `id()`s, run in C) and updates its counts with the
arrivals and departures alone, so nominating costs a pass in C over the queue plus work for what
changed, instead of a Python loop over every waiting workload on every cycle. A caller that keeps
its queue in a `PendingQueue` and hands that over saves the passes too: the book reads the queue's
log of what joined and left since it last read it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import filterfalse, repeat
from types import MappingProxyType
from typing import Any, TypeVar, cast, overload

from gpupool.core.model import Workload
from gpupool.core.priority import Rank
from gpupool.core.scheduling.workloads import Meta, Shape

Key = tuple[str, Shape, Rank]
V = TypeVar("V")
R = TypeVar("R")

MAX_LOG_SLACK = 4096
"""A `PendingQueue` keeps its log of changes up to twice its length plus this many entries."""


class PendingQueue(Sequence[Workload]):
    """The pending workloads, one per id, in the order they joined, with a log of what joined and
    left: a caller that keeps its queue in one (the cycle benchmark's loop and the replay do) hands
    each cycle its changes, and the view's `PendingBook` reads the log instead of comparing the
    whole list with the last one. As a sequence it is `list(workloads)` in that order; a workload
    added again (or another object with its id) leaves first and joins at the end."""

    __slots__ = ("_base", "_ids", "_items", "_list", "_log")

    def __init__(self, workloads: Iterable[Workload] = ()) -> None:
        self._items: dict[str, Workload] = {}
        self._log: list[tuple[bool, Workload]] = []
        """(joined, workload) per change, in order; `_base` is the position of its first entry."""
        self._base = 0
        self._list: list[Workload] | None = None
        self._ids: list[str] | None = None
        for w in workloads:
            self.add(w)

    def add(self, w: Workload) -> None:
        self.pop(w.id)
        self._items[w.id] = w
        self._note(True, w)

    def pop(self, workload_id: str) -> Workload | None:
        """Take the workload with this id out (None when none waits)."""
        w = self._items.pop(workload_id, None)
        if w is not None:
            self._note(False, w)
        return w

    def by_id(self) -> Mapping[str, Workload]:
        """The waiting workloads by id (a read-only view of the queue's own dict, kept current)."""
        return MappingProxyType(self._items)

    def _note(self, joined: bool, w: Workload) -> None:
        self._list = self._ids = None
        log = self._log
        log.append((joined, w))
        if len(log) > 2 * len(self._items) + MAX_LOG_SLACK:
            self._base += len(log)  # a reader further behind compares whole lists once
            log.clear()

    @property
    def position(self) -> int:
        """How many changes the queue has logged (a reader's place in the log)."""
        return self._base + len(self._log)

    def changes_since(self, position: int) -> list[tuple[bool, Workload]] | None:
        """The changes logged since `position`, in order; None when they are no longer kept."""
        if position < self._base or position > self.position:
            return None
        return self._log[position - self._base:]

    def listed(self) -> list[Workload]:
        """The workloads in order (one list, made once per change: read it, do not change it)."""
        if self._list is None:
            self._list = list(self._items.values())
        return self._list

    def ids(self) -> list[str]:
        """The workloads' ids in order (read from the queue's keys: no workload is touched; one list,
        made once per change: read it, do not change it)."""
        if self._ids is None:
            self._ids = list(self._items)
        return self._ids

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Workload]:
        return iter(self.listed())

    @overload
    def __getitem__(self, index: int) -> Workload: ...

    @overload
    def __getitem__(self, index: slice) -> list[Workload]: ...

    def __getitem__(self, index: int | slice) -> Workload | list[Workload]:
        return self.listed()[index]


@dataclass(slots=True)
class PendingBook:
    """The workloads of the last pending list and the valid ones' counts per `Meta.key`."""

    objs: dict[int, Workload] = field(default_factory=dict)
    """By `id()`: every workload of the last list (held, so no other object takes its id)."""
    keys: dict[int, Key] = field(default_factory=dict)
    """By `id()`: the key of each valid one (a known priority class, a queue that feeds a ClusterQueue)."""
    invalid: dict[int, Workload] = field(default_factory=dict)
    """By `id()`: the others (refused for good on every cycle they are listed)."""
    counts: dict[Key, int] = field(default_factory=dict)
    """How many valid workloads wait per key (no zero entries)."""
    serial: int = 0
    """How many lists the book has taken (`PendingChanges.serial`)."""
    departed: list[Workload] = field(default_factory=list)
    """The valid workloads the last `update` found gone."""
    ids: set[int] = field(default_factory=set)
    """`objs`' keys as a set (kept with it), so comparing a list with it copies neither."""
    source: PendingQueue | None = None
    """The queue the last list was, and its `position` then (`_read`): its log since gives the
    next list's changes."""
    position: int = 0

    def update(
        self, pending: Sequence[Workload], meta_of: Callable[[Workload], Meta]
    ) -> list[Workload] | None:
        """Take `pending` as the current list; returns its arrivals (objects not in the last list)
        in its order, or None when it lists an object twice (then the book is emptied)."""
        queue = pending if isinstance(pending, PendingQueue) else None
        changes = None if queue is None or queue is not self.source else queue.changes_since(self.position)
        self.source = queue
        if queue is not None:
            self.position = queue.position
        if changes is not None:
            return self._read(changes, meta_of)
        current = set(map(id, pending))
        if len(current) != len(pending):
            self.clear()
            return None
        return self._compare(pending, current, meta_of)

    def _read(self, changes: list[tuple[bool, Workload]],
              meta_of: Callable[[Workload], Meta]) -> list[Workload]:
        """`_compare` from the queue's log: what joined since the last list and is there now is an
        arrival (in the list's order: the queue appends what joins), what was in the last list and
        left is a departure."""
        held = self.ids
        there: dict[int, Workload] = {}  # by id(): the objects the log names, whether there now
        now: dict[int, bool] = {}
        for joined, w in changes:
            there[id(w)] = w
            now.pop(id(w), None)  # its last change counts, and orders the arrivals
            now[id(w)] = joined
        gone = {k for k, joined in now.items() if not joined and k in held}
        new = [there[k] for k, joined in now.items() if joined and k not in held]
        return self._move(gone, new, meta_of)

    def _compare(self, pending: Sequence[Workload], current: set[int],
                 meta_of: Callable[[Workload], Meta]) -> list[Workload]:
        held = self.ids
        gone_ids = held - current
        new = current - held
        if not new:
            return self._move(gone_ids, [], meta_of)
        tail = pending[len(pending) - len(new):]  # arrivals usually come last
        arrivals = list(tail) if all(id(w) in new for w in tail) else [w for w in pending if id(w) in new]
        return self._move(gone_ids, arrivals, meta_of)

    def _move(self, gone_ids: set[int], arrivals: list[Workload], meta_of: Callable[[Workload], Meta]
              ) -> list[Workload]:
        """Drop the departed (`gone_ids`, held) and take the arrivals (not held), in order."""
        objs, held = self.objs, self.ids
        self.serial += 1
        departed = self.departed = []
        held -= gone_ids
        for gone in gone_ids:
            w = objs.pop(gone)
            if self.invalid.pop(gone, None) is None:
                departed.append(w)
                key = self.keys.pop(gone)
                left = self.counts[key] - 1
                if left:
                    self.counts[key] = left
                else:
                    del self.counts[key]
        held.update(map(id, arrivals))
        for w in arrivals:
            objs[id(w)] = w
            meta = meta_of(w)
            if meta.class_known and meta.cluster_queue is not None:
                self.keys[id(w)] = meta.key
                self.counts[meta.key] = self.counts.get(meta.key, 0) + 1
            else:
                self.invalid[id(w)] = w
        return arrivals

    def clear(self) -> None:
        self.serial += 1
        self.departed = []
        self.source = None
        self.objs.clear()
        self.ids.clear()
        self.keys.clear()
        self.invalid.clear()
        self.counts.clear()


MAX_VERDICTS = 4096
"""The most distinct verdicts `PassedWaits` interns before it starts afresh (a message may name
amounts, so a long-lived view could otherwise collect them without end)."""


@dataclass(slots=True)
class PassedWaits:
    """The record each passed-over workload got last, reused while its verdict stays the same.

    A cycle passes over most of a long queue with the verdict of its (queue, shape, rank), cycle
    after cycle the same one; building a fresh record for each of thousands of workloads is most of
    that pass. Verdicts are interned (`intern`), so "the same verdict as last time" is one identity
    test per key (`records_by_key`); only the workloads whose key's verdict changed (or that are
    new) get a new record. The records are equal to fresh ones (they are immutable tuples of the same fields).
    """

    records: dict[str, Any] = field(default_factory=dict)
    """By workload id: the record last built (from its key's verdict in `by_kid`)."""
    interned: dict[Any, Any] = field(default_factory=dict)
    by_kid: dict[int, object] = field(default_factory=dict)
    """By `Meta.kid`: the interned verdict every record of that key in `records` was built from
    (`records_by_key`); a key whose verdict changes has its records dropped first."""
    members: dict[int, list[str]] = field(default_factory=dict)
    """By `Meta.kid`: the ids whose records `records_by_key` built for that key (a superset:
    dropping a record that is not the key's only costs its rebuild)."""
    listed: int = 0
    """How many ids `members` lists in all (bounded: past it, every record starts afresh)."""

    def intern(self, verdict: V) -> V:
        """The one object kept for verdicts equal to `verdict`."""
        kept = self.interned.get(verdict)
        if kept is None:
            if len(self.interned) >= MAX_VERDICTS:
                self.interned.clear()  # records built from the old objects are rebuilt once
            kept = self.interned[verdict] = verdict
        return cast(V, kept)

    def records_by_key(self, wids: Sequence[str], kid_of: dict[str, int], verdicts: dict[int, V],
                       make: Callable[[str, V], R]) -> Iterator[R]:
        """The record of each workload, in order: `make(wid, verdicts[kid_of[wid]])` (the verdicts
        interned) unless the last one built has the same verdict. Checked per key rather than per
        workload: the records of a key whose verdict is another object than last time are dropped
        first, so every record left is current and only the missing ones are built; the passes
        over `wids` run in C, the one in Python is over the keys."""
        records, by_kid, members = self.records, self.by_kid, self.members
        if self.listed > 2 * len(records) + MAX_VERDICTS:
            records.clear()  # `members` lists departed ids too: start afresh rather than grow
            by_kid.clear()
            members.clear()
            self.listed = 0
        for kid, verdict in verdicts.items():
            if by_kid.get(kid) is not verdict:
                stale = members.pop(kid, None)
                if stale is not None:
                    self.listed -= len(stale)
                    deque(map(records.pop, stale, repeat(None)), 0)
                by_kid[kid] = verdict
        missing = list(filterfalse(records.__contains__, wids))
        for wid in missing:
            kid = kid_of[wid]
            verdict = verdicts[kid]
            records[wid] = make(wid, verdict)
            members.setdefault(kid, []).append(wid)
        self.listed += len(missing)
        return map(records.__getitem__, wids)

    def forget(self, workloads: Iterable[Workload]) -> None:
        """Drop the records of workloads no longer pending."""
        pop = self.records.pop
        for w in workloads:
            pop(w.id, None)

    def clear(self) -> None:
        self.records.clear()
        self.interned.clear()
        self.by_kid.clear()
        self.members.clear()
        self.listed = 0
