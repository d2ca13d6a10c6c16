"""`gpupool tenant create|set|ls|delete`: tenants, their limits, Unix accounts and budgets (admin)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from gpupool.cli._common import client, flags_for_fields, reports_errors
from gpupool.cli.output import Column, Format, OutputOption
from gpupool.core.budgets import BudgetPeriod

app = typer.Typer(help="Tenants (admin): create, set, ls, delete.\n\nExample: gpupool tenant create team-a",
                  no_args_is_help=True)

UnixUser = Annotated[
    str | None, typer.Option("--unix-user", help=(
        "An existing account on the server its pods run as; not root, not another tenant's, not a "
        "gpupool-... account but its own."))
]
MaxPriority = Annotated[
    int | None, typer.Option("--max-priority", help="Highest priority its tokens may submit at (default 0).")
]
MaxPending = Annotated[
    int | None, typer.Option("--max-pending", min=0, help="Most workloads it may have waiting (10000).")
]
TENANT_FLAGS = {"unix_user": "--unix-user", "max_priority": "--max-priority", "max_pending": "--max-pending",
                "budget": "--budget", "budget_period": "--budget-period", "budget_warn": "--budget-warn",
                "overdraft": "--overdraft"}
"""The option behind each field of a tenant the server may refuse."""


@app.command()
@reports_errors
@flags_for_fields(**TENANT_FLAGS)
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


@app.command("delete")
@reports_errors
def delete(name: Annotated[str, typer.Argument(help="The tenant.")]) -> None:
    """Delete a tenant whose work has all finished: its queues, tokens and finished workloads go
    (their usage stays in `gpupool usage`), and so does the pool's Unix account of it on the nodes.
    Refused, saying what still runs, while it has unfinished work or pods that have not ended.

    Example: gpupool tenant delete team-a
    """
    with client() as pool:
        deleted = pool.delete_tenant(name)
    accounts = f"; account {', '.join(deleted.accounts_removed)} removed" if deleted.accounts_removed else ""
    print(f"{deleted.name} deleted ({deleted.workloads} finished workload(s) removed{accounts})")


@app.command("set")
@reports_errors
@flags_for_fields(**TENANT_FLAGS)
def set_tenant(
    name: Annotated[str, typer.Argument(help="The tenant.")],
    unix_user: UnixUser = None,
    no_unix_user: Annotated[
        bool, typer.Option("--no-unix-user", help="Run its pods as the pool's own account again.")
    ] = False,
    max_priority: MaxPriority = None,
    max_pending: MaxPending = None,
    budget: Annotated[float | None, typer.Option(
        "--budget", min=0, help="What it may spend per period, in the price book's currency.")] = None,
    no_budget: Annotated[bool, typer.Option("--no-budget", help="Remove its budget.")] = False,
    budget_period: Annotated[BudgetPeriod | None, typer.Option(
        "--budget-period", help="The budget's period, in UTC (default month).")] = None,
    budget_warn: Annotated[float | None, typer.Option(
        "--budget-warn", min=0.01, max=1,
        help="Warn once a period when this fraction is spent (default 0.8).")] = None,
    overdraft: Annotated[bool | None, typer.Option(
        "--overdraft/--no-overdraft", help="Whether its new work still starts once its budget is spent.",
        show_default=False)] = None,
) -> None:
    """Change a tenant's Unix account, limits or budget (only what is given).

    Example: gpupool tenant set team-a --budget 5000 --budget-period month --budget-warn 0.8
    """
    if unix_user is not None and no_unix_user:
        raise typer.BadParameter("Give --unix-user USER or --no-unix-user, not both.")
    if budget is not None and no_budget:
        raise typer.BadParameter("Give --budget AMOUNT or --no-budget, not both.")
    given = (unix_user, max_priority, max_pending, budget, budget_period, budget_warn, overdraft)
    if all(v is None for v in given) and not no_unix_user and not no_budget:
        raise typer.BadParameter("Give what to change: --unix-user, --no-unix-user, --max-priority, "
                                 "--max-pending, --budget, --no-budget, --budget-period, --budget-warn or "
                                 "--overdraft/--no-overdraft.")
    with client() as pool:
        t = pool.update_tenant(name, unix_user=unix_user, clear_unix_user=no_unix_user,
                               max_priority=max_priority, max_pending=max_pending, budget=budget,
                               clear_budget=no_budget, budget_period=budget_period, budget_warn=budget_warn,
                               overdraft=overdraft)
    print(f"{t.name} max-priority {t.max_priority} max-pending {t.max_pending} "
          f"unix-user {t.unix_user or '-'} budget {_budget(t)}")


def _budget(t: Any) -> str:
    if t.budget is None:
        return "-"
    terms = f"{t.budget:g} per {t.budget_period}, warn at {t.budget_warn:.0%}"
    return terms + (", overdraft allowed" if t.overdraft else "")


def _spent(t: Any) -> str:
    if t.budget is None or t.spent is None:
        return "-"
    from gpupool.money import money

    mark = " exhausted" if t.budget_exhausted else ""
    return f"{money(t.spent, t.currency)} ({t.spent_ratio:.0%}){mark}"


@app.command("ls")
@reports_errors
def list_tenants(output: OutputOption = Format.TABLE) -> None:
    """List tenants with their queues, limits, Unix accounts, budgets and spend this period.

    Example: gpupool tenant ls -o name
    """
    from gpupool.cli._durations import when
    from gpupool.cli.output import render

    with client() as pool:
        tenants = pool.tenants()
    columns: list[Column[Any]] = [
        Column("TENANT", lambda t: t.name, key=True),
        Column("QUEUES", lambda t: ",".join(t.queues), squeeze=True),
        Column("MAX PRIORITY", lambda t: str(t.max_priority)),
        Column("MAX PENDING", lambda t: str(t.max_pending)),
        Column("UNIX USER", lambda t: t.unix_user or "-", squeeze=True),
        Column("BUDGET", _budget, squeeze=True),
        Column("SPENT", _spent, squeeze=True),
        Column("CREATED", lambda t: when(t.created_s), wide=True),
    ]
    render(output, tenants, columns, key=lambda t: t.name, title=f"{len(tenants)} tenant(s)")
