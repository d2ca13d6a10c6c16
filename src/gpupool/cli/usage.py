"""`gpupool usage` and `gpupool invoice`: metered slice-hours, their cost, and the dedicated-device cost."""

from __future__ import annotations

import csv
import io
import json
import re
import time
from datetime import UTC, date, datetime
from enum import StrEnum
from typing import Annotated, Any

import typer

from gpupool.cli._common import client, console, flags_for_fields, reports_errors
from gpupool.cli._durations import after_epoch
from gpupool.errors import InvalidInput
from gpupool.money import apportioned, bill, fixed_units, minor_digits, money

_AGO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([hdw])\s*$")
_UNITS_S = {"h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_MONTH = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")
_NUMBERS = ("pods", "device_hours", "memory_gib_hours", "cost", "dedicated_cost", "saving")
_DECIMALS = {"device_hours": 3, "memory_gib_hours": 1}
"""The decimals the table shows of the figures that are not money (pods are whole)."""
INVOICE_BY = ("queue", "model", "priority_class", "service")
"""An invoice's lines: a service's replicas are a line of their own (service '' is other work)."""


def point_s(text: str, flag: str, now_s: float | None = None) -> float:
    """Epoch seconds of `text`: a span back from now (12h, 7d, 2w) or a UTC date or date-time."""
    now_s = time.time() if now_s is None else now_s
    match = _AGO.match(text.lower())
    if match:
        return after_epoch(now_s - float(match.group(1)) * _UNITS_S[match.group(2)], text, flag)
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInput(f"{flag} takes a span back from now (12h, 7d) or a UTC date such as 2026-12-01 "
                           f"or 2026-12-01T08:00, got {text!r}.") from None
    return after_epoch((parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp(), text, flag)


def month_window(text: str) -> tuple[float, float]:
    """'2026-12' -> [its first UTC midnight, the next month's)."""
    match = _MONTH.match(text.strip())
    if match is None:
        raise InvalidInput(f"--month takes a month such as 2026-12, got {text!r}.")
    year, month = int(match.group(1)), int(match.group(2))
    if not 1970 <= year <= 9998:
        raise InvalidInput(f"--month takes a month from 1970-01 to 9998-12, got {text!r}.")
    start = datetime.combine(date(year, month, 1), datetime.min.time(), UTC)
    end = datetime.combine(date(year + month // 12, month % 12 + 1, 1), datetime.min.time(), UTC)
    return start.timestamp(), end.timestamp()


class UsageFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    CSV = "csv"


UsageOutput = Annotated[UsageFormat | None, typer.Option(
    "--output", "-o", case_sensitive=False,
    help="table, json (a list of rows, each with its currency) or csv (a header row); --json and --csv "
         "say the same.")]


def _rows(answer: Any) -> list[dict[str, Any]]:
    """Each row with its grouping keys (those asked for) and the figures."""
    return [{**{k: getattr(r, k) for k in answer.by}, "simulated": r.simulated,
             **{k: getattr(r, k) for k in _NUMBERS}, "priced": r.priced} for r in answer.rows]


def figure(name: str, value: float, currency: str) -> str:
    """One of a row's `_NUMBERS` as the table prints it (and the dashboard's usage page): pods whole,
    device-hours to 3 decimals, memory GiB-hours to 1, amounts as gpupool.money shows the currency."""
    if name == "pods":
        return str(int(value))
    if name in _DECIMALS:
        return f"{value:.{_DECIMALS[name]}f}"
    return money(value, currency)


def _column(name: str, lines: list[float], total: float, currency: str) -> tuple[list[str], str]:
    """A column of an invoice: its lines and total as `figure` shows them, the lines rounded together
    so that they add up to the total shown (largest remainder, gpupool.money.apportioned). Pods are
    not summed: the total counts distinct pods."""
    shown = figure(name, total, currency)
    if name == "pods":
        return [figure(name, line, currency) for line in lines], shown
    if name in _DECIMALS:
        digits = _DECIMALS[name]
        return [fixed_units(u, digits) for u in apportioned(lines, total, digits)], shown
    return _shown_bill(bill(lines, total, currency), currency)


def _shown_bill(billed: tuple[list[int], int, int], currency: str) -> tuple[list[str], str]:
    """`money.bill`'s lines and total (in units of its decimals) as text."""
    units, whole, digits = billed
    least = minor_digits(currency)
    return [fixed_units(u, digits, least) for u in units], fixed_units(whole, digits, least)


def _invoice_figures(answer: Any) -> list[tuple[list[str], str]]:
    """Each of `_NUMBERS`' columns of an invoice: its lines and its total, the lines adding up to it.
    SAVING is DEDICATED less COST as shown, line by line, where the two show the same decimals."""
    t, currency = answer.total, answer.currency
    cost = bill([r.cost for r in answer.rows], t.cost, currency)
    dedicated = bill([r.dedicated_cost for r in answer.rows], t.dedicated_cost, currency)
    figures = {n: _column(n, [getattr(r, n) for r in answer.rows], getattr(t, n), currency)
               for n in _NUMBERS if n not in ("cost", "dedicated_cost")}
    figures["cost"], figures["dedicated_cost"] = _shown_bill(cost, currency), _shown_bill(dedicated, currency)
    if dedicated[2] == cost[2]:  # the same decimals: each line's saving as the two columns show it
        least = minor_digits(currency)
        saving = [d - c for c, d in zip(cost[0], dedicated[0], strict=True)]
        figures["saving"] = ([fixed_units(u, cost[2], least) for u in saving],
                             fixed_units(dedicated[1] - cost[1], cost[2], least))
    return [figures[n] for n in _NUMBERS]


def _usage_figures(answer: Any) -> list[tuple[list[str], str]]:
    """Each of `_NUMBERS`' columns of a usage table: its rows and its total, each as `figure` shows it."""
    return [([figure(n, getattr(r, n), answer.currency) for r in answer.rows],
             figure(n, getattr(answer.total, n), answer.currency)) for n in _NUMBERS]


def _print(answer: Any, fmt: str, title: str, invoice: bool = False) -> None:
    """The rows in `fmt`; an invoice's lines add up to its total, which its JSON and CSV end with
    (a record whose grouping keys all say TOTAL)."""
    rows, t = _rows(answer), answer.total
    if invoice:
        rows_out = [*rows, {**{k: "TOTAL" for k in answer.by}, "simulated": t.simulated,
                            **{k: getattr(t, k) for k in _NUMBERS}, "priced": t.priced}]
    else:
        rows_out = rows
    if fmt == "json":
        typer.echo(json.dumps([{**row, "currency": answer.currency} for row in rows_out], indent=2))
        return
    if fmt == "csv":
        out = io.StringIO()
        columns = [*answer.by, "simulated", *_NUMBERS, "priced"]
        writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows_out)
        typer.echo(out.getvalue(), nl=False)
        return
    from rich.table import Table

    table = Table(title=title)
    for column in [*answer.by, "SIM", "PODS", "DEVICE-H", "MEM GiB-H", f"COST {answer.currency}",
                   f"DEDICATED {answer.currency}", "SAVING"]:
        table.add_column(column.upper(), justify="left" if column in answer.by else "right")
    figures = _invoice_figures(answer) if invoice else _usage_figures(answer)
    for i, (row, r) in enumerate(zip(rows, answer.rows, strict=True)):
        pods, device_h, memory_h, cost, dedicated, saving = (lines[i] for lines, _ in figures)
        keys = [str(row[k]) if k != "service" else (row[k] or "-") for k in answer.by]
        table.add_row(*keys, "yes" if r.simulated else "", pods, device_h, memory_h,
                      f"{cost}{'' if r.priced else ' *'}", dedicated, saving)
    label = ["TOTAL"] + [""] * (len(answer.by) - 1) if answer.by else []
    table.add_row(*label, "", *(total for _, total in figures))
    console().print(table)
    if not t.priced:
        console().print("* some usage is of a device model with no price in the price book (costed 0).")


def _format(as_json: bool, as_csv: bool, output: UsageFormat | None = None) -> str:
    """-o, or --json / --csv (its older spellings); two that disagree are refused."""
    asked = {f for f, given in (("json", as_json), ("csv", as_csv)) if given}
    if output is not None:
        asked.add(output.value)
    if len(asked) > 1:
        raise InvalidInput(f"Give one output format, not {' and '.join(sorted(asked))}; -o json, -o csv or "
                           "-o table.")
    return asked.pop() if asked else "table"


@reports_errors
@flags_for_fields(tenant="--tenant", since_s="--since", until_s="--until", by="--by")
def usage(
    tenant: Annotated[str | None, typer.Option(
        "--tenant", help="Only this tenant (a tenant token: itself).")] = None,
    since: Annotated[str | None, typer.Option("--since", help="7d, 12h, or a UTC date such as 2026-12-01; "
                                                               "default 30 days before --until.")] = None,
    until: Annotated[str | None, typer.Option("--until", help="Same forms; default now.")] = None,
    by: Annotated[str, typer.Option("--by", help="Group by any of tenant, queue, model, priority_class, "
                                                 "node, day, service (comma-separated).")] = "tenant",
    as_json: Annotated[bool, typer.Option("--json", help="A JSON list of rows.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV with a header row.")] = False,
    output: UsageOutput = None,
) -> None:
    """Show metered usage: device-hours, memory GiB-hours, cost, and the cost on dedicated devices.

    Example: gpupool usage --since 2026-12-01 --by tenant,model --csv
    """
    fmt = _format(as_json, as_csv, output)
    now = time.time()
    until_s = None if until is None else point_s(until, "--until", now)
    since_s = None if since is None else point_s(since, "--since", now)
    keys = [k.strip() for k in by.split(",") if k.strip()]
    with client() as pool:
        answer = pool.usage(tenant=tenant, since_s=since_s, until_s=until_s, by=keys)
    _print(answer, fmt, f"Usage {_span(answer.since_s, answer.until_s)}")


@reports_errors
def invoice(
    tenant: Annotated[str | None, typer.Option(
        "--tenant", help="The tenant billed (the admin names one; a tenant's token: itself).")] = None,
    month: Annotated[str | None, typer.Option(
        "--month", help="The month billed (UTC), such as 2026-12; default this month.")] = None,
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV with a header row; the total last.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON list of lines; the total last.")] = False,
    output: UsageOutput = None,
) -> None:
    """Bill one tenant for one month: a line per queue, device model, priority class and service (a
    service's replicas; `-` for other work), and the total, which the lines as printed add up to.

    Example: gpupool invoice --tenant vision --month 2026-12 --csv

    Example: gpupool invoice   (with a tenant's token: that tenant, this month so far)
    """
    fmt = _format(as_json, as_csv, output)
    month = month or datetime.now(UTC).strftime("%Y-%m")
    since_s, until_s = month_window(month)
    with client() as pool:
        if tenant is None:
            tenant = pool.whoami().tenant
            if tenant is None:
                raise InvalidInput("Name the tenant billed: gpupool invoice --tenant NAME (this token "
                                   "belongs to no tenant; a tenant's own token bills that tenant).")
        answer = pool.usage(tenant=tenant, since_s=since_s, until_s=until_s, by=INVOICE_BY)
    _print(answer, fmt, f"Invoice for {tenant}, {month} (UTC), in {answer.currency}", invoice=True)


def _span(since_s: float, until_s: float) -> str:
    def fmt(at: float) -> str:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M")

    return f"{fmt(since_s)} to {fmt(until_s)} UTC"
