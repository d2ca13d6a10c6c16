"""`gpupool nodes`: the pool's nodes and devices with what is allocated on each."""

from __future__ import annotations

from typing import Annotated

import typer

from gpupool.cli._common import SIMULATED_MARK, client, console, reports_errors

app = typer.Typer(
    help="Nodes: ls, cordon, uncordon, drain.", no_args_is_help=False, invoke_without_command=True
)


@app.callback(invoke_without_command=True)
@reports_errors
def nodes(ctx: typer.Context) -> None:
    """List nodes and their devices; simulated devices are marked (sim)."""
    if ctx.invoked_subcommand is not None:
        return
    _list()


@app.command("ls")
@reports_errors
def list_nodes() -> None:
    """List nodes, their devices, and which of a pod's limits each node enforces.

    Layers: accounts (pods run as their tenant's Unix account), devices (a pod sees only its
    devices), device_limits (compute and memory shares capped by CUDA MPS), host_limits (cpu and
    memory capped by a cgroup v2). A layer marked "no" is not enforced there, with the reason.
    """
    _list()


def _list() -> None:
    from rich.table import Table

    with client() as pool:
        listing = pool.nodes()
    table = Table(title=f"{len(listing)} node(s)")
    for column in ("NODE", "STATE", "DEVICES", "ALLOCATED GPUS", "CPU", "MEMORY"):
        table.add_column(column)
    for n in listing:
        state = (
            "draining" if n.draining else "cordoned" if n.cordoned else "ready" if n.healthy else "unhealthy"
        )
        models = sorted({d.model for d in n.devices})
        devices = f"{len(n.devices)}x{','.join(models) or '-'}" + (
            f" {SIMULATED_MARK}" if n.simulated else ""
        )
        allocated = sum(d.allocated_milli for d in n.devices) / 1000
        table.add_row(
            n.name,
            state,
            devices,
            f"{allocated:g}/{len(n.devices)}",
            f"{n.allocated_cpu_milli / 1000:g}/{n.cpu_milli / 1000:g}",
            f"{n.allocated_memory_mib}/{n.memory_mib} MiB",
        )
    console().print(table)
    layers = Table(title="enforcement (what each node holds a pod to)")
    for column in ("NODE", "LAYER", "ENFORCED", "DETAIL"):
        layers.add_column(column)
    for n in listing:
        for state in n.enforcement:
            layers.add_row(n.name, state.layer, "yes" if state.enforced else "[bold]no[/bold]", state.detail)
    console().print(layers)


def _act(action: str, name: str) -> None:
    with client() as pool:
        node = getattr(pool, action)(name)
    print(f"{node.name} {'draining' if node.draining else 'cordoned' if node.cordoned else 'ready'}")


@app.command()
@reports_errors
def cordon(name: Annotated[str, typer.Argument(help="Node name.")]) -> None:
    """Admin: stop placing new work on a node."""
    _act("cordon", name)


@app.command()
@reports_errors
def uncordon(name: Annotated[str, typer.Argument(help="Node name.")]) -> None:
    """Admin: let work land on a node again (also ends a drain)."""
    _act("uncordon", name)


@app.command()
@reports_errors
def drain(name: Annotated[str, typer.Argument(help="Node name.")]) -> None:
    """Admin: cordon a node and requeue the work running there."""
    _act("drain", name)
