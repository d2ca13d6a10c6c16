"""`gpupool top`: a live view of the pool: capacity and use by model and tenant, and the queue."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from gpupool.cli._common import SIMULATED_MARK, client, console, reports_errors
from gpupool.cli._reconnect import DEFAULT_RECONNECT_S, Reconnecting, ReconnectOption


def _view(pool: Any) -> Any:
    from rich.console import Group
    from rich.table import Table

    summary = pool.pool()
    title = (
        f"pool: {summary.allocated_gpus:g}/{summary.capacity_gpus:g} GPUs allocated "
        f"({summary.utilisation:.0%}) on {summary.nodes} node(s)"
    )
    if summary.simulated:
        title += f" {SIMULATED_MARK} SIMULATED"
    models = Table(title=title)
    for column in ("MODEL", "DEVICES", "ALLOCATED", "UTILISATION"):
        models.add_column(column)
    for m in summary.by_model:
        models.add_row(
            m.model + (f" {SIMULATED_MARK}" if m.simulated else ""),
            str(m.devices),
            f"{m.allocated_gpus:g}",
            f"{m.utilisation:.0%}",
        )
    tenants = Table(title="tenants")
    for column in ("TENANT", "ALLOCATED GPUS", "RUNNING", "PENDING"):
        tenants.add_column(column)
    for t in summary.by_tenant:
        tenants.add_row(t.tenant, f"{t.allocated_gpus:g}", str(t.running), str(t.pending))
    states = "  ".join(f"{k}={v}" for k, v in summary.workloads.items())
    return Group(models, tenants, f"workloads: {states}")


@reports_errors
def top(
    once: Annotated[bool, typer.Option("--once", help="Print one view and exit.")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between refreshes.")] = 1.0,
    reconnect: ReconnectOption = DEFAULT_RECONNECT_S,
) -> None:
    """A live view of the pool (Ctrl-C to quit).

    Example: gpupool top --interval 2

    Exit codes: 0 ok, 4 server unreachable (live: after --reconnect).
    """
    out = console()
    retry = Reconnecting(0 if once else reconnect)
    with client() as pool:
        if once:
            out.print(_view(pool))
            return
        from rich.live import Live

        try:
            with Live(retry.call(lambda: _view(pool)), console=out, refresh_per_second=4) as live:
                while True:
                    time.sleep(interval)
                    live.update(retry.call(lambda: _view(pool)))
        except KeyboardInterrupt:  # how a live view ends: exit 0, as `ls --watch` and `events -f` do
            return
