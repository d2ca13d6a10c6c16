"""`gpupool audit`: who did what to the pool, and every refused login (admin)."""

from __future__ import annotations

from typing import Annotated

import typer

from gpupool.cli._common import client, console, reports_errors


@reports_errors
def audit(
    since: Annotated[
        str | None, typer.Option("--since", help="1h, 7d, or a date/time such as 2026-12-01T08:00.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000, help="At most this many rows.")] = 100,
) -> None:
    """Show the audit log, newest first: admin actions and refused authentications (admin).

    Example: gpupool audit --since 1h
    """
    from rich.table import Table

    from gpupool.cli._durations import since_s, when

    start = None if since is None else since_s(since)
    with client() as pool:
        rows = pool.audit(start, limit)
    table = Table(title=f"{len(rows)} audit record(s)")
    for column in ("TIME", "ACTOR", "ACTION", "TARGET", "DETAIL", "FROM", "COUNT"):
        table.add_column(column, no_wrap=column in ("TIME", "ACTION"), overflow="fold")
    for r in rows:
        actor = f"{r.actor or '-'} {r.token_id}".strip()
        table.add_row(when(r.at_s), actor, r.action, r.target or "-", r.detail or "-", r.remote or "-",
                      str(r.count))
    console().print(table)
