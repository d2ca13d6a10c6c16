"""A discrete-event loop with an injected clock: events fire in (time, order of scheduling) order."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class SimClock:
    """Simulated time in seconds; only the event loop moves it forward."""

    now_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happens at `at_s`: a kind the handler understands and its payload."""

    at_s: float
    kind: str
    payload: Any = None
    token: int = 0


class EventLoop:
    """Fires batches of simultaneous events; cancelled events are skipped lazily."""

    def __init__(self, clock: SimClock | None = None) -> None:
        self.clock = clock or SimClock()
        self._heap: list[tuple[float, int, Event]] = []
        self._seq = itertools.count()
        self._cancelled: set[int] = set()

    def schedule(self, at_s: float, kind: str, payload: Any = None) -> int:
        """Add an event; returns a token for `cancel`. Events in the past fire at the current time."""
        token = next(self._seq)
        at = max(at_s, self.clock.now_s)
        heapq.heappush(self._heap, (at, token, Event(at, kind, payload, token)))
        return token

    def cancel(self, token: int) -> None:
        self._cancelled.add(token)

    def __len__(self) -> int:
        return len(self._heap) - len(self._cancelled)

    def next_batch(self) -> list[Event]:
        """All live events at the earliest pending time (the clock moves there); [] when done."""
        heap = self._heap
        while heap and heap[0][1] in self._cancelled:
            self._cancelled.discard(heapq.heappop(heap)[1])
        if not heap:
            return []
        at = heap[0][0]
        batch: list[Event] = []
        while heap and heap[0][0] == at:
            _, token, event = heapq.heappop(heap)
            if token in self._cancelled:
                self._cancelled.discard(token)
                continue
            batch.append(event)
        self.clock.now_s = at
        return batch

    def run(self, handle: Callable[[float, list[Event]], None]) -> None:
        """Call `handle(now_s, batch)` for every batch until no events remain."""
        while batch := self.next_batch():
            handle(self.clock.now_s, batch)
