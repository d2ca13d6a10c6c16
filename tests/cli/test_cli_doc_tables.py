"""docs/cli.md's tables stay tables, and its list of commands names every command there is."""

from __future__ import annotations

import re
from pathlib import Path

from gpupool.cli.main import COMMANDS, SUBCOMMANDS

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def tables(text: str) -> list[list[str]]:
    """Each table's lines, its header first."""
    found: list[list[str]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and re.fullmatch(r"\|(-+\|)+", lines[i + 1].replace(" ", "")):
            rows = [line]
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(row)
            found.append(rows)
    return found


def cells(row: str) -> int:
    return len(re.split(r"(?<!\\)\|", row.strip())) - 2  # `\|` is a pipe inside a cell


def test_every_row_has_as_many_cells_as_its_header() -> None:
    for table in tables(DOC.read_text()):
        for row in table[1:]:
            assert cells(row) == cells(table[0]), (table[0], row)


def test_the_commands_table_names_every_command() -> None:
    text = DOC.read_text()
    section = text[text.index("\n## Commands\n"):]
    section = section[:section.index("\n## ", 1)]
    for name in (*COMMANDS, *SUBCOMMANDS):
        if name == "up":  # `gpupool up` has a section of its own, above the table
            continue
        assert re.search(rf"`(gpupool )?{name}[ `]", section), name  # `hold ID...` / `release ID...`


def test_no_command_that_exists_is_called_missing() -> None:
    text = " ".join(DOC.read_text().split())
    for said in re.finditer(r"`gpupool (\w+)`[^.]{0,80}?(is planned|is not there yet)", text):
        assert said[1] not in (*COMMANDS, *SUBCOMMANDS), said[0]
