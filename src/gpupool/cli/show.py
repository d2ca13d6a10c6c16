"""`gpupool show ID`: one workload in detail, or as JSON."""

from __future__ import annotations

from typing import Annotated

import typer

from gpupool.cli._common import SIMULATED_MARK, client, console, reports_errors


@reports_errors
def show(
    workload_id: Annotated[str, typer.Argument(help="The workload id (from submit or ls).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the workload as JSON.")] = False,
) -> None:
    """Show one workload: status, reason, pods, events.

    Exit codes: 0 ok, 3 not found or forbidden, 4 server unreachable.
    """
    with client() as pool:
        workload = pool.workload(workload_id)
        events = [] if as_json else pool.events(workload_id)
    if as_json:
        print(workload.model_dump_json(indent=2))
        return
    from rich.table import Table

    out = console()
    out.print(
        f"[bold]{workload.id}[/bold] {workload.name}  {workload.tenant}/{workload.queue}  "
        f"[bold]{workload.status}[/bold]"
        + (f"  exit {workload.exit_code}" if workload.exit_code is not None else "")
    )
    if workload.reason:
        out.print(f"reason: {workload.reason}: {workload.message}")
    out.print(f"command: {' '.join(workload.spec.command)}")
    unenforced = sorted({e.message for e in events if e.reason == "limits_unenforced"})
    for sentence in unenforced:
        out.print(f"[bold]not enforced:[/bold] {sentence}")
    pods = Table(title="pods")
    for column in ("POD", "STATUS", "NODE", "SLICES", "EXIT"):
        pods.add_column(column)
    for p in workload.pods:
        slices = ", ".join(f"dev{s.device_index}:{s.compute_milli / 1000:g}" for s in p.slices) or "-"
        pods.add_row(
            p.id,
            p.status,
            p.node + (f" {SIMULATED_MARK}" if p.simulated else ""),
            slices,
            "-" if p.exit_code is None else str(p.exit_code),
        )
    out.print(pods)
    table = Table(title="events")
    for column in ("AT", "FROM", "TO", "REASON", "MESSAGE"):
        table.add_column(column)
    import time

    for e in events:
        table.add_row(
            time.strftime("%H:%M:%S", time.localtime(e.at_s)),
            e.from_status or "-",
            e.to_status,
            e.reason,
            e.message,
        )
    out.print(table)
