"""`gpupool fabric export` and `gpupool fabric generate`: configuration files and synthetic fabrics."""

from __future__ import annotations

from pathlib import Path

import typer

from gpupool.cli.fabric import (
    FILE_ARG,
    NODE_MAP,
    _errors,
    _find_ca,
    _ids,
    export_app,
    generate_app,
    load_fabric,
)
from gpupool.core.fabric.model import Fabric
from gpupool.core.fabric.rates import parse_speed
from gpupool.errors import InvalidInput

OUT = typer.Option(None, "--out", "-o", help="Write here instead of printing.")
CLASSES = typer.Option(
    ["critical=0.8", "normal=0.15", "scavenger=0.05"], "--class",
    help="CLASS=SHARE of a busy link (repeatable); the smallest share becomes SL 0.",
)


def _write(text: str, out: Path | None) -> None:
    if out is None:
        typer.echo(text, nl=False)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    typer.echo(f"Wrote {out}", err=True)  # the name as given, never read as rich markup nor wrapped


@export_app.command("slurm")
def export_slurm(
    path: Path = FILE_ARG,
    out: Path | None = OUT,
    spines: Path | None = typer.Option(None, "--spines", help="File of spine switch ids, one a line."),
    style: str = typer.Option("spines", "--style", help="spines (site style) or levels (strict tree)."),
    node_map: Path | None = NODE_MAP,
) -> None:
    """Slurm topology.conf (topology/tree plugin).

    Example: gpupool fabric export slurm fabric.topo --out /etc/slurm/topology.conf
    """
    from gpupool.exporters.slurm import TopologyStyle, topology_conf

    with _errors():
        fabric = load_fabric(path, node_map)
        try:
            chosen = TopologyStyle(style)
        except ValueError:
            raise InvalidInput(f"--style must be spines or levels, got {style!r}.") from None
        _write(topology_conf(fabric, _ids(fabric, spines), chosen), out)


def _members(fabric: Fabric, refs: str) -> list[str]:
    from gpupool.exporters.slurm import host_of

    cas: list[str] = []
    for ref in filter(None, (r.strip() for r in refs.split(","))):
        on_host = [ca for ca in fabric.cas if host_of(fabric, ca) == ref]
        cas += on_host or [_find_ca(fabric, ref)]
    return cas


def _tenants(fabric: Fabric, items: list[str]) -> dict[str, list[str]]:
    tenants: dict[str, list[str]] = {}
    for item in items:
        name, sep, refs = item.partition("=")
        if not sep or not name or not refs:
            raise InvalidInput(f"Expected --tenant NAME=host1,host2, got {item!r}.")
        tenants[name] = _members(fabric, refs)
    if not tenants:
        raise InvalidInput("Give at least one --tenant NAME=host1,host2.")
    return tenants


@export_app.command("opensm-partitions")
def export_partitions(
    path: Path = FILE_ARG,
    tenant: list[str] = typer.Option([], "--tenant", help="NAME=host,host (repeatable)."),
    shared: str = typer.Option("", "--shared", help="Service hosts every tenant may reach (limited)."),
    out: Path | None = OUT,
    node_map: Path | None = NODE_MAP,
) -> None:
    """OpenSM partitions.conf: one P_Key per tenant; fails if two tenants could reach each other.

    Example: gpupool fabric export opensm-partitions fabric.topo --tenant a=node01,node02 --tenant b=node03
    """
    from gpupool.core.fabric.partitions import isolation_violations, plan_partitions
    from gpupool.exporters.opensm import partitions_conf

    with _errors():
        fabric = load_fabric(path, node_map)
        plan = plan_partitions(_tenants(fabric, tenant), _members(fabric, shared))
        leaks = isolation_violations(plan)
        if leaks:
            a, ta, b, tb = leaks[0]
            raise InvalidInput(f"{a} ({ta}) could reach {b} ({tb}); fix the tenant lists.")
        _write(partitions_conf(fabric, plan), out)


@export_app.command("opensm-qos")
def export_qos(
    classes: list[str] = CLASSES,
    pkey_class: list[str] = typer.Option([], "--pkey-class", help="0xPKEY=CLASS (repeatable)."),
    out: Path | None = OUT,
    options_out: Path | None = typer.Option(None, "--options-out", help="Write the opensm.conf lines here."),
) -> None:
    """OpenSM qos-policy.conf plus the opensm.conf qos_* lines (printed after it unless --options-out).

    Example: gpupool fabric export opensm-qos --class critical=0.8 --class normal=0.2 --out qos-policy.conf
    """
    from gpupool.core.fabric.qos import parse_shares, plan_qos
    from gpupool.exporters.opensm import opensm_qos_options, qos_policy_conf

    with _errors():
        plan = plan_qos(parse_shares(classes))
        mapping: dict[int, str] = {}
        for item in pkey_class:
            key, sep, name = item.partition("=")
            try:
                mapping[int(key, 16)] = name
            except ValueError:
                raise InvalidInput(f"Expected --pkey-class 0x0010=critical, got {item!r}.") from None
            if not sep:
                raise InvalidInput(f"Expected --pkey-class 0x0010=critical, got {item!r}.")
        policy, options = qos_policy_conf(plan, mapping), opensm_qos_options(plan)
        if options_out is None:
            _write(policy + "\n# --- opensm.conf ---\n" + options, out)
        else:
            _write(policy, out)
            _write(options, options_out)


@export_app.command("nccl")
def export_nccl(
    path: Path = FILE_ARG,
    host: str = typer.Option(..., "--host", help="Host whose HCAs NCCL should use."),
    qos_class: str | None = typer.Option(None, "--use-class", help="QoS class to run in (sets NCCL_IB_SL)."),
    classes: list[str] = CLASSES,
    pkey_index: int | None = typer.Option(None, "--pkey-index", help="P_Key table index (NCCL_IB_PKEY)."),
    topo_out: Path | None = typer.Option(None, "--topo-out", help="Also write an NCCL_TOPO_FILE here."),
    gpus: int = typer.Option(8, "--gpus", help="GPUs per host for the topology XML."),
    numa: int = typer.Option(2, "--numa", help="NUMA nodes per host for the topology XML."),
    node_map: Path | None = NODE_MAP,
) -> None:
    """NCCL environment (NCCL_IB_HCA, NCCL_IB_SL, NCCL_IB_PKEY) for a host, as shell exports.

    Example: eval "$(gpupool fabric export nccl fabric.topo --host node01)"
    """
    from gpupool.core.fabric.qos import parse_shares, plan_qos
    from gpupool.exporters.nccl import nccl_env, topo_xml

    with _errors():
        fabric = load_fabric(path, node_map)
        cls = plan_qos(parse_shares(classes)).by_name(qos_class) if qos_class else None
        env = nccl_env(fabric, host, cls, pkey_index)
        if topo_out is not None:
            _write(topo_xml(fabric, host, gpus, numa), topo_out)
            env["NCCL_TOPO_FILE"] = str(topo_out)
        typer.echo("".join(f"export {key}={value}\n" for key, value in env.items()), nl=False)


FORMAT = typer.Option("ibnetdiscover", "--format", help="ibnetdiscover or ibsim (net format).")


def _render(fabric: Fabric, fmt: str) -> str:
    from gpupool.core.fabric.write import to_ibnetdiscover, to_ibsim_net

    if fmt == "ibnetdiscover":
        return to_ibnetdiscover(fabric)
    if fmt == "ibsim":
        return to_ibsim_net(fabric)
    raise InvalidInput(f"--format must be ibnetdiscover or ibsim, got {fmt!r}.")


@generate_app.command("fat-tree")
def generate_fat_tree(
    ports: int = typer.Option(36, "--ports", help="Switch radix k: even, 2 to 254."),
    levels: int = typer.Option(2, "--levels", help="2 or 3."),
    oversubscription: float = typer.Option(1.0, "--oversubscription", help="Leaf down:up ratio."),
    pods: int | None = typer.Option(None, "--pods", help="Leaves (2 levels) or pods (3 levels); default k."),
    speed: str = typer.Option("HDR", "--speed", help="SDR ... NDR, XDR, FDR10."),
    fmt: str = FORMAT,
    out: Path | None = OUT,
) -> None:
    """A k-ary fat tree (one HCA per host).

    Example: gpupool fabric generate fat-tree --ports 8 --levels 2 --out tree.topo
    """
    from gpupool.core.fabric.generate import fat_tree

    with _errors():
        fabric = fat_tree(ports, levels, oversubscription, pods, parse_speed(speed))
        _write(_render(fabric, fmt), out)


@generate_app.command("rail")
def generate_rail(
    nodes: int = typer.Option(..., "--nodes", help="GPU servers."),
    rails: int = typer.Option(8, "--rails", help="HCAs per server, one rail each."),
    ports: int = typer.Option(64, "--ports", help="Switch radix: even, 2 to 254."),
    speed: str = typer.Option("NDR", "--speed", help="Link speed."),
    fmt: str = FORMAT,
    out: Path | None = OUT,
) -> None:
    """A rail-optimised GPU cluster: HCA r of every server on rail r's leaf.

    Example: gpupool fabric generate rail --nodes 16 --rails 8 --out rail.topo
    """
    from gpupool.core.fabric.generate import rail_optimized

    with _errors():
        _write(_render(rail_optimized(nodes, rails, ports, parse_speed(speed)), fmt), out)
