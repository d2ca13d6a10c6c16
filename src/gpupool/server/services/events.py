"""Record workload state transitions: every change of status goes through `transition` (one row,
ORM) or `apply_moves` (many rows, bulk statements).

A move that is not made is refused (not an edge of the tables in server/states.py) or lost (its
compare-and-set found the row changed since it was read). Both are told alike (`not_made`): one log
line, and one count by kind, outcome, from and to (`NOT_MADE`, `gpupool_state_moves_not_made_total`
on /metrics). `apply_moves` returns both to its caller, which leaves out what it would have written
beside them; `transition` and a loaded pod row's change raise `IllegalMove` on a refusal (their rows
are locked, so they lose no race), and the caller's transaction rolls back."""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Select, Update, bindparam, event, insert, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.base import NO_VALUE

from gpupool.server.orm import Base, EventRow, PodRow, WorkloadRow
from gpupool.server.states import pod_move_allowed, workload_move_allowed

log = logging.getLogger("gpupool.transitions")


class IllegalMove(RuntimeError):
    """A workload status change the transition table (server/states.py) does not allow."""


REFUSED, LOST = "refused", "lost"
"""The two outcomes of a move not made: not an edge of the table; a compare-and-set that lost."""

NOT_MADE: Counter[tuple[str, str, str, str]] = Counter()
"""Moves not made in this process, by (kind: workload or pod, outcome, from, to)."""
_NOT_MADE_LOCK = threading.Lock()
_WHY = {REFUSED: "it is not an edge of the transition table (a bug: nothing was written)",
        LOST: "its row had changed since it was read (a concurrent change won; nothing was written)"}


def moves_not_made() -> dict[tuple[str, str, str, str], int]:
    """A copy of `NOT_MADE`, taken under its lock."""
    with _NOT_MADE_LOCK:
        return dict(NOT_MADE)


def not_made(kind: str, outcome: str, subject: str, from_status: str, to_status: str, reason: str) -> None:
    """Tell of a move not made, the same way wherever it was refused or lost."""
    with _NOT_MADE_LOCK:
        NOT_MADE[(kind, outcome, from_status, to_status)] += 1
    log.warning("%s %s: move %s -> %s (%s) %s: %s", kind, subject, from_status, to_status, reason or "-",
                outcome, _WHY[outcome])


@event.listens_for(PodRow.status, "set")
def _pod_move(target: PodRow, value: str, old: object, _initiator: object) -> None:
    """Every change of a loaded pod row's status goes by the pod table (server/states.py); the bulk
    statements that move pods (launch, settle, promote) carry their legal source state in WHERE."""
    if old is NO_VALUE or old is None or old == value or not isinstance(old, str):
        return
    if not pod_move_allowed(old, value):
        not_made("pod", REFUSED, target.id, old, value, "")
        raise IllegalMove(f"pod {target.id}: {old} -> {value} is not allowed")


def transition(
    session: Session, row: WorkloadRow, to_status: str, reason: str, message: str, at_s: float,
    pod_id: str = "",
) -> None:
    """Move `row` (locked by the caller) to `to_status` and append the event (in the caller's
    transaction); an illegal move (server/states.py) is told (`not_made`) and raises IllegalMove,
    so the caller's transaction rolls back."""
    if not workload_move_allowed(row.status, to_status):
        not_made("workload", REFUSED, row.id, row.status, to_status, reason)
        raise IllegalMove(f"workload {row.id}: {row.status} -> {to_status} is not allowed")
    session.add(
        EventRow(
            workload_id=row.id,
            pod_id=pod_id,
            from_status=row.status,
            to_status=to_status,
            reason=reason,
            message=message[:1024],
            at_s=at_s,
        )
    )
    row.status = to_status
    row.reason = reason
    row.message = message[:1024]


@dataclass(frozen=True, slots=True)
class Move:
    """One workload transition for `apply_moves`: the row's new status, reason and message, the
    extra columns to set with it (e.g. finished_s), and the event that records it."""

    workload_id: str
    from_status: str
    to_status: str
    reason: str
    message: str
    at_s: float
    pod_id: str = ""
    columns: tuple[tuple[str, object], ...] = ()
    expect: tuple[tuple[str, object], ...] = ()
    """Columns that must hold these values too (read under the same lock as the status): an
    admission expects the row not held, not waiting on a dependency and of the shape it placed."""


_WORKLOADS = Base.metadata.tables["workloads"]
_INSERT_EVENT = insert(Base.metadata.tables["events"])


@functools.cache
def _update_for(columns: tuple[str, ...]) -> Update:
    names = ("status", "reason", "message", *columns)
    values: dict[str, Any] = {name: bindparam(f"v_{name}") for name in names}
    return update(_WORKLOADS).where(
        _WORKLOADS.c.id == bindparam("v_id"), _WORKLOADS.c.status == bindparam("v_expected"),
    ).values(values)


@functools.cache
def _lock_for(expected: tuple[str, ...]) -> Select[Any]:
    """The rows' statuses and `expected` columns, locked in id order (built once per shape)."""
    return (select(_WORKLOADS.c.id, _WORKLOADS.c.status, *(_WORKLOADS.c[name] for name in expected))
            .where(_WORKLOADS.c.id.in_(bindparam("ids", expanding=True)))
            .order_by(_WORKLOADS.c.id).with_for_update())


class LostMoves(RuntimeError):
    """Rows locked by `apply_moves` did not take its UPDATE: a bug, the transaction rolls back."""


def apply_moves(conn: Connection, moves: Sequence[Move]) -> list[Move]:
    """`transition` for many rows at once, in the caller's transaction, each a compare-and-set on
    the status the caller read (`from_status`). A move the table does not allow is refused. The
    rows of the others are locked and their statuses read (`SELECT ... FOR UPDATE`, in id order;
    SQLite's write transaction is exclusive anyway): a move whose row no longer holds the status it
    expects (a user's cancel committed since the caller read it) is lost. Refused and lost moves
    alike are told (`not_made`), write nothing (no row change, no event), and are returned so the
    caller can leave out what it would have written beside them. The others are written with one
    `UPDATE ... WHERE id = :id AND status = :expected` per set of extra columns, their row count
    checked, and get the same rows and events as `transition` would give them."""
    legal: list[Move] = []
    refused: list[Move] = []
    for move in moves:
        (legal if workload_move_allowed(move.from_status, move.to_status) else refused).append(move)
    for move in refused:
        not_made("workload", REFUSED, move.workload_id, move.from_status, move.to_status, move.reason)
    if not legal:
        return refused
    ids = sorted({m.workload_id for m in legal})
    expected = sorted({name for m in legal for name, _ in m.expect})
    read = conn.execute(_lock_for(tuple(expected)), {"ids": ids}).all()
    now_in: dict[str, Any] = {row.id: row for row in read}

    def holds(move: Move) -> bool:
        """Its row still has the status it expects, and the columns it expects (`Move.expect`)."""
        row = now_in.get(move.workload_id)
        return (row is not None and row.status == move.from_status
                and all(getattr(row, name) == value for name, value in move.expect))

    held = [m for m in legal if holds(m)]
    lost = [m for m in legal if not holds(m)]
    for move in lost:
        not_made("workload", LOST, move.workload_id, move.from_status, move.to_status, move.reason)
    shapes: dict[tuple[str, ...], list[dict[str, object]]] = {}
    for move in held:
        params: dict[str, object] = {"v_id": move.workload_id, "v_expected": move.from_status,
                                     "v_status": move.to_status, "v_reason": move.reason,
                                     "v_message": move.message[:1024]}
        params.update((f"v_{name}", value) for name, value in move.columns)
        shapes.setdefault(tuple(name for name, _ in move.columns), []).append(params)
    for columns, rows in shapes.items():
        changed = conn.execute(_update_for(columns), rows).rowcount
        if changed != len(rows):
            raise LostMoves(f"{len(rows) - changed} of {len(rows)} locked workload rows did not take "
                            "their move (two moves of one workload in one call?)")
    if held:
        conn.execute(_INSERT_EVENT, [
            {"workload_id": m.workload_id, "pod_id": m.pod_id, "from_status": m.from_status,
             "to_status": m.to_status, "reason": m.reason, "message": m.message[:1024], "at_s": m.at_s}
            for m in held
        ])
    return refused + lost
