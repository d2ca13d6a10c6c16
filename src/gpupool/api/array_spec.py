"""Slurm's `--array` expression (`0-999%50`, `1,3,5-9`, `0-15:4`) parsed into task indexes and a limit.

Pure: the API's spec validator and the server's submit path both call `parse_array`.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_ARRAY_INDEX = 99_999
"""Highest task index (Slurm's MaxArraySize - 1 with MaxArraySize=100000)."""
MAX_ARRAY_TASKS = 10_000
"""Most tasks one submission creates: they are stored in one transaction, which holds the store's
write lock while it runs; 10,000 is also a tenant's default max_pending. Split a larger sweep into
several arrays (0-9999, 10000-19999, ...)."""
MAX_EXPRESSION = 4096
EXAMPLE = "e.g. 0-999, 1,3,5-9, 0-15:4 or 0-999%50"


@dataclass(frozen=True, slots=True)
class ArrayRange:
    """The task indexes of an array (sorted, distinct) and how many may hold slices at once."""

    indexes: tuple[int, ...]
    limit: int | None = None

    def describe(self) -> str:
        """'0-3,7%2': the indexes as compact ranges, with the limit."""
        return compact(self.indexes) + (f"%{self.limit}" if self.limit is not None else "")


def parse_array(text: str) -> ArrayRange:
    """The indexes and limit `text` names; ValueError when it is malformed, its text a predicate of
    the expression ("has the range '5-1', which ends before it starts; ...") for the API's sentence
    `Field 'array' <predicate>.`"""
    text = text.strip()
    if not text or len(text) > MAX_EXPRESSION:
        raise ValueError(f"must list task indexes, {EXAMPLE}")
    body, percent, limit_text = text.partition("%")
    limit = None
    if percent:
        if not _digits(limit_text) or int(limit_text) < 1:
            raise ValueError(f"must end in a limit '%N' of at least 1, not '%{limit_text}' (e.g. 0-999%50)")
        limit = int(limit_text)
    indexes: set[int] = set()
    for part in body.split(","):
        indexes.update(_part(part.strip()))
        if len(indexes) > MAX_ARRAY_TASKS:
            raise ValueError(_too_many(len(indexes)))
    if limit is not None:
        limit = min(limit, len(indexes))
    return ArrayRange(tuple(sorted(indexes)), limit)


def _part(part: str) -> range:
    first, dash, rest = part.partition("-")
    last, colon, step_text = rest.partition(":")
    numbers = [first] + ([last] if dash else []) + ([step_text] if colon else [])
    if not all(_digits(n) for n in numbers) or (colon and not dash):
        raise ValueError(f"has {part!r}, which is not an index or a range of indexes ({EXAMPLE})")
    start = int(first)
    stop = int(last) if dash else start
    step = int(step_text) if colon else 1
    if stop < start:
        raise ValueError(f"has the range {part!r}, which ends before it starts; write it low-high")
    if step < 1:
        raise ValueError(f"has the step 0 in {part!r}; a step is at least 1")
    if stop > MAX_ARRAY_INDEX:
        raise ValueError(f"has {part!r}, beyond the highest task index, {MAX_ARRAY_INDEX}")
    if (stop - start) // step + 1 > MAX_ARRAY_TASKS:
        raise ValueError(_too_many((stop - start) // step + 1))
    return range(start, stop + 1, step)


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 9


def _too_many(count: int) -> str:
    return (f"names {count} tasks, but one array holds at most {MAX_ARRAY_TASKS}; split the sweep into "
            "several arrays (e.g. 0-9999 and 10000-19999)")


def compact(indexes: tuple[int, ...] | list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8' (sorted input)."""
    parts: list[str] = []
    i = 0
    while i < len(indexes):
        j = i
        while j + 1 < len(indexes) and indexes[j + 1] == indexes[j] + 1:
            j += 1
        parts.append(str(indexes[i]) if i == j else f"{indexes[i]}-{indexes[j]}")
        i = j + 1
    return ",".join(parts)
