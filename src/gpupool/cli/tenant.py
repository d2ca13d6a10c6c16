"""`gpupool tenant create|set|ls`: tenants, their limits and Unix accounts (admin)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from gpupool.cli._common import client, reports_errors
from gpupool.cli.output import Column, Format, OutputOption

app = typer.Typer(help="Tenants (admin): create, set, ls.\n\nExample: gpupool tenant create team-a",
                  no_args_is_help=True)

UnixUser = Annotated[
    str | None, typer.Option("--unix-user", help="An existing account on the server its pods run as.")
]
MaxPriority = Annotated[
    int | None, typer.Option("--max-priority", help="Highest priority its tokens may submit at (default 0).")
]
MaxPending = Annotated[
    int | None, typer.Option("--max-pending", min=0, help="Most workloads it may have waiting (10000).")
]


@app.command()
@reports_errors
def create(
    name: Annotated[str, typer.Argument(help="Lower-case letters, digits and '-'.")],
    unix_user: UnixUser = None,
    max_priority: MaxPriority = None,
    max_pending: MaxPending = None,
) -> None:
    """Create a tenant (with its `default` queue).

    Example: gpupool tenant create team-a --max-priority 10
    """
    with client() as pool:
        tenant = pool.create_tenant(name, unix_user=unix_user, max_priority=max_priority,
                                    max_pending=max_pending)
    print(tenant.name)
    if tenant.warning:
        print(f"Warning: {tenant.warning}", file=sys.stderr)


@app.command("set")
@reports_errors
def set_tenant(
    name: Annotated[str, typer.Argument(help="The tenant.")],
    unix_user: UnixUser = None,
    no_unix_user: Annotated[
        bool, typer.Option("--no-unix-user", help="Run its pods as the pool's own account again.")
    ] = False,
    max_priority: MaxPriority = None,
    max_pending: MaxPending = None,
) -> None:
    """Change a tenant's Unix account or limits (only what is given).

    Example: gpupool tenant set team-a --max-pending 500
    """
    if unix_user is not None and no_unix_user:
        raise typer.BadParameter("Give --unix-user USER or --no-unix-user, not both.")
    if unix_user is None and not no_unix_user and max_priority is None and max_pending is None:
        raise typer.BadParameter("Give what to change: --unix-user, --no-unix-user, --max-priority or "
                                 "--max-pending.")
    with client() as pool:
        t = pool.update_tenant(name, unix_user=unix_user, clear_unix_user=no_unix_user,
                               max_priority=max_priority, max_pending=max_pending)
    print(f"{t.name} max-priority {t.max_priority} max-pending {t.max_pending} "
          f"unix-user {t.unix_user or '-'}")


@app.command("ls")
@reports_errors
def list_tenants(output: OutputOption = Format.TABLE) -> None:
    """List tenants with their queues, limits and Unix accounts.

    Example: gpupool tenant ls -o name
    """
    from gpupool.cli._durations import when
    from gpupool.cli.output import render

    with client() as pool:
        tenants = pool.tenants()
    columns: list[Column[Any]] = [
        Column("TENANT", lambda t: t.name, key=True),
        Column("QUEUES", lambda t: ", ".join(t.queues)),
        Column("MAX PRIORITY", lambda t: str(t.max_priority)),
        Column("MAX PENDING", lambda t: str(t.max_pending)),
        Column("UNIX USER", lambda t: t.unix_user or "-"),
        Column("CREATED", lambda t: when(t.created_s)),
    ]
    render(output, tenants, columns, key=lambda t: t.name, title=f"{len(tenants)} tenant(s)")
