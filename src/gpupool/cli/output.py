"""`-o table|wide|json|name` for the listing verbs: one renderer, so every `ls` reads and scripts alike.

`name` prints ids only, one per line; `json` the API's objects as a JSON list; `table` and `wide`
(more columns) a rich table whose key column (the id) is never wrapped or cut, and which takes
whatever width it needs when stdout is not a terminal (`gpupool ls | cat` keeps whole ids).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Generic, TypeVar

import typer

T = TypeVar("T")


class Format(StrEnum):
    TABLE = "table"
    WIDE = "wide"
    JSON = "json"
    NAME = "name"


OutputOption = Annotated[
    Format,
    typer.Option("--output", "-o", case_sensitive=False,
                 help="table, wide (more columns), json (the API's objects) or name (ids, one a line)."),
]

PIPE_WIDTH = 100_000
"""Console width when stdout is not a terminal: rows are never wrapped, whatever their length."""


@dataclass(frozen=True)
class Column(Generic[T]):
    header: str
    value: Callable[[T], str]
    wide: bool = False
    """Only in `-o wide`."""
    key: bool = False
    """An id or name people copy: never wrapped nor cut."""


def names(values: Iterable[str]) -> None:
    """`-o name`: one per line, nothing else (so `xargs` and `while read` get exactly the ids)."""
    text = "\n".join(values)
    sys.stdout.write(text + "\n" if text else "")


def as_json(items: Sequence[Any]) -> None:
    """`-o json`: the API's objects (pydantic models or plain dicts) as one JSON list."""
    objects = [i.model_dump(mode="json") if hasattr(i, "model_dump") else i for i in items]
    sys.stdout.write(json.dumps(objects, indent=2) + "\n")


def table(title: str, columns: Sequence[Column[T]], items: Iterable[T], wide: bool) -> Any:
    """A rich Table of `items` (the wide-only columns when `wide`)."""
    from rich.table import Table

    shown = [c for c in columns if wide or not c.wide]
    rows = [[c.value(item) for c in shown] for item in items]
    result = Table(title=title)
    for i, c in enumerate(shown):
        # a key column is as wide as its longest value, so a narrow terminal squeezes the others
        widest = max([len(c.header), *(len(row[i]) for row in rows)]) if c.key else len(c.header)
        result.add_column(c.header, no_wrap=c.key, overflow="fold", min_width=widest)
    for row in rows:
        result.add_row(*row)
    return result


def console() -> Any:
    """A rich Console: the terminal's width on a terminal, unbounded when piped."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)


def render(fmt: Format, items: Sequence[T], columns: Sequence[Column[T]], *, key: Callable[[T], str],
           title: str) -> None:
    """Print `items` as `fmt` asks: ids (`key`), JSON, or a table with a title."""
    if fmt is Format.NAME:
        names(key(i) for i in items)
    elif fmt is Format.JSON:
        as_json(items)
    else:
        console().print(table(title, columns, items, wide=fmt is Format.WIDE))
