"""`gpupool fed`: a federation hub's member pools (`gpupool up --federation`, docs/federation.md)."""

from __future__ import annotations

from typing import Any

import typer

from gpupool.cli._common import client, hand_down, reports_errors
from gpupool.cli.output import Column, Format, OutputOption

app = typer.Typer(
    help="A federation hub's member pools: ls.\n\nExample: gpupool fed ls",
    no_args_is_help=False,
    invoke_without_command=True,
)


@app.callback(invoke_without_command=True)
@reports_errors
def fed(ctx: typer.Context, output: OutputOption = Format.TABLE) -> None:
    """List the hub's member pools (as `gpupool fed ls`)."""
    if ctx.invoked_subcommand is None:
        _list(output)
    hand_down(ctx, output=output)  # `gpupool fed -o json ls` is `gpupool fed ls -o json`


@app.command("ls")
@reports_errors
def list_members(output: OutputOption = Format.TABLE) -> None:
    """Each member pool of the hub now: up or down (and why), its GPUs in use of its capacity, its
    queue (pending and running workloads), the hub's workloads placed there, and the price of one
    GPU-hour now (its time-of-day price book). Asked of a pool that is not a hub, it says so.

    Example: gpupool fed ls -o json
    """
    _list(output)


def _list(output: Format) -> None:
    from gpupool.cli.output import render
    from gpupool.errors import NotFound
    from gpupool.federation.routes import MemberOut

    with client() as pool:
        try:
            members = [MemberOut.model_validate(m) for m in pool.request("GET", "/federation/members")]
        except NotFound:
            raise NotFound("This server is a pool, not a federation hub (gpupool up --federation FILE); "
                           "point GPUPOOL_URL at the hub.") from None
    render(output, members, _COLUMNS, key=lambda m: m.name, title=f"{len(members)} member(s)")


_COLUMNS: list[Column[Any]] = [
    Column("MEMBER", lambda m: m.name, key=True),
    Column("REGION", lambda m: m.region),
    Column("STATE", lambda m: m.state if not m.note else f"{m.state} ({m.note})", squeeze=True),
    Column("GPUS", lambda m: f"{m.allocated_gpus:g}/{m.capacity_gpus:g}"),
    Column("PENDING", lambda m: str(m.pending)),
    Column("RUNNING", lambda m: str(m.running)),
    Column("FROM HUB", lambda m: str(m.placed_here)),
    Column("PRICE/GPU-H", lambda m: f"{m.price_gpu_hour:g} {m.currency}"),
    Column("URL", lambda m: m.url, wide=True),
]
