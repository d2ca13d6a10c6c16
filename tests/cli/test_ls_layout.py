"""The pieces that keep `gpupool ls` to one line per workload: the nodes' shared prefix, the age, and
how a compact table cuts its squeezable columns to a terminal's width (ids never)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from gpupool.cli.ls import age, common_prefix
from gpupool.cli.output import Column, table


@pytest.mark.parametrize(("names", "prefix"), [
    (["h100-sxm-80gb-000", "h100-sxm-80gb-001"], "h100-sxm-80gb-"),
    (["h100-sxm-80gb-000"], "h100-sxm-80gb-"),
    (["gpu-a-1", "gpu-b-2"], "gpu-"),
    (["n0", "n1"], ""),                    # no '-': nothing to cut
    (["rack-1", "rack-10"], "rack-"),
    (["gpu-", "gpu-1"], ""),               # a name would be left empty
    ([], ""),
])
def test_common_prefix_ends_at_a_dash(names: list[str], prefix: str) -> None:
    assert common_prefix(names) == prefix


@pytest.mark.parametrize(("ago_s", "shown"), [(0, "0s"), (119, "119s"), (120, "2m"), (7199, "119m"),
                                              (7200, "2h"), (3 * 86400, "3d")])
def test_age_is_one_short_word(ago_s: float, shown: str) -> None:
    assert age(1000.0 - ago_s, 1000.0) == shown
    assert age(None, 1000.0) == "-"


COLUMNS = [Column("ID", lambda r: r[0], key=True), Column("NAME", lambda r: r[1], squeeze=True),
           Column("STATUS", lambda r: r[2]), Column("REASON", lambda r: r[3], squeeze=True)]
ROWS = [("w-1a2b3c4d5e6f", "x" * 60, "pending", "insufficient_devices_for_the_gang"),
        ("w-000000000001", "short", "running", "")]


def printed(width: int | None) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width or 100_000, color_system=None).print(
        table("t", COLUMNS, ROWS, wide=False, width=width))
    return [line.rstrip() for line in out.getvalue().splitlines()]


def test_a_compact_table_fits_the_terminal_by_cutting_squeezable_columns() -> None:
    lines = printed(80)
    assert all(len(line) <= 80 for line in lines), lines
    row = next(line for line in lines if line.startswith("w-1a2b3c4d5e6f "))  # the id whole, one line
    assert "…" in row and "pending" in row and row.count("insufficient") == 1
    assert len([line for line in lines if line.startswith("w-")]) == 2


def test_a_compact_table_without_a_width_cuts_nothing() -> None:
    lines = printed(None)
    assert any("x" * 60 in line for line in lines) and not any("…" in line for line in lines)
    assert not any("│" in line or "┃" in line for line in lines)  # no borders


def test_the_footer_says_once_what_the_node_column_leaves_out() -> None:
    from gpupool.cli.ls import _footer

    assert _footer("h100-sxm-80gb-", {"h100-sxm-80gb-000"}, mixed=False) == [
        "NODE: names after h100-sxm-80gb-", "(sim) every node shown is simulated"]
    assert _footer("", {"sim-0"}, mixed=True) == ["(sim) the nodes marked * are simulated"]
    assert _footer("", set(), mixed=False) == []


def test_a_cell_is_printed_as_it_is_not_as_markup() -> None:
    """A label like `team=[bold]` is a value to show, not a style: printed and measured as written."""
    rows = [("w-1a2b3c4d5e6f", "[bold]x[/bold]", "pending", "[red]no[/red]")]
    out = io.StringIO()
    Console(file=out, width=100_000, color_system=None).print(table("t", COLUMNS, rows, wide=False))
    (row,) = [line.rstrip() for line in out.getvalue().splitlines() if line.startswith("w-")]
    assert row == "w-1a2b3c4d5e6f  [bold]x[/bold]  pending  [red]no[/red]"
