"""`gpupool queue create|set|ls`: tenants' queues, their quotas and cohorts (admin), and their use."""

from __future__ import annotations

import math
import time
from typing import Annotated, Any

import typer

from gpupool.cli._common import client, flags_for_fields, reports_errors
from gpupool.cli.output import Column, Format, OutputOption
from gpupool.errors import InvalidInput

app = typer.Typer(help="Queues, quotas and cohorts (admin): create, set, ls.\n\n"
                  "Example: gpupool queue create team-a batch --quota 4 --cohort research",
                  no_args_is_help=True)

NONE = "none"
"""What `queue set` takes to clear a quota, a cohort or a limit."""

Tenant = Annotated[str, typer.Argument(help="The tenant that owns it.")]
Name = Annotated[str, typer.Argument(help="The queue name.")]
Quota = Annotated[str | None, typer.Option(
    "--quota", metavar="DEVICES", help="Devices its running work may hold (its nominal quota; 0.5 = half "
    "a device); none: no cap.")]
Cohort = Annotated[str | None, typer.Option(
    "--cohort", help="Queues of one cohort lend each other their unused quota; none: leave the cohort.")]
BorrowingLimit = Annotated[str | None, typer.Option(
    "--borrowing-limit", metavar="DEVICES",
    help="How far beyond its quota it may borrow from its cohort; none: as far as the cohort lends.")]
LendingLimit = Annotated[str | None, typer.Option(
    "--lending-limit", metavar="DEVICES",
    help="How much of its unused quota its cohort may borrow (at most its quota); none: all of it.")]
Weight = Annotated[str | None, typer.Option(
    "--weight", metavar="W", help="Its tenant's fair-share weight under DRF ordering (above 0; default 1).")]
QUEUE_FLAGS = {"quota_gpus": "--quota", "cohort": "--cohort", "borrowing_limit_gpus": "--borrowing-limit",
               "lending_limit_gpus": "--lending-limit", "weight": "--weight"}
"""The option behind each field of a queue the server may refuse."""


def devices(text: str | None, flag: str) -> float | None:
    """A number of devices >= 0, or None for `none`; InvalidInput naming the flag otherwise."""
    if text is None or text.strip().lower() == NONE:
        return None
    try:
        value = float(text)
    except ValueError:
        raise InvalidInput(f"{flag} must be a number of devices or '{NONE}' (got {text!r}).") from None
    if math.isnan(value):
        raise InvalidInput(f"{flag} must be a number of devices or '{NONE}' (got {text!r}).")
    if math.isinf(value) and value > 0:  # "inf", or a number beyond a float (1e400)
        raise InvalidInput(f"{flag} must be a finite number of devices (got {text!r}); for no limit, give "
                           f"'{NONE}'.")
    if value < 0:
        raise InvalidInput(f"{flag} must be >= 0 (got {text}).")
    return value


def weight(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InvalidInput(f"--weight must be a number above 0 (got {text!r}).")
    return value


def cohort_name(text: str) -> str | None:
    return None if text.strip().lower() == NONE else text


@app.command()
@reports_errors
@flags_for_fields(**QUEUE_FLAGS)
def create(tenant: Tenant, name: Name, quota: Quota = None, cohort: Cohort = None,
           borrowing_limit: BorrowingLimit = None, lending_limit: LendingLimit = None,
           weight_text: Weight = None) -> None:
    """Create a queue for a tenant, optionally with a quota in a cohort.

    Example: gpupool queue create team-a batch --quota 4 --cohort research --lending-limit 2
    """
    with client() as pool:
        queue = pool.create_queue(
            tenant, name, devices(quota, "--quota"), cohort=None if cohort is None else cohort_name(cohort),
            borrowing_limit_gpus=devices(borrowing_limit, "--borrowing-limit"),
            lending_limit_gpus=devices(lending_limit, "--lending-limit"),
            weight=1.0 if weight_text is None else weight(weight_text))
    print(f"{queue.tenant}/{queue.name}")


@app.command("set")
@reports_errors
@flags_for_fields(**QUEUE_FLAGS)
def set_queue(tenant: Tenant, name: Name, quota: Quota = None, cohort: Cohort = None,
              borrowing_limit: BorrowingLimit = None, lending_limit: LendingLimit = None,
              weight_text: Weight = None) -> None:
    """Change a queue's quota, cohort, limits or weight: only the options given; `none` clears one.

    Running work keeps running when a quota is lowered; new work waits until the queue is back
    under it (with preemption on, other queues of its cohort reclaim what it now borrows).

    Example: gpupool queue set team-a batch --quota 8 --borrowing-limit none
    """
    from gpupool.client import KEEP

    changes: dict[str, Any] = {}
    if quota is not None:
        changes["quota_gpus"] = devices(quota, "--quota")
    if cohort is not None:
        changes["cohort"] = cohort_name(cohort)
    if borrowing_limit is not None:
        changes["borrowing_limit_gpus"] = devices(borrowing_limit, "--borrowing-limit")
    if lending_limit is not None:
        changes["lending_limit_gpus"] = devices(lending_limit, "--lending-limit")
    if weight_text is not None:
        changes["weight"] = weight(weight_text)
    if not changes:
        raise InvalidInput("Give at least one of --quota, --cohort, --borrowing-limit, --lending-limit "
                           "or --weight to change.")
    with client() as pool:
        queue = pool.set_queue(tenant, name, **{k: changes.get(k, KEEP) for k in _SETTINGS})
    print(f"{queue.tenant}/{queue.name} {settings_text(queue)}")


_SETTINGS = ("quota_gpus", "cohort", "borrowing_limit_gpus", "lending_limit_gpus", "weight")


def settings_text(q: Any) -> str:
    return (f"quota {_gpus(q.quota_gpus)}, cohort {q.cohort or NONE}, "
            f"borrowing limit {_gpus(q.borrowing_limit_gpus)}, lending limit {_gpus(q.lending_limit_gpus)}, "
            f"weight {q.weight:g}")


def _gpus(value: float | None) -> str:
    return NONE if value is None else f"{value:g}"


@app.command("ls")
@reports_errors
def list_queues(
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="Only this tenant's.")] = None,
    output: OutputOption = Format.TABLE,
) -> None:
    """List queues: quota (nominal), devices used, borrowed from and lent to their cohort, weight,
    pending work and, under backfill, the head workload the pool reserves room for.

    Example: gpupool queue ls -t team-a -o json
    """
    from gpupool.cli.output import render

    tenant = tenant.strip().lower() if tenant else None
    with client() as pool:
        queues = pool.queues(tenant)
        if not queues and tenant:
            known_tenant(pool, tenant)
    now = time.time()
    columns: list[Column[Any]] = [
        Column("TENANT/QUEUE", lambda q: f"{q.tenant}/{q.name}", key=True),
        Column("COHORT", lambda q: q.cohort or "-", squeeze=True),
        Column("NOMINAL", lambda q: _dash(q.quota_gpus)),
        Column("USED", lambda q: f"{q.used_gpus:g}"),
        Column("BORROWED", lambda q: f"{q.borrowed_gpus:g}"),
        Column("LENT", lambda q: f"{q.lent_gpus:g}"),
        Column("BORROW LIMIT", lambda q: _dash(q.borrowing_limit_gpus), wide=True),
        Column("LEND LIMIT", lambda q: _dash(q.lending_limit_gpus), wide=True),
        Column("WEIGHT", lambda q: f"{q.weight:g}"),
        Column("RUNNING", lambda q: str(q.running), wide=True),
        Column("PENDING", lambda q: str(q.pending)),
        Column("RESERVED", lambda q: reserved_text(q.reserved_workload, q.reserved_start_s, now),
               squeeze=True),
    ]
    render(output, queues, columns, key=lambda q: f"{q.tenant}/{q.name}", title=f"{len(queues)} queue(s)")


def _dash(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def reserved_text(workload_id: str | None, start_s: float | None, now: float) -> str:
    """`w-... in 5m`: the head workload the pool holds room for and when it should start."""
    if workload_id is None or start_s is None:
        return "-"
    delta = start_s - now
    if delta <= 0:
        when = "now"
    elif delta < 120:
        when = f"in {delta:.0f}s"
    elif delta < 7200:
        when = f"in {delta / 60:.0f}m"
    else:
        when = f"in {delta / 3600:.1f}h"
    return f"{workload_id} {when}"


def known_tenant(pool: Any, tenant: str) -> None:
    """NotFound (exit 3) unless `tenant` exists: an empty listing must not hide a typo."""
    from gpupool.errors import NotFound, did_you_mean

    names = [t.name for t in pool.tenants()]
    if tenant not in names:
        raise NotFound(f"No tenant {tenant!r}; list them with `gpupool tenant ls`."
                       + did_you_mean(tenant, names), tenant=tenant)
