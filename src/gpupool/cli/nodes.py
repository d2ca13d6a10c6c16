"""`gpupool node`: the pool's nodes, their state and devices with what is allocated on each; drain;
injected faults on simulated nodes (fail, heal)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpupool.cli._common import SIMULATED_MARK, client, hand_down, reports_errors
from gpupool.cli.output import Column, Format, OutputOption

app = typer.Typer(
    help="Nodes: ls, show, cordon, uncordon, drain, fail, heal; join, leave (a pool on Ray).\n\n"
         "Example: gpupool node ls",
    no_args_is_help=False,
    invoke_without_command=True,
)


@app.callback(invoke_without_command=True)
@reports_errors
def nodes(ctx: typer.Context, output: OutputOption = Format.TABLE) -> None:
    """List nodes and their devices; simulated devices are marked (sim)."""
    if ctx.invoked_subcommand is not None:
        hand_down(ctx, output=output)  # `gpupool node -o json ls` is `gpupool node ls -o json`
        return
    _list(output)


@app.command("ls")
@reports_errors
def list_nodes(output: OutputOption = Format.TABLE) -> None:
    """List nodes, their state, devices, and which of a pod's limits each node enforces.

    States: ready, cordoned, draining (no new work; what runs there finishes), drained (draining
    and nothing left running), unhealthy (the node, or the devices named), lost (the pool knows the
    node, from work or flags there, but its provider no longer lists it).

    Layers: accounts (pods run as their tenant's Unix account), devices (a pod is given only its
    devices; "advisory" on real devices: no device cgroup rules stop a process that opens the
    others), device_limits (compute and memory shares capped by CUDA MPS), host_limits (cpu and
    memory capped by a cgroup v2), proc (/proc mounted hidepid=2, so a pod cannot read other
    accounts' command lines), network (a pod reaches only its tenant's pods and the pool's
    services). The table's NOT ENFORCED column names a node's layers that are not enforced (all: none
    is, as on simulated nodes; advisory ones are marked ~); -o wide adds the enforcement table, each
    layer with the reason and the remedy.

    Example: gpupool node ls -o name | xargs -n1 gpupool node cordon
    """
    _list(output)


def _list(output: Format) -> None:
    from gpupool.cli.output import console, render, table, whole_console

    with client() as pool:
        listing = pool.nodes()
        router = pool.pool().router if output in (Format.TABLE, Format.WIDE) else ""
    render(output, listing, _COLUMNS, key=lambda n: n.name, title=f"{len(listing)} node(s)")
    if router:  # where operators look: not only the server's start log
        print(f"services: routed by {router}")
    if output is Format.TABLE and any(not_enforced(n) != "-" for n in listing):
        console().print("NOT ENFORCED: what a pod on the node is not held to; see gpupool node ls -o wide "
                        "for why and the remedy.", markup=False, highlight=False)  # wrapped to a terminal
    if output is Format.WIDE:
        layers = [(n.name, state) for n in listing for state in n.enforcement]
        whole_console().print(table("enforcement (what each node holds a pod to)", _LAYER_COLUMNS,
                                    layers, wide=False))  # -o wide: every reason whole


def _devices(n: Any) -> str:
    models = sorted({d.model for d in n.devices})
    return f"{len(n.devices)}x{','.join(models) or '-'}" + (f" {SIMULATED_MARK}" if n.simulated else "")


def not_enforced(n: Any) -> str:
    """The node's layers that are not enforced, said once for every pod there: `all` when none is,
    advisory ones marked ~ (`devices~`), `-` when every layer holds."""
    if n.enforcement and not any(state.enforced for state in n.enforcement):
        return "all"
    return ",".join(state.layer + ("~" if state.level == "advisory" else "")
                    for state in n.enforcement if not state.enforced) or "-"


def _host_memory(n: Any) -> str:
    """Host memory allocated of the node's, in the unit people read: 64GiB/2048GiB."""
    from gpupool.core.units import format_memory_mib

    return f"{format_memory_mib(n.allocated_memory_mib)}/{format_memory_mib(n.memory_mib)}"


def _allocated(n: Any) -> float:
    return sum(d.allocated_milli for d in n.devices) / 1000


def _device_memory(n: Any) -> str:
    from gpupool.core.units import format_memory_mib

    sizes = sorted({d.memory_mib for d in n.devices})
    return ",".join(format_memory_mib(m) if m else "?" for m in sizes) or "-"


def state_text(n: Any) -> str:
    """The state, with what is unhealthy: `unhealthy (node)`, `unhealthy (devices 3,5)`."""
    if n.state != "unhealthy":
        return str(n.state)
    if not n.healthy:
        return "unhealthy (node)"
    devices = ",".join(str(i) for i in n.unhealthy_devices)
    return f"unhealthy (device{'s' if len(n.unhealthy_devices) > 1 else ''} {devices})"


def _faults(n: Any) -> str:
    injected = [f"device {d.index}" for d in n.devices if d.injected_fault]
    injected = (["node"] if n.injected_fault else []) + injected
    return ",".join(injected) or "-"


_COLUMNS: list[Column[Any]] = [
    Column("NODE", lambda n: n.name, key=True),
    Column("STATE", state_text, squeeze=True),
    Column("DEVICES", _devices, squeeze=True),
    Column("GPUS", lambda n: f"{_allocated(n):g}/{len(n.devices)}"),
    Column("CPU", lambda n: f"{n.allocated_cpu_milli / 1000:g}/{n.cpu_milli / 1000:g}"),
    Column("MEMORY", _host_memory),
    Column("NOT ENFORCED", not_enforced, squeeze=True),
    Column("DEVICE MEMORY", _device_memory, wide=True),
    Column("HEALTHY", lambda n: "yes" if n.healthy else "no", wide=True),
    Column("INJECTED FAULTS", _faults, wide=True),
    Column("CONTAINERS", lambda n: n.containers.partition(":")[0] if n.containers else "-", wide=True),
    Column("LABELS", lambda n: ",".join(f"{k}={v}" for k, v in sorted(n.labels.items())) or "-", wide=True),
]
_LAYER_COLUMNS: list[Column[Any]] = [
    Column("NODE", lambda r: r[0], key=True),
    Column("LAYER", lambda r: r[1].layer),
    Column("ENFORCED", lambda r: "yes" if r[1].enforced else (
        "advisory" if r[1].level == "advisory" else "no")),
    Column("DETAIL", lambda r: r[1].detail, squeeze=True),
]


def _act(action: str, name: str, **kwargs: Any) -> None:
    with client() as pool:
        node = getattr(pool, action)(name, **kwargs)
    print(f"{node.name} {state_text(node)}")


@app.command()
@reports_errors
def cordon(name: Annotated[str, typer.Argument(help="Node name.")]) -> None:
    """Admin: stop placing new work on a node (what runs there keeps running).

    Example: gpupool node cordon gpu-07
    """
    _act("cordon", name)


@app.command()
@reports_errors
def uncordon(name: Annotated[str, typer.Argument(help="Node name.")]) -> None:
    """Admin: let work land on a node again (also ends a drain).

    Example: gpupool node uncordon gpu-07
    """
    _act("uncordon", name)


@app.command()
@reports_errors
def drain(
    name: Annotated[str, typer.Argument(help="Node name.")],
    now: Annotated[bool, typer.Option("--now", help="Requeue the work running there at once.")] = False,
) -> None:
    """Admin: stop placing new work on a node and let what runs there finish, like Slurm's DRAIN.

    The node reads `draining` while work placed before the drain runs, then `drained`; with --now
    that work is stopped and requeued at once. `gpupool node uncordon` ends either.

    Example: gpupool node drain gpu-07 && gpupool node ls
    """
    _act("drain", name, now=now)


@app.command()
@reports_errors
def show(
    name: Annotated[str, typer.Argument(help="Node name.")],
    output: OutputOption = Format.TABLE,
) -> None:
    """One node: its state, each device's health and allocation, and which limits it enforces (-o json:
    the API's object).

    Example: gpupool node show gpu-07
    """
    import json

    from gpupool.cli.output import console, table, terminal_width, whole_console

    with client() as pool:
        node = pool.node(name)
    if output is Format.JSON:
        print(json.dumps(node.model_dump(mode="json"), indent=2))
        return
    if output is Format.NAME:
        print(node.name)
        return
    print(f"{node.name} {state_text(node)}")
    width = None if output is Format.WIDE else terminal_width()
    console().print(table(f"{len(node.devices)} device(s)", _DEVICE_COLUMNS, node.devices,
                          wide=output is Format.WIDE, width=width))
    print(f"containers: {node.containers}")
    layers = [(node.name, state) for state in node.enforcement]
    out = console() if width else whole_console()
    out.print(table("enforcement (what the node holds a pod to)", _LAYER_COLUMNS[1:], layers, wide=False,
                    width=width))


def _health(d: Any) -> str:
    return ("healthy" if d.healthy else "unhealthy") + (" (injected)" if d.injected_fault else "")


def _memory(mib: int) -> str:
    from gpupool.core.units import format_memory_mib

    return format_memory_mib(mib) if mib else "?"


_DEVICE_COLUMNS: list[Column[Any]] = [
    Column("INDEX", lambda d: str(d.index), key=True),
    Column("MODEL", lambda d: d.model + (f" {SIMULATED_MARK}" if d.simulated else "")),
    Column("HEALTH", _health),
    Column("ALLOCATED", lambda d: f"{d.allocated_milli / 1000:g}"),
    Column("MEMORY", lambda d: f"{_memory(d.allocated_memory_mib) if d.allocated_memory_mib else 0}/"
                               f"{_memory(d.memory_mib)}"),
    Column("UUID", lambda d: d.uuid, wide=True),
]

DeviceOption = Annotated[int | None, typer.Option("--device", "-d", min=0,
                                                  help="A device index (see `gpupool node show`).")]


@app.command()
@reports_errors
def fail(name: Annotated[str, typer.Argument(help="Node name.")], device: DeviceOption = None) -> None:
    """Admin: inject a fault on a simulated or fake node, or on one of its devices (--device I).

    The node (or device) turns unhealthy, as if the hardware failed: the scheduler evicts and
    requeues the work on it and places nothing new there until `gpupool node heal`. Faults outlive
    a server restart. Refused on real hardware.

    Example: gpupool node fail sim-0 --device 3
    """
    _act("fail_node", name, device=device)


@app.command()
@reports_errors
def heal(name: Annotated[str, typer.Argument(help="Node name.")], device: DeviceOption = None) -> None:
    """Admin: clear an injected fault: of one device with --device I, else every one on the node.

    Example: gpupool node heal sim-0
    """
    _act("heal_node", name, device=device)


def _register_scale_out() -> None:
    from gpupool.cli import node_join  # its Ray imports happen only when a command runs

    app.command("join")(node_join.join)
    app.command("leave")(node_join.leave)


_register_scale_out()
