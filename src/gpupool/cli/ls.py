"""`gpupool ls`: list workloads (newest first) in a table."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from gpupool.cli._common import SIMULATED_MARK, ago, client, console, reports_errors

STATUSES = ("pending", "admitted", "running", "succeeded", "failed", "cancelled")


@reports_errors
def ls(
    status: Annotated[list[str] | None, typer.Option("--status", "-s", help="Only these statuses.")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="Admin: only this tenant.")] = None,
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="Only this queue.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-l", min=1, max=1000, help="At most this many.")] = 50,
) -> None:
    """List workloads, newest first. Exit codes: 0 ok, 2 bad usage, 3 forbidden, 4 unreachable."""
    from rich.table import Table

    for s in status or []:
        if s not in STATUSES:
            raise typer.BadParameter(f"{s!r} is not a status; use one of {', '.join(STATUSES)}.")
    with client() as pool:
        page = pool.workloads(status=status or (), tenant=tenant, queue=queue, limit=limit)
    now = time.time()
    table = Table(title=f"{len(page.items)} of {page.total} workload(s)")
    for column in ("ID", "NAME", "TENANT/QUEUE", "STATUS", "GPUS", "NODE", "SUBMITTED", "REASON"):
        table.add_column(column)
    for w in page.items:
        gpus = float(w.spec.resources.gpus) * w.spec.replicas
        nodes = ",".join(sorted({p.node for p in w.pods})) or "-"
        if w.simulated:
            nodes += f" {SIMULATED_MARK}"
        table.add_row(
            w.id,
            w.name or "-",
            f"{w.tenant}/{w.queue}",
            w.status,
            f"{gpus:g}",
            nodes,
            ago(w.submit_s, now),
            w.reason if w.status in ("pending", "failed") else "",
        )
    console().print(table)
