"""`gpupool token create`: issue a bearer token for a tenant (or another admin token)."""

from __future__ import annotations

from typing import Annotated

import typer

from gpupool.cli._common import client, reports_errors

app = typer.Typer(help="Tokens (admin): create.", no_args_is_help=True)


@app.command()
@reports_errors
def create(
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="The tenant it acts for.")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="Make an admin token instead.")] = False,
    name: Annotated[str, typer.Option("--name", "-n", help="A label to recognise it by.")] = "",
) -> None:
    """Create a token and print it once (only its hash is stored)."""
    if (tenant is None) == (not admin):
        raise typer.BadParameter("Give --tenant NAME for a tenant token, or --admin for an admin token.")
    with client() as pool:
        token = pool.create_token(tenant, name)
    print(token.token)


@app.callback()
def _group() -> None:
    """Bearer tokens (admin): create."""
