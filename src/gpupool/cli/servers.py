"""`gpupool server ls`: the servers sharing the pool's store, and which one leads (admin)."""

from __future__ import annotations

import time

import typer

from gpupool.cli._common import client, console, reports_errors
from gpupool.cli.output import Format, OutputOption

app = typer.Typer(help="The servers sharing the pool's store (admin): ls.\n\nExample: gpupool server ls",
                  add_completion=False)


@app.callback()
def _group() -> None:
    """The servers sharing the pool's store (admin): ls."""


@app.command("ls")
@reports_errors
def ls(output: OutputOption = Format.TABLE) -> None:
    """List the servers on the pool's store, the leader first: id, address, leader, epoch, lease age,
    version, last seen (admin). A pool started without --ha lists its one server.

    -o json prints the API's answer; -o name the servers' ids, one a line.

    Example: GPUPOOL_URL=http://10.0.0.1:8765,http://10.0.0.2:8765 gpupool server ls
    """
    from rich.table import Table

    with client() as pool:
        answer = pool.servers()
    if output is Format.JSON:
        import sys

        sys.stdout.write(answer.model_dump_json(indent=2) + "\n")
        return
    if output is Format.NAME:
        from gpupool.cli.output import names

        names(s.id for s in answer.servers)
        return
    now = time.time()
    title = (f"{len(answer.servers)} server(s), epoch {answer.epoch}" if answer.ha
             else "1 server (no --ha)")
    table = Table(title=title)
    for column in ("ID", "ADDRESS", "LEADER", "EPOCH", "LEASE AGE", "VERSION", "LAST SEEN"):
        table.add_column(column, no_wrap=True)
    for s in answer.servers:
        table.add_row(s.id + (" *" if s.this else ""), s.address, "leader" if s.leader else "follower",
                      "-" if s.epoch is None else str(s.epoch),
                      "-" if s.lease_age_s is None else f"{s.lease_age_s:.1f}s", s.version,
                      f"{max(0.0, now - s.last_seen_s):.1f}s ago")
    console().print(table)
