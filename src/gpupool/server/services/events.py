"""Record workload state transitions: every change of status goes through `transition` (one row,
ORM) or `apply_moves` (many rows, bulk statements)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Update, bindparam, event, insert, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.base import NO_VALUE

from gpupool.server.orm import Base, EventRow, PodRow, WorkloadRow
from gpupool.server.states import pod_move_allowed, workload_move_allowed

log = logging.getLogger("gpupool.transitions")


class IllegalMove(RuntimeError):
    """A workload status change the transition table (server/states.py) does not allow."""


def _refused(workload_id: str, from_status: str, to_status: str, reason: str) -> None:
    log.error("refused illegal move of workload %s: %s -> %s (%s)", workload_id, from_status, to_status,
              reason)


@event.listens_for(PodRow.status, "set")
def _pod_move(target: PodRow, value: str, old: object, _initiator: object) -> None:
    """Every change of a loaded pod row's status goes by the pod table (server/states.py); the bulk
    statements that move pods (launch, settle, promote) carry their legal source state in WHERE."""
    if old is NO_VALUE or old is None or old == value or not isinstance(old, str):
        return
    if not pod_move_allowed(old, value):
        log.error("refused illegal move of pod %s: %s -> %s", target.id, old, value)
        raise IllegalMove(f"pod {target.id}: {old} -> {value} is not allowed")


def transition(
    session: Session, row: WorkloadRow, to_status: str, reason: str, message: str, at_s: float,
    pod_id: str = "",
) -> None:
    """Move `row` to `to_status` and append the event (in the caller's transaction); an illegal move
    (server/states.py) is logged and raises IllegalMove, so the caller's transaction rolls back."""
    if not workload_move_allowed(row.status, to_status):
        _refused(row.id, row.status, to_status, reason)
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


class LostMoves(RuntimeError):
    """Rows locked by `apply_moves` did not take its UPDATE: a bug, the transaction rolls back."""


def apply_moves(conn: Connection, moves: Sequence[Move]) -> list[Move]:
    """`transition` for many rows at once, in the caller's transaction, each a compare-and-set on
    the status the caller read (`from_status`). The rows are locked and their statuses read
    (`SELECT ... FOR UPDATE`, in id order; SQLite's write transaction is exclusive anyway): a move
    whose row no longer holds the status it expects (a user's cancel committed since the caller
    read it) is lost, writes nothing (no row change, no event), and is returned so the caller can
    leave out what it would have written beside it. The others are written with one
    `UPDATE ... WHERE id = :id AND status = :expected` per set of extra columns, their row count
    checked, and get the same rows and events as `transition` would give them."""
    legal = []
    for move in moves:
        if workload_move_allowed(move.from_status, move.to_status):
            legal.append(move)
        else:
            _refused(move.workload_id, move.from_status, move.to_status, move.reason)
    if not legal:
        return []
    ids = sorted({m.workload_id for m in legal})
    expected = sorted({name for m in legal for name, _ in m.expect})
    read = conn.execute(
        select(_WORKLOADS.c.id, _WORKLOADS.c.status, *(_WORKLOADS.c[name] for name in expected))
        .where(_WORKLOADS.c.id.in_(ids)).order_by(_WORKLOADS.c.id).with_for_update()).all()
    now_in: dict[str, Any] = {row.id: row for row in read}

    def holds(move: Move) -> bool:
        row = now_in.get(move.workload_id)
        return (row is not None and row.status == move.from_status
                and all(getattr(row, name) == value for name, value in move.expect))

    held = [m for m in legal if holds(m)]
    lost = [m for m in legal if not holds(m)]
    if lost:
        first = lost[0]
        log.warning("%d of %d workload moves were dropped: their rows had changed since they were read "
                    "(e.g. %s was no longer %s%s when it was to become %s)", len(lost), len(legal),
                    first.workload_id, first.from_status, " as expected" if first.expect else "",
                    first.to_status)
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
    return lost
