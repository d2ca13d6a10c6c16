"""Record workload state transitions: every change of status goes through `transition` (one row,
ORM) or `apply_moves` (many rows, bulk statements)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Update, bindparam, event, insert, update
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
    """Rows the caller had locked did not hold the status it read: a bug, the transaction rolls back."""


def apply_moves(conn: Connection, moves: Sequence[Move], *, locked: bool = False) -> list[Move]:
    """`transition` for many rows at once, in the caller's transaction, each a compare-and-set on
    the status the caller read (`from_status`): `UPDATE ... WHERE id = :id AND status = :expected`,
    its row count checked. A move whose row another transaction changed since it was read (a
    user's cancel) is lost: nothing of it is written (no row change, no event) and it is returned,
    so the caller can undo what it wrote beside it. The moves that hold get the same rows and events
    as `transition` would give them.

    With `locked` the caller read the rows FOR UPDATE in this transaction, so none can be lost: the
    rows of one shape go in one statement and a short count raises LostMoves."""
    legal = []
    for move in moves:
        if workload_move_allowed(move.from_status, move.to_status):
            legal.append(move)
        else:
            _refused(move.workload_id, move.from_status, move.to_status, move.reason)
    if not legal:
        return []
    shapes: dict[tuple[str, ...], list[tuple[Move, dict[str, object]]]] = {}
    for move in legal:
        params: dict[str, object] = {"v_id": move.workload_id, "v_expected": move.from_status,
                                     "v_status": move.to_status, "v_reason": move.reason,
                                     "v_message": move.message[:1024]}
        params.update((f"v_{name}", value) for name, value in move.columns)
        shapes.setdefault(tuple(name for name, _ in move.columns), []).append((move, params))
    lost: list[Move] = []
    for columns, rows in shapes.items():
        statement = _update_for(columns)
        if locked:
            changed = conn.execute(statement, [params for _, params in rows]).rowcount
            if changed != len(rows):
                raise LostMoves(f"{len(rows) - changed} of {len(rows)} locked rows had changed since read")
            continue
        # one statement a row: only a row's own count tells whether its move held
        lost += [move for move, params in rows if conn.execute(statement, params).rowcount != 1]
    if lost:
        first = lost[0]
        log.warning("%d of %d workload moves were dropped: their rows had changed since they were read "
                    "(e.g. %s was no longer %s when it was to become %s)", len(lost), len(legal),
                    first.workload_id, first.from_status, first.to_status)
    gone = {id(m) for m in lost}
    held = [m for m in legal if id(m) not in gone]
    if held:
        conn.execute(_INSERT_EVENT, [
            {"workload_id": m.workload_id, "pod_id": m.pod_id, "from_status": m.from_status,
             "to_status": m.to_status, "reason": m.reason, "message": m.message[:1024], "at_s": m.at_s}
            for m in held
        ])
    return lost
