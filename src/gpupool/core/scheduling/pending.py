"""The pending queue a view keeps across cycles: who waits, counted by (queue, shape, rank).

A cycle is handed the whole pending list. `PendingBook` compares it with the list of the last cycle
by object identity (set operations over `id()`s, run in C) and updates its counts with the
arrivals and departures alone, so nominating costs a pass in C over the queue plus work for what
changed, instead of a Python loop over every waiting workload on every cycle.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import filterfalse, repeat
from typing import Any, TypeVar, cast

from gpupool.core.model import Workload
from gpupool.core.priority import Rank
from gpupool.core.scheduling.workloads import Meta, Shape

Key = tuple[str, Shape, Rank]
V = TypeVar("V")
R = TypeVar("R")


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

    def update(
        self, pending: Sequence[Workload], meta_of: Callable[[Workload], Meta]
    ) -> list[Workload] | None:
        """Take `pending` as the current list; returns its arrivals (objects not in the last list)
        in its order, or None when it lists an object twice (then the book is emptied)."""
        current = set(map(id, pending))
        if len(current) != len(pending):
            self.clear()
            return None
        objs, held = self.objs, self.ids
        self.serial += 1
        departed = self.departed = []
        gone_ids = held - current
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
        new = current - held
        if not new:
            return []
        held |= new
        tail = pending[len(pending) - len(new):]  # arrivals usually come last
        arrivals = list(tail) if all(id(w) in new for w in tail) else [w for w in pending if id(w) in new]
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
