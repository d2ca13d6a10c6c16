"""Dependencies between workloads (`submit --dependency`): checked at submit, then judged by the
control loop whenever work may have ended, which clears, rewrites or cancels the pending work that
waits on them.

A waiting workload's row carries the part that does not hold yet in `waiting_on` ('' once all
hold); the scheduler's read leaves such rows out, so the core never sees them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, or_, select, update
from sqlalchemy.orm import Session

from gpupool.api.dependency_spec import (
    Dependency,
    DependencyKind,
    Judgement,
    Verdict,
    judge,
    named_ids,
    parse_dependency,
)
from gpupool.api.events import EventReason
from gpupool.core.model import WorkloadStatus
from gpupool.errors import InvalidInput, NotFound
from gpupool.server.orm import Base
from gpupool.server.runtime import Runtime
from gpupool.server.services.events import Move, apply_moves

log = logging.getLogger("gpupool.dependencies")

_W = Base.metadata.tables["workloads"]
_E = Base.metadata.tables["events"]
_UNFINISHED = (WorkloadStatus.PENDING.value, WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)
ARRIVAL_MARGIN_S = 5.0
"""Arrivals are read from this long before the newest submission judged: a submission's time is
taken before its commit, so one committed after a later one is still read."""
CHUNK = 500
"""Ids per IN list (SQLite binds at most 32,766 parameters a statement)."""

_SET_WAITING = update(_W).where(
    _W.c.id == bindparam("d_id"), _W.c.status == WorkloadStatus.PENDING.value,
    _W.c.waiting_on == bindparam("d_was"),
).values(waiting_on=bindparam("d_now"), reason=bindparam("d_reason"), message=bindparam("d_message"))


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), CHUNK):
        yield items[start:start + CHUNK]


def statuses(conn: Connection, ids: Sequence[str], tenant: str | None = None) -> dict[str, list[str]]:
    """id -> the statuses of the work it names (itself, or an array's tasks), for `tenant`'s work
    only when given."""
    found: dict[str, list[str]] = {}
    wanted = set(ids)
    for part in _chunks(list(wanted)):
        query = select(_W.c.id, _W.c.array_id, _W.c.status).where(
            or_(_W.c.id.in_(part), _W.c.array_id.in_(part)))
        if tenant is not None:
            query = query.where(_W.c.tenant == tenant)
        for row in conn.execute(query):
            for key in (row.id, row.array_id):
                if key in wanted:
                    found.setdefault(key, []).append(row.status)
    for seen in found.values():
        seen.sort()  # comparable from one read to the next
    return found


def _has_singleton(parts: Sequence[Dependency]) -> bool:
    return any(p.kind is DependencyKind.SINGLETON for p in parts)


def _singleton_blocked(conn: Connection, tenant: str, name: str) -> bool:
    """Whether some workload of `tenant` named `name` is unfinished (at submit, all others are earlier)."""
    return conn.scalar(select(_W.c.id).where(
        _W.c.tenant == tenant, _W.c.name == name, _W.c.status.in_(_UNFINISHED)).limit(1)) is not None


def at_submit(session: Session, tenant: str, name: str, text: str) -> Judgement:
    """Check a submission's dependency against the store: every id it names must be `tenant`'s work
    (another tenant's id reads exactly as an unknown one: NotFound); singleton needs a name. Returns
    how it stands now (a never-satisfiable one is left to the loop, which cancels it with the reason)."""
    parts = parse_dependency(text)
    if _has_singleton(parts) and not name:
        raise InvalidInput("A singleton dependency waits on earlier work of the same name: give the workload "
                           "a --name.", field="dependency")
    conn = session.connection()
    ids = named_ids(parts)
    found = statuses(conn, ids, tenant)
    missing = [i for i in ids if i not in found]
    if missing:
        raise NotFound(f"No workload {missing[0]!r} to depend on; list yours with `gpupool ls`.",
                       workload=missing[0])
    blocked = _has_singleton(parts) and _singleton_blocked(conn, tenant, name)
    return judge(parts, found, blocked)


@dataclass(frozen=True, slots=True)
class _Waiting:
    id: str
    tenant: str
    name: str
    submit_s: float
    waiting_on: str
    reason: str
    held: str


class DependencyPass:
    """Judges the pending work that waits on a dependency; kept by the control loop (each waiting
    workload's parsed expression is cached: a spec's dependency never changes)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._parsed: dict[str, tuple[tuple[Dependency, ...], bool]] = {}
        self.dirty = True
        """A pass changed something, or none ran yet: the next one judges every waiting row."""
        self._last_targets: tuple[str, ...] = ()
        self._last_found: dict[str, list[str]] | None = None
        """The statuses of what the waiting rows named at the last pass (None: judge afresh)."""
        self._horizon_s = float("-inf")
        """The newest submit time among the rows judged so far (arrivals are read from it)."""

    def run(self, force: bool = True, arrivals: bool = False) -> int:
        """Judge the waiting workloads: clear those whose dependency holds, cancel (or keep, with the
        reason) those whose never can, and rewrite what the others wait on when it changed. Read in
        one read transaction; a write transaction is opened only when something changed, and each
        write there is a compare-and-set on the row as read. Returns how many became placeable or
        were cancelled (either may let more work proceed).

        With `force` every waiting row is judged. Without it, the pass first reads the statuses of
        the work the waiting rows named at the last pass: when none changed, only the rows submitted
        since (`arrivals`: a dependency was submitted) are judged, or none. So a pod ending elsewhere
        costs one small read, and a burst of dependent submissions costs what they add. Rows waiting
        on a singleton (whose blockers are not named) make every pass judge all."""
        self.dirty = False
        now = self.rt.clock()
        with self.rt.store.read() as session:
            conn = session.connection()
            last = self._last_found
            unchanged = (not force and last is not None
                         and statuses(conn, self._last_targets) == last)
            if unchanged and not arrivals:
                return 0
            query = select(_W.c.id, _W.c.tenant, _W.c.name, _W.c.submit_s, _W.c.waiting_on,
                           _W.c.reason, _W.c.held).where(_W.c.status == WorkloadStatus.PENDING.value,
                                              _W.c.waiting_on != "")
            if unchanged:
                query = query.where(_W.c.submit_s >= self._horizon_s - ARRIVAL_MARGIN_S)
            rows = [_Waiting(*r) for r in conn.execute(query)]
            if not rows:
                if not unchanged:
                    self._parsed.clear()
                    self._last_targets, self._last_found = (), {}
                return 0
            self._parse(conn, rows, prune=not unchanged)
            parts_of = {r.id: self._parsed[r.id][0] for r in rows}
            distinct = set(parts_of.values())
            named = named_ids([p for parts in distinct for p in parts])
            if unchanged and last is not None:
                known = set(self._last_targets)
                targets = (*self._last_targets, *(i for i in named if i not in known))
                found = {**last, **statuses(conn, [i for i in named if i not in known])}
            else:
                targets, found = named, statuses(conn, named)
            singles = {parts for parts in distinct if _has_singleton(parts)}
            blocked = (self._singletons(conn, [r for r in rows if parts_of[r.id] in singles])
                       if singles else set())
        self._horizon_s = max(self._horizon_s, max(r.submit_s for r in rows))
        decided = self._decide(rows, parts_of, found, blocked, now)
        self._last_targets, self._last_found = (targets, found) if not singles else ((), None)
        if not any(list(decided)):
            return 0
        with self.rt.store.write() as session:
            changed = _apply(session.connection(), *decided)
        self._last_found = None  # what was written changes what waits: judge afresh next time
        if changed:
            self.dirty = True  # a cancel may make the work waiting on it never satisfiable
            self.rt.capacity_may_have_changed()  # cleared work is older than the scheduler's horizon
        return changed

    def _parse(self, conn: Connection, rows: Sequence[_Waiting], prune: bool) -> None:
        if prune:  # `rows` are all that wait: forget the others
            for stale in set(self._parsed) - {r.id for r in rows}:
                del self._parsed[stale]
        unparsed = [r.id for r in rows if r.id not in self._parsed]
        for part in _chunks(unparsed):
            for row in conn.execute(select(_W.c.id, _W.c.spec).where(_W.c.id.in_(part))):
                text = row.spec.get("dependency") or ""
                try:
                    parts = parse_dependency(text)
                except ValueError:  # cannot be stored so (the spec is validated); never hold it forever
                    log.error("workload %s waits on a dependency that does not parse: %r", row.id, text)
                    parts = ()
                self._parsed[row.id] = (parts, bool(row.spec.get("kill_on_invalid_dep", True)))

    @staticmethod
    def _singletons(conn: Connection, rows: Sequence[_Waiting]) -> set[str]:
        """The ids among `rows` behind an earlier unfinished workload of the same tenant and name."""
        if not rows:
            return set()
        keys = {(r.tenant, r.name) for r in rows}
        earliest: dict[tuple[str, str], tuple[float, str]] = {}
        names = sorted({name for _, name in keys})
        for part in _chunks(names):
            for row in conn.execute(select(_W.c.id, _W.c.tenant, _W.c.name, _W.c.submit_s).where(
                    _W.c.name.in_(part), _W.c.status.in_(_UNFINISHED))):
                key = (row.tenant, row.name)
                if key in keys and (key not in earliest or (row.submit_s, row.id) < earliest[key]):
                    earliest[key] = (row.submit_s, row.id)
        return {r.id for r in rows
                if earliest.get((r.tenant, r.name), (r.submit_s, r.id)) < (r.submit_s, r.id)}

    def _decide(self, rows: Sequence[_Waiting], parts_of: dict[str, tuple[Dependency, ...]],
                found: dict[str, list[str]], blocked: set[str], now: float) -> _Decided:
        """The cancels, and the rows whose waiting part or reason changed (with their events)."""
        cancels: list[Move] = []
        updates: list[dict[str, object]] = []
        events: list[dict[str, object]] = []
        verdicts: dict[tuple[tuple[Dependency, ...], bool], Judgement] = {}
        for row in rows:
            key = (parts_of[row.id], row.id in blocked)
            verdict = verdicts.get(key)
            if verdict is None:
                verdict = verdicts[key] = judge(key[0], found, key[1])
            if verdict.verdict is Verdict.NEVER and self._parsed[row.id][1]:
                message = f"Its dependency can never hold: {verdict.why}."
                cancels.append(Move(row.id, WorkloadStatus.PENDING.value, WorkloadStatus.CANCELLED.value,
                                    EventReason.DEPENDENCY_NEVER_SATISFIED.value, message, now,
                                    columns=(("finished_s", now),)))
                continue
            if verdict.verdict is Verdict.MET:
                reason, message, waiting = EventReason.DEPENDENCY_MET.value, "Its dependency holds.", ""
                if row.held:  # what keeps it waiting now is the hold: its reason stays
                    reason = EventReason.HELD.value
                    message = f"Held by the {row.held}; its dependency holds."
            elif verdict.verdict is Verdict.NEVER:
                reason = EventReason.DEPENDENCY_NEVER_SATISFIED_KEPT.value
                message = f"Its dependency can never hold: {verdict.why}; kept (--kill-on-invalid-dep no)."
                waiting = verdict.why or "never"
            else:
                reason = EventReason.WAITING_FOR_DEPENDENCY.value
                message, waiting = f"Waits for {verdict.why}.", verdict.why
            if waiting == row.waiting_on and reason == row.reason:
                continue
            updates.append({"d_id": row.id, "d_was": row.waiting_on, "d_now": waiting[:1024],
                            "d_reason": reason, "d_message": message[:1024]})
            events.append({"workload_id": row.id, "pod_id": "", "from_status": WorkloadStatus.PENDING.value,
                           "to_status": WorkloadStatus.PENDING.value, "reason": reason,
                           "message": message[:1024], "at_s": now})
        return _Decided(cancels, updates, events)


@dataclass(frozen=True, slots=True)
class _Decided:
    cancels: list[Move]
    updates: list[dict[str, object]]
    events: list[dict[str, object]]

    def __iter__(self) -> Iterator[list[Any]]:
        return iter((self.cancels, self.updates, self.events))


def _apply(conn: Connection, cancels: list[Move], updates: list[dict[str, object]],
           events: list[dict[str, object]]) -> int:
    """Write what `_decide` found, each a compare-and-set on the row as read (a cancel or a change
    committed since leaves that row as it is); returns how many were cleared or cancelled."""
    cleared = 0
    taken = []
    for values, event in zip(updates, events, strict=True):
        if conn.execute(_SET_WAITING, values).rowcount:
            taken.append(event)
            cleared += values["d_now"] == ""
    if taken:
        conn.execute(_E.insert(), taken)
    for start in range(0, len(cancels), CHUNK):
        chunk = cancels[start:start + CHUNK]
        lost = {m.workload_id for m in apply_moves(conn, chunk)}
        done = [m.workload_id for m in chunk if m.workload_id not in lost]
        cleared += len(done)
        if done:
            conn.execute(update(_W).where(_W.c.id.in_(done)).values(waiting_on=""))
    return cleared
