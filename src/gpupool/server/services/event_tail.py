"""The newest events, read once for every following stream (`GET /events/stream?follow=true`).

Without it each open stream reads the events table at every poll, so N followers cost N reads per
interval. The tail reads every tenant's new events at most once per `max_age_s`, whichever stream
asks first, and keeps the newest RECENT of them in memory; a stream whose cursor is inside the tail
takes its page from it (filtered as its own read would be), one that is behind it (a backlog, or a
client too slow for the tail's span) reads the table itself until it catches up. A page from the tail
is what a read of the table at the tail's last read would have returned, so the streams' cursors
(event_stream.Cursor) work unchanged, late commits included.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from dataclasses import dataclass, field

from starlette.concurrency import run_in_threadpool

from gpupool.api.workloads import EventOut
from gpupool.server.runtime import Runtime
from gpupool.server.services.event_stream import (
    PAGE,
    Cursor,
    Page,
    StreamFilter,
    encode,
    newest_id,
    read_all_after,
)

RECENT = 4096
"""Events the tail keeps: a follower more than this far behind reads the table itself."""
MAX_PAGES = 8
"""Pages one refresh reads at most; a burst beyond that is read at the next refresh."""


@dataclass(slots=True)
class _Read:
    """What one refresh found, applied on the event loop (pages are read in a worker thread)."""

    base: int
    rows: list[tuple[EventOut, str]] = field(default_factory=list)
    present: set[int] | None = None
    scanned_to: int = 0


class EventTail:
    """Every tenant's newest events, shared by the following streams of one server."""

    def __init__(self, rt: Runtime, max_age_s: float) -> None:
        self._rt = rt
        self._max_age_s = max_age_s
        self._lock = asyncio.Lock()
        self._read_at = float("-inf")
        self._cursor: Cursor | None = None
        self._base: int | None = None
        """Every stored event with a larger id, as of the last refresh, is held (or was given up
        on by the tail's cursor, as a stream's own would have)."""
        self._ids: list[int] = []
        self._held: dict[int, tuple[EventOut, str]] = {}
        self._encoded: dict[int, bytes] = {}
        self._ordered = True
        self._scanned_to = 0

    async def refresh(self) -> None:
        """Read the new events unless a refresh within `max_age_s` did (concurrent callers share
        one read)."""
        if time.monotonic() - self._read_at < self._max_age_s:
            return
        async with self._lock:
            if time.monotonic() - self._read_at < self._max_age_s:
                return
            found = await run_in_threadpool(self._read)
            self._apply(found)
            self._read_at = time.monotonic()

    def _read(self) -> _Read:
        if self._cursor is None:
            self._cursor = Cursor(done=newest_id(self._rt))
        found = _Read(base=self._cursor.done, scanned_to=self._cursor.done)
        for _ in range(MAX_PAGES):
            page, tenants = read_all_after(self._rt, self._cursor.done)
            fresh = {e.id for e in self._cursor.take(page, time.time())}
            found.rows += [(e, t) for e, t in zip(page.events, tenants, strict=True) if e.id in fresh]
            if page.present is not None:
                found.present = (found.present or set()) | page.present
            found.scanned_to = max(found.scanned_to, page.scanned_to)
            if len(page.events) < PAGE:
                break
        return found

    def _apply(self, found: _Read) -> None:
        if self._base is None:
            self._base = found.base
        self._ordered = found.present is None and self._ordered
        self._scanned_to = max(self._scanned_to, found.scanned_to)
        for event, tenant in found.rows:
            if event.id not in self._held and event.id > self._base:
                bisect.insort(self._ids, event.id)
                self._held[event.id] = (event, tenant)
        while len(self._ids) > RECENT:
            oldest = self._ids.pop(0)
            del self._held[oldest]
            self._encoded.pop(oldest, None)
            self._base = oldest

    def encoded(self, event: EventOut) -> bytes:
        """The event as a server-sent event, encoded once for every stream that sends it."""
        block = self._encoded.get(event.id)
        if block is None:
            block = encode(event)
            if event.id in self._held:
                self._encoded[event.id] = block
        return block

    def page(self, wanted: StreamFilter, after_id: int) -> Page[EventOut] | None:
        """What `event_stream.read_after(wanted, after_id)` would give as of the last refresh, or
        None when `after_id` is behind the tail (the caller reads the table)."""
        if self._base is None or after_id < self._base:
            return None
        start = bisect.bisect_right(self._ids, after_id)
        events: list[EventOut] = []
        end = len(self._ids)
        for index in range(start, len(self._ids)):
            event, tenant = self._held[self._ids[index]]
            if (wanted.tenant is None or tenant == wanted.tenant) and (
                    not wanted.workload_ids or event.workload_id in wanted.workload_ids):
                events.append(event)
                if len(events) == PAGE:
                    end = index + 1
                    break
        scanned_to = events[-1].id if len(events) == PAGE else max(self._scanned_to, after_id)
        if self._ordered:
            return Page(events, scanned_to)
        # every event the tail holds is one the table held: the ids it was given up on are not
        return Page(events, scanned_to, frozenset(self._ids[start:end]))
