"""Slurm's `--dependency` expression (`afterok:ID[:ID...]`, `afterany:`, `afternotok:`, `singleton`,
comma-joined: every part must be met) parsed, and judged against the statuses of the work it names.

Pure: the API's spec validator, the server's submit path and its dependency pass all call it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

MAX_EXPRESSION = 1024
MAX_TARGETS = 64
ACCEPTED = ("afterok:ID[:ID...], afterany:ID[:ID...], afternotok:ID[:ID...] or singleton, "
            "comma-joined when all must hold (e.g. afterok:w-1a2b3c4d5e6f,singleton)")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_FINAL = frozenset({"succeeded", "failed", "cancelled"})


class DependencyKind(StrEnum):
    AFTEROK = "afterok"
    """every named workload succeeded"""
    AFTERANY = "afterany"
    """every named workload ended, however"""
    AFTERNOTOK = "afternotok"
    """every named workload ended without succeeding (failed or cancelled)"""
    SINGLETON = "singleton"
    """no earlier workload of the same tenant and name is unfinished"""


@dataclass(frozen=True, slots=True)
class Dependency:
    """One part of the expression: its kind and the ids it names (none for singleton)."""

    kind: DependencyKind
    ids: tuple[str, ...] = ()

    def __str__(self) -> str:
        return ":".join((self.kind.value, *self.ids))


def parse_dependency(text: str) -> tuple[Dependency, ...]:
    """The parts `text` names, in order; ValueError with the accepted forms when it is malformed."""
    text = text.strip()
    if not text or len(text) > MAX_EXPRESSION:
        raise ValueError(f"must be {ACCEPTED}")
    parts: list[Dependency] = []
    for part in text.split(","):
        kind_text, _, rest = part.strip().partition(":")
        try:
            kind = DependencyKind(kind_text.lower())
        except ValueError:
            raise ValueError(f"has {part.strip()!r}, which is not a dependency; write {ACCEPTED}") from None
        if kind is DependencyKind.SINGLETON:
            if rest:
                raise ValueError(f"has {part.strip()!r}: singleton takes no ids; write {ACCEPTED}")
            parts.append(Dependency(kind))
            continue
        ids = tuple(rest.split(":")) if rest else ()
        if not ids or not all(_ID.match(i) for i in ids):
            raise ValueError(f"has {part.strip()!r}: {kind.value} needs workload ids after it (from "
                             f"`gpupool submit` or `gpupool ls`); write {ACCEPTED}")
        parts.append(Dependency(kind, ids))
    if sum(len(p.ids) for p in parts) > MAX_TARGETS:
        raise ValueError(f"names more than {MAX_TARGETS} workloads; depend on an array's id instead of its "
                         "tasks, or chain fewer")
    return tuple(parts)


def named_ids(parts: Sequence[Dependency]) -> tuple[str, ...]:
    """Every id the parts name, once each, in order."""
    return tuple(dict.fromkeys(i for p in parts for i in p.ids))


class Verdict(StrEnum):
    MET = "met"
    WAITING = "waiting"
    NEVER = "never"
    """it can never be met (afterok on work that failed, afternotok on work that succeeded)"""


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    why: str = ""
    """WAITING: the first part that does not hold ("afterok:w-1", "singleton (...)"); NEVER: the part
    and why it never will ("afterok:w-1 (w-1 did not succeed)")"""


def judge(parts: Sequence[Dependency], statuses: Mapping[str, Sequence[str]],
          singleton_blocked: bool) -> Judgement:
    """Whether the parts hold, given the statuses of the work each id names (an array's id names all
    its tasks; an id with no statuses was removed and counts as ended) and whether an earlier
    workload of the same tenant and name is unfinished."""
    waiting = ""
    for part in parts:
        if part.kind is DependencyKind.SINGLETON:
            if singleton_blocked and not waiting:
                waiting = "singleton (an earlier workload of the same name has not ended)"
            continue
        for target in part.ids:
            seen = statuses.get(target, ())
            unfinished = [s for s in seen if s not in _FINAL]
            if part.kind is DependencyKind.AFTEROK and any(s in ("failed", "cancelled") for s in seen):
                return Judgement(Verdict.NEVER, f"{part} ({target} did not succeed)")
            if part.kind is DependencyKind.AFTERNOTOK and any(s == "succeeded" for s in seen):
                return Judgement(Verdict.NEVER, f"{part} ({target} succeeded)")
            if unfinished and not waiting:
                waiting = f"{part.kind.value}:{target}"
    return Judgement(Verdict.WAITING, waiting) if waiting else Judgement(Verdict.MET)
