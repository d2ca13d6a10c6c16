"""The pending queue a view keeps across cycles: who waits, counted by (queue, shape, rank).

A cycle is handed the whole pending list. `PendingBook` compares it with the list of the last cycle
by object identity (set operations over `id()`s, run in C) and updates its counts with the
arrivals and departures alone, so nominating costs a pass in C over the queue plus work for what
changed, instead of a Python loop over every waiting workload on every cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpupool.core.model import Workload
from gpupool.core.priority import Rank
from gpupool.core.scheduling.workloads import Meta, Shape

Key = tuple[str, Shape, Rank]


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
