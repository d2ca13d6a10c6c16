"""`gpupool show ID...`: workloads in detail (where they run, their pods and events), or as JSON."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from gpupool.cli._common import SIMULATED_MARK, client, console, reports_errors
from gpupool.cli._targets import resolve_all


@reports_errors
def show(
    workload_ids: Annotated[
        list[str], typer.Argument(help="Workload ids (from submit or ls), or unique prefixes.")
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the workload as JSON (a list for several).")
    ] = False,
) -> None:
    """Show workloads: status, reason, where they run, pods, events.

    Example: gpupool show w-1a2b

    Exit codes: 0 ok, 2 an ambiguous id prefix, 3 not found or forbidden, 4 server unreachable.
    """
    with client() as pool:
        workloads = resolve_all(pool, workload_ids)
        if as_json:
            dumped = [w.model_dump(mode="json") for w in workloads]
            print(json.dumps(dumped[0] if len(dumped) == 1 else dumped, indent=2))
            return
        for i, workload in enumerate(workloads):
            if i:
                print()
            _show_one(pool, workload)


def workdir_line(pool: Any, workload: Any) -> str:
    """Where its pods run and why (the node's agent says so once the pod has started)."""
    spec = workload.spec
    if spec.workdir:
        return f"workdir: {spec.workdir} (--workdir)"
    if not spec.submit_dir:
        return "workdir: private directory (no --workdir, and not submitted from a directory)"
    if workload.status == "pending" or not workload.pods:
        return (f"workdir: not chosen yet: {spec.submit_dir} (where submit ran) if the pod's account may "
                "enter it on its node, else its private directory")
    note = pool.logs(workload.id, rank=0, stream="notes").text.strip()
    return note or f"workdir: not recorded by the node (submitted from {spec.submit_dir})"


def requested_line(spec: Any) -> str:
    """What each replica asked for, as submitted (the slices held are in the pods table)."""
    r = spec.resources
    parts = [f"{r.gpus:g} GPU" if r.gpus else "no GPU"]
    if r.gpu_memory:
        parts.append(f"{r.gpu_memory} device memory")
    if r.cpu:
        parts.append(f"cpu {r.cpu}")
    if r.memory:
        parts.append(f"memory {r.memory}")
    if r.models:
        parts.append(f"models {', '.join(r.models)}")
    return f"requested: {spec.replicas} x ({', '.join(parts)})"


def times_line(workload: Any, now_s: float | None = None) -> str:
    """Submitted, started and ended (local time), and how long it has run."""
    import time

    def at(epoch: float | None) -> str:
        return "-" if epoch is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))

    line = (f"submitted {at(workload.submit_s)}, started {at(workload.started_s)}, "
            f"ended {at(workload.finished_s)}")
    if workload.started_s is not None:
        end = workload.finished_s if workload.finished_s is not None else (now_s or time.time())
        line += f", elapsed {max(0.0, end - workload.started_s):.1f} s"
    return line


def _show_one(pool: Any, workload: Any) -> None:
    events = pool.events(workload.id)
    from rich.table import Table

    out = console()
    out.print(
        f"[bold]{workload.id}[/bold] {workload.name}  {workload.tenant}/{workload.queue}  "
        f"[bold]{workload.status}[/bold]"
        + (f"  exit {workload.exit_code}" if workload.exit_code is not None else "")
    )
    if workload.reason:
        out.print(f"reason: {workload.reason}: {workload.message}")
    out.print(f"command: {' '.join(workload.spec.command)}", markup=False)
    out.print(requested_line(workload.spec), markup=False, highlight=False, soft_wrap=True)
    out.print(times_line(workload), markup=False, highlight=False, soft_wrap=True)
    out.print(workdir_line(pool, workload), markup=False, highlight=False, soft_wrap=True)
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
