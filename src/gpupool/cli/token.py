"""`gpupool token create|ls|revoke`: bearer tokens with a scope and a lifetime."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from gpupool.cli._common import client, reports_errors
from gpupool.cli.output import Column, Format, OutputOption

app = typer.Typer(help="Bearer tokens: create (admin), ls, revoke.\n\n"
                  "Example: gpupool token create --tenant team-a --expires 30d", no_args_is_help=True)


@app.command()
@reports_errors
def create(
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="The tenant it acts for.")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="Make an admin token instead.")] = False,
    name: Annotated[str, typer.Option("--name", "-n", help="Unique per tenant (default: its id).")] = "",
    expires: Annotated[
        str, typer.Option("--expires", help="30d, 12h, 90m or never (default: the server's, 90 days).")
    ] = "",
    scope: Annotated[
        str, typer.Option("--scope", help=(
            "full (default), metrics (may read /metrics only; with --admin only, as /metrics names "
            "every tenant) or federation (a federation hub's token, --admin only; see docs/federation.md)."))
    ] = "full",
) -> None:
    """Create a token and print it once (only its hash is stored).

    Example: gpupool token create --tenant team-a --name ci --expires 30d
    """
    from gpupool.cli._durations import duration_s

    if (tenant is None) == (not admin):
        raise typer.BadParameter("Give --tenant NAME for a tenant token, or --admin for an admin token.")
    if scope not in ("full", "metrics", "federation"):
        raise typer.BadParameter(f"--scope is full, metrics or federation, not {scope!r}.")
    never = expires.strip().lower() == "never"
    lifetime = duration_s(expires, "--expires") if expires and not never else None
    longest = max_lifetime_s()
    if lifetime is not None and lifetime > longest:
        raise typer.BadParameter(f"--expires takes at most {longest / (365 * 86400):g} years "
                                 f"({longest / 86400:g}d), got {expires!r}; give a shorter lifetime, or "
                                 "never.")
    with client() as pool:
        token = pool.create_token(tenant, name, scope=scope, expires_in_s=lifetime, never_expires=never)
    print(token.token)


def max_lifetime_s() -> float:
    """The longest lifetime the API takes for a token (TokenCreate.expires_in_s's bound)."""
    from annotated_types import Le

    from gpupool.api.tenants import TokenCreate

    bound = next(m.le for m in TokenCreate.model_fields["expires_in_s"].metadata if isinstance(m, Le))
    assert isinstance(bound, int | float)
    return float(bound)


@app.command("ls")
@reports_errors
def list_tokens(
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="Only this tenant's.")] = None,
    output: OutputOption = Format.TABLE,
) -> None:
    """List tokens (never their secrets): all for the admin, a tenant's own for a tenant token.

    Example: gpupool token ls -t team-a -o name
    """
    from gpupool.cli._common import ago
    from gpupool.cli._durations import day
    from gpupool.cli.output import render
    from gpupool.cli.queue import known_tenant

    tenant = tenant.strip().lower() if tenant else None
    with client() as pool:
        tokens = pool.tokens(tenant)
        if not tokens and tenant:
            known_tenant(pool, tenant)
    now = time.time()

    def state(t: Any) -> str:
        return ("revoked" if t.revoked_s is not None
                else "expired" if t.expires_s is not None and t.expires_s <= now else "active")

    columns: list[Column[Any]] = [
        Column("ID", lambda t: t.id, key=True),
        Column("NAME", lambda t: t.name, key=True),
        Column("TENANT", lambda t: t.tenant or "(admin)", squeeze=True),
        Column("SCOPE", lambda t: t.scope),
        Column("STATE", state),
        Column("CREATED", lambda t: day(t.created_s)),
        Column("EXPIRES", lambda t: day(t.expires_s, "never")),
        Column("LAST USED", lambda t: ago(t.last_used_s, now)),
    ]
    render(output, tokens, columns, key=lambda t: t.id, title=f"{len(tokens)} token(s)")


@app.command()
@reports_errors
def revoke(
    token: Annotated[str, typer.Argument(help="Its id (tok-...), or its name with --tenant or --admin.")],
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="TOKEN names this tenant's.")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="TOKEN names an admin token.")] = False,
) -> None:
    """Revoke a token: every server refuses it within a second (a tenant may revoke its own).

    Example: gpupool token revoke ci --tenant team-a
    """
    if tenant is not None and admin:
        raise typer.BadParameter("Give --tenant or --admin, not both.")
    with client() as pool:
        if tenant is not None or admin:
            info = pool.revoke_token_named(token, tenant)
        elif token.startswith("tok-"):
            info = pool.revoke_token(token)
        else:
            raise typer.BadParameter(f"{token!r} is not a token id (tok-...); to revoke by name, add "
                                     "--tenant NAME (or --admin).")
    print(f"revoked {info.id} ({info.name})")


@app.callback()
def _group() -> None:
    """Bearer tokens: create (admin), ls, revoke."""
