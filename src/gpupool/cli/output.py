"""`-o table|wide|json|name` for the listing verbs: one renderer, so every `ls` reads and scripts alike.

`name` prints ids only, one per line; `json` the API's objects as a JSON list; `table` and `wide`
(more columns) plain kubectl/Slurm-style columns: a header row, cells padded, two spaces between,
no box. On a terminal `table` fits its width by cutting the long descriptive cells with an ellipsis
(a key column, an id or name, is never cut); `wide`, and any table when stdout is not a terminal,
takes whatever width it needs (`gpupool ls | cat` keeps whole cells).
"""

from __future__ import annotations

import json
import re
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
    squeeze: bool = False
    """On a terminal too narrow for the row, cut to fit with an ellipsis (piped: never cut)."""


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """`text` with every control character written as its escape (ESC as \\x1b): what the server
    answers may quote what a tenant sent, which must not reach the reader's terminal as an escape
    sequence (a clipboard write, a link, a cleared screen)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def names(values: Iterable[str]) -> None:
    """`-o name`: one per line, nothing else (so `xargs` and `while read` get exactly the ids)."""
    text = "\n".join(values)
    sys.stdout.write(text + "\n" if text else "")


def as_json(items: Sequence[Any]) -> None:
    """`-o json`: the API's objects (pydantic models or plain dicts) as one JSON list."""
    objects = [i.model_dump(mode="json") if hasattr(i, "model_dump") else i for i in items]
    sys.stdout.write(json.dumps(objects, indent=2) + "\n")


def table(title: str, columns: Sequence[Column[T]], items: Iterable[T], wide: bool, *,
          width: int | None = None) -> Any:
    """A plain rich Table of `items` (the wide-only columns when `wide`): no borders, a bold header
    row, two spaces between columns, every cell on one line. With `width` (a terminal's), the
    `squeeze` columns are cut with an ellipsis, widest first, until a row fits; without, nothing is
    cut."""
    from rich.table import Table
    from rich.text import Text

    shown = [c for c in columns if wide or not c.wide]
    rows = [[c.value(item) for c in shown] for item in items]
    natural = [max([len(c.header), *(len(row[i]) for row in rows)]) for i, c in enumerate(shown)]
    limits = _squeezed(shown, natural, width) if width is not None else {}
    result = Table(title=title, box=None, padding=(0, 1), pad_edge=False, header_style="bold")
    for i, c in enumerate(shown):
        if i in limits:
            result.add_column(c.header, no_wrap=True, overflow="ellipsis", min_width=limits[i],
                              max_width=limits[i])
            continue
        result.add_column(c.header, no_wrap=True, overflow="fold", min_width=natural[i])
    for row in rows:  # as text, not markup: a cell's "[x]" is printed, and counted, as it is
        result.add_row(*(Text(cell) for cell in row))
    return result


SQUEEZED_MIN = 8
"""The fewest characters a squeezed column keeps (its header's, when that is longer)."""


def _squeezed(shown: Sequence[Column[T]], natural: list[int], width: int) -> dict[int, int]:
    """Column index -> the width each `squeeze` column is cut to so that a row fits `width`
    (two characters between columns); the widest is cut first, none below SQUEEZED_MIN."""
    widths = list(natural)
    excess = sum(widths) + 2 * (len(widths) - 1) - width
    cut: dict[int, int] = {}
    while excess > 0:
        floors = {i: max(SQUEEZED_MIN, len(c.header)) for i, c in enumerate(shown) if c.squeeze}
        room = [i for i in floors if widths[i] > floors[i]]
        if not room:
            break
        widest = max(room, key=lambda i: widths[i])
        others = max([floors[widest], *(widths[i] for i in room if i != widest)])
        step = min(excess, widths[widest] - others) or 1
        widths[widest] -= step
        cut[widest] = widths[widest]
        excess -= step
    return cut


def console() -> Any:
    """A rich Console: the terminal's width on a terminal, unbounded when piped."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)


def whole_console() -> Any:
    """A rich Console that never cuts nor folds a row, on a terminal too (`-o wide`)."""
    from rich.console import Console

    return Console(width=PIPE_WIDTH, force_terminal=sys.stdout.isatty() or None)


def terminal_width() -> int | None:
    """The terminal's width, or None when stdout is not a terminal (a table then takes what it needs)."""
    return console().width if sys.stdout.isatty() else None


def render(fmt: Format, items: Sequence[T], columns: Sequence[Column[T]], *, key: Callable[[T], str],
           title: str, footer: Sequence[str] = ()) -> None:
    """Print `items` as `fmt` asks: ids (`key`), JSON, or a plain table with a title (and `footer`
    lines under it: what the table abbreviates, said once). Every listing verb prints through here.

    `table` on a terminal fits its width (the `squeeze` columns cut); `wide` keeps every cell whole
    (the terminal wraps a long row), as does any table when piped."""
    if fmt is Format.NAME:
        names(key(i) for i in items)
    elif fmt is Format.JSON:
        as_json(items)
    else:
        wide = fmt is Format.WIDE
        out = whole_console() if wide else console()
        out.print(table(title, columns, items, wide=wide, width=None if wide else terminal_width()))
        for line in footer:
            out.print(line, markup=False, highlight=False, soft_wrap=True)
