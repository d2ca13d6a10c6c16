"""`gpupool tenant create|ls`: manage tenants (admin)."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from gpupool.cli._common import client, console, reports_errors

app = typer.Typer(help="Tenants (admin): create, ls.", no_args_is_help=True)


@app.command()
@reports_errors
def create(name: Annotated[str, typer.Argument(help="Lower-case letters, digits and '-'.")]) -> None:
    """Create a tenant (with its `default` queue)."""
    with client() as pool:
        tenant = pool.create_tenant(name)
    print(tenant.name)


@app.command("ls")
@reports_errors
def list_tenants() -> None:
    """List tenants and their queues."""
    from rich.table import Table

    with client() as pool:
        tenants = pool.tenants()
    table = Table(title=f"{len(tenants)} tenant(s)")
    for column in ("TENANT", "QUEUES", "CREATED"):
        table.add_column(column)
    for t in tenants:
        table.add_row(
            t.name, ", ".join(t.queues), time.strftime("%Y-%m-%d %H:%M", time.localtime(t.created_s))
        )
    console().print(table)
