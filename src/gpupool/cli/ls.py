"""`gpupool ls`: list workloads, newest first, as a table, JSON or bare ids (-o)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpupool.cli._common import SIMULATED_MARK, ago, client, reports_errors
from gpupool.cli.output import Column, Format, OutputOption

TABLE_LIMIT = 50
"""Rows a table shows unless --limit says otherwise (-o name and -o json list everything)."""
JSON_PAGE = 1000


@reports_errors
def ls(
    status: Annotated[list[str] | None, typer.Option(
        "--status", "-s", help="Only these statuses, any case, several or a comma list: -s succeeded,failed.")
    ] = None,
    tenant: Annotated[list[str] | None, typer.Option(
        "--tenant", "-t", help="Admin: only these tenants (a comma list); an unknown one is an error.")
    ] = None,
    queue: Annotated[list[str] | None, typer.Option(
        "--queue", "-q", help="Only these queues (a comma list); an unknown one is an error.")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="Only work submitted since: 1h, 7d, or a date (2026-12-01, 2026-12-01T08:00).")
    ] = None,
    limit: Annotated[int | None, typer.Option(
        "--limit", "-l", min=1, help=f"At most this many (default {TABLE_LIMIT} in a table, all otherwise).")
    ] = None,
    output: OutputOption = Format.TABLE,
) -> None:
    """List workloads, newest first.

    Example: gpupool ls -s failed,cancelled --since 1d -o name | xargs gpupool show

    Exit codes: 0 ok, 2 bad usage, 3 an unknown tenant or queue (or forbidden), 4 unreachable.
    """
    since_s = None
    if since is not None:
        from gpupool.cli._durations import since_s as parse_since

        since_s = parse_since(since)
    filters: dict[str, Any] = {"status": status or (), "tenant": tenant, "queue": queue, "since_s": since_s}
    with client() as pool:
        if output is Format.NAME:
            from gpupool.cli.output import names

            names(pool.workload_ids(**filters, limit=limit))
            return
        if output is Format.JSON:
            from gpupool.cli.output import as_json

            as_json(_all(pool, filters, limit))
            return
        page = pool.workloads(**filters, limit=min(limit or TABLE_LIMIT, JSON_PAGE))
    _table(page.items, page.total, output)


def _all(pool: Any, filters: dict[str, Any], limit: int | None) -> list[Any]:
    """Every matching workload (up to `limit`), read a page of 1000 at a time."""
    items: list[Any] = []
    while limit is None or len(items) < limit:
        size = JSON_PAGE if limit is None else min(JSON_PAGE, limit - len(items))
        page = pool.workloads(**filters, limit=size, offset=len(items))
        items += page.items
        if len(page.items) < size or len(items) >= page.total:
            break
    return items


def _table(items: list[Any], total: int, output: Format) -> None:
    import time

    from gpupool.cli.output import render

    now = time.time()

    def nodes(w: Any) -> str:
        shown = ",".join(sorted({p.node for p in w.pods})) or "-"
        return shown + (f" {SIMULATED_MARK}" if w.simulated else "")

    def when(epoch_s: float | None) -> str:
        from gpupool.cli._durations import when as local

        return local(epoch_s)

    columns: list[Column[Any]] = [
        Column("ID", lambda w: w.id, key=True),
        Column("NAME", lambda w: w.name or "-", key=True),
        Column("TENANT/QUEUE", lambda w: f"{w.tenant}/{w.queue}"),
        Column("STATUS", lambda w: w.status),
        Column("GPUS", lambda w: f"{float(w.spec.resources.gpus) * w.spec.replicas:g}"),
        Column("NODE", nodes),
        Column("SUBMITTED", lambda w: ago(w.submit_s, now)),
        Column("PRIORITY", lambda w: str(w.priority), wide=True),
        Column("ATTEMPT", lambda w: str(w.attempt), wide=True),
        Column("REPLICAS", lambda w: str(w.spec.replicas), wide=True),
        Column("STARTED", lambda w: when(w.started_s), wide=True),
        Column("FINISHED", lambda w: when(w.finished_s), wide=True),
        Column("EXIT", lambda w: "-" if w.exit_code is None else str(w.exit_code), wide=True),
        Column("REASON", lambda w: w.reason if w.status in ("pending", "failed") else ""),
    ]
    render(output, items, columns, key=lambda w: w.id, title=f"{len(items)} of {total} workload(s)")
