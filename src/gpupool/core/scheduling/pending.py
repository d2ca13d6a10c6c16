"""The pending queue a view keeps across cycles: who waits, counted by (queue, shape, rank).

A cycle is handed the whole pending list. `PendingBook` compares it with the list of the last cycle
by object identity (set operations over `id()`s, run in C) and updates its counts with the
arrivals and departures alone, so nominating costs a pass in C over the queue plus work for what
changed, instead of a Python loop over every waiting workload on every cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import is_not, itemgetter
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


_MISSING: tuple[object, object] = (None, None)
_verdict = itemgetter(0)
_record = itemgetter(1)

MAX_VERDICTS = 4096
"""The most distinct verdicts `PassedWaits` interns before it starts afresh (a message may name
amounts, so a long-lived view could otherwise collect them without end)."""


@dataclass(slots=True)
class PassedWaits:
    """The record each passed-over workload got last, reused while its verdict stays the same.

    A cycle passes over most of a long queue with the verdict of its (queue, shape, rank), cycle
    after cycle the same one; building a fresh record for each of thousands of workloads is most of
    that pass. Verdicts are interned (`intern`), so "the same verdict as last time" is one identity
    test per workload, run in C; only the workloads whose verdict changed (or that are new) get a
    new record. The records are equal to fresh ones (they are immutable tuples of the same fields).
    """

    records: dict[str, tuple[object, Any]] = field(default_factory=dict)
    """By workload id: (the interned verdict it was built from, the record)."""
    interned: dict[Any, Any] = field(default_factory=dict)

    def intern(self, verdict: V) -> V:
        """The one object kept for verdicts equal to `verdict`."""
        kept = self.interned.get(verdict)
        if kept is None:
            if len(self.interned) >= MAX_VERDICTS:
                self.interned.clear()  # records built from the old objects are rebuilt once
            kept = self.interned[verdict] = verdict
        return cast(V, kept)

    def records_for(self, wids: Sequence[str], verdicts: Sequence[V],
                    make: Callable[[str, V], R]) -> Iterator[R]:
        """The record of each workload (`make(wid, verdict)` unless the last one has the same interned
        verdict), in order."""
        records = self.records
        kept = list(map(records.get, wids, repeat(_MISSING)))
        for i in compress(range(len(kept)), map(is_not, map(_verdict, kept), verdicts)):
            wid, verdict = wids[i], verdicts[i]
            kept[i] = records[wid] = (verdict, make(wid, verdict))
        return map(_record, kept)

    def forget(self, workloads: Iterable[Workload]) -> None:
        """Drop the records of workloads no longer pending."""
        pop = self.records.pop
        for w in workloads:
            pop(w.id, None)

    def clear(self) -> None:
        self.records.clear()
        self.interned.clear()
