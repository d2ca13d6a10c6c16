"""`gpupool audit`: who did what to the pool, and every refused login (admin)."""

from __future__ import annotations

from typing import Annotated

import typer

from gpupool.cli._common import client, console, flags_for_fields, reports_errors
from gpupool.cli.output import Format, OutputOption, visible


@reports_errors
@flags_for_fields(since_s="--since", limit="--limit")
def audit(
    since: Annotated[
        str | None, typer.Option("--since", help="1h, 7d, or a date/time such as 2026-12-01T08:00.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000, help="At most this many rows.")] = 100,
    output: OutputOption = Format.TABLE,
) -> None:
    """Show the audit log, newest first: admin actions and refused authentications (admin).

    -o json prints the API's records; -o name their actions, one a line; -o wide is the table.

    Example: gpupool audit --since 1h -o json
    """
    from rich.table import Table
    from rich.text import Text

    from gpupool.cli._durations import since_s, when

    start = None if since is None else since_s(since)
    with client() as pool:
        rows = pool.audit(start, limit)
    if output is Format.JSON:
        from gpupool.cli.output import as_json

        as_json(rows)
        return
    if output is Format.NAME:
        from gpupool.cli.output import names

        names(r.action for r in rows)
        return
    table = Table(title=f"{len(rows)} audit record(s)")
    for column in ("TIME", "ACTOR", "ACTION", "TARGET", "DETAIL", "FROM", "COUNT"):
        table.add_column(column, no_wrap=column in ("TIME", "ACTION"), overflow="fold")
    for r in rows:
        actor = f"{r.actor or '-'} {r.token_id}".strip()
        # as Text, never markup: a detail quotes what a refused request sent (a tenant's words)
        table.add_row(*(Text(visible(cell)) for cell in (when(r.at_s), actor, r.action, r.target or "-",
                                                          r.detail or "-", r.remote or "-", str(r.count))))
    console().print(table)
