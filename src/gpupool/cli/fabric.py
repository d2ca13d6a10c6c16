"""`gpupool fabric`: discover, route, inspect and export the InfiniBand fabric from topology files."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from gpupool.cli._common import check_plot_path, reports_errors
from gpupool.core.fabric.model import Fabric, Link
from gpupool.errors import GpupoolError, InvalidInput

app = typer.Typer(
    help="Inspect, route, draw and export an InfiniBand fabric from a topology file (ibnetdiscover "
    "output or an ibsim net file).\n\nExample: gpupool fabric show fabric.topo --cas",
    add_completion=False,
)
export_app = typer.Typer(help="Write Slurm, OpenSM and NCCL configuration from a fabric.\n\n"
                         "Example: gpupool fabric export slurm fabric.topo --out topology.conf")
generate_app = typer.Typer(help="Generate fat-tree and rail-optimised fabrics.\n\n"
                           "Example: gpupool fabric generate fat-tree --ports 8 --out tree.topo")
app.add_typer(export_app, name="export")
app.add_typer(generate_app, name="generate")

FILE_ARG = typer.Argument(..., help="ibnetdiscover output or ibsim net file.")
NODE_MAP = typer.Option(None, "--node-map", help="node-name-map file: <guid> \"<name>\" per line.")
ROOTS = typer.Option(None, "--roots", help="File listing root switches (one id per line), as "
                     "OpenSM's root_guid_file; default: the switches farthest from the CAs.")
JSON = typer.Option(False, "--json", help="Print JSON instead of tables.")


@contextmanager
def _errors() -> Iterator[None]:
    """Turn gpupool errors and unreadable files into one line on stderr and an exit code."""
    try:
        yield
    except GpupoolError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    except FileNotFoundError as exc:
        print(f"Error: no such file: {exc.filename}; check the path.", file=sys.stderr)
        raise typer.Exit(2) from None
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        print(f"Error: cannot read or write {exc.filename}: {reason}; check the path.", file=sys.stderr)
        raise typer.Exit(2) from None


def _read(path: Path) -> str:
    return path.read_text(errors="replace")


def load_fabric(path: Path, node_map: Path | None = None) -> Fabric:
    from gpupool.core.fabric.parse import parse_node_name_map, parse_topology

    names = parse_node_name_map(_read(node_map), str(node_map)) if node_map else None
    return parse_topology(_read(path), source=str(path), node_names=names)


def _ids(fabric: Fabric, path: Path | None) -> list[str] | None:
    if path is None:
        return None
    refs = [ln.split("#", 1)[0].strip() for ln in _read(path).splitlines()]
    return [fabric.find(ref) for ref in refs if ref]


def _link_json(fabric: Fabric, link: Link) -> dict[str, Any]:
    return {
        "a": fabric.nodes[link.a].label, "a_port": link.a_port,
        "b": fabric.nodes[link.b].label, "b_port": link.b_port,
        "width_speed": link.width_speed, "rate_gbps": link.rate_gbps,
        "data_rate_gbps": round(link.data_rate_gbps, 3),
    }


def _emit(as_json: bool, payload: dict[str, Any], render: Callable[[Console], None]) -> None:
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
    else:
        from gpupool.cli.output import console

        render(console())


@app.command()
def show(
    path: Path = FILE_ARG,
    as_json: bool = JSON,
    node_map: Path | None = NODE_MAP,
    cas: bool = typer.Option(False, "--cas", help="List the CAs (hosts' adapters) by name."),
    switches: bool = typer.Option(False, "--switches", help="List the switches by name."),
) -> None:
    """Summarise a fabric: switches, CAs, links, fat-tree levels and degraded links.

    --cas and --switches list the names that `fabric route` and `fabric fail-link` take.

    Example: gpupool fabric show fabric.topo --cas
    """
    with _errors():
        fabric = load_fabric(path, node_map)
        if cas or switches:
            from gpupool.cli.fabric_list import show_names

            show_names(fabric, cas=cas, switches=switches, as_json=as_json)
            return
        levels: dict[int, list[str]] = {}
        for switch, level in sorted(fabric.levels.items()):
            levels.setdefault(level, []).append(fabric.nodes[switch].label)
        norm = fabric.norm
        payload = {
            "switches": len(fabric.switches),
            "cas": len(fabric.cas),
            "links": len(fabric.links),
            "levels": {str(k): v for k, v in sorted(levels.items())},
            "roots": [fabric.nodes[r].label for r in fabric.roots],
            "norm": f"{norm[0]}x{norm[1].value}" if norm else None,
            "degraded_links": [_link_json(fabric, link) for link in fabric.degraded_links],
        }

        def render(console: Console) -> None:
            table = Table(title=f"Fabric {path.name}")
            table.add_column("what")
            table.add_column("value", justify="right")
            for key in ("switches", "cas", "links", "norm"):
                table.add_row(key, str(payload[key]))
            for level, names in sorted(levels.items()):
                table.add_row(f"level {level} switches", str(len(names)))
            table.add_row("degraded links", str(len(fabric.degraded_links)))
            console.print(table)
            if fabric.degraded_links:
                bad = Table(title="Degraded links (below the fabric's norm)")
                for column in ("a", "port", "b", "port", "link"):
                    bad.add_column(column)
                for link in fabric.degraded_links[:50]:
                    bad.add_row(fabric.nodes[link.a].label, str(link.a_port),
                                fabric.nodes[link.b].label, str(link.b_port), link.width_speed)
                console.print(bad)

        _emit(as_json, payload, render)


@app.command("route")
def route_cmd(
    path: Path = FILE_ARG,
    src: str = typer.Argument(..., help="Source CA: id, name, host, GUID or LID."),
    dst: str = typer.Argument(..., help="Destination CA."),
    as_json: bool = JSON,
    node_map: Path | None = NODE_MAP,
    roots: Path | None = ROOTS,
) -> None:
    """Show the up*/down* minimum-hop routes (ECMP) between two CAs, with bandwidth and latency.

    Example: gpupool fabric route fabric.topo node01 node17
    """
    from gpupool.core.fabric.paths import route

    with _errors():
        fabric = load_fabric(path, node_map)
        a, b = _find_ca(fabric, src), _find_ca(fabric, dst)
        if a == b:
            raise InvalidInput(f"{src} and {dst} are the same CA; give two different CAs to route between.")
        found = route(fabric, a, b, roots=_ids(fabric, roots))
        if not found.reachable:
            raise InvalidInput(f"{src} cannot reach {dst}: no up*/down* path exists.")
        best = found.best
        assert best is not None
        payload = {
            "src": fabric.nodes[a].label, "dst": fabric.nodes[b].label,
            "hops": found.hops, "ecmp_paths": found.ecmp_paths,
            "bottleneck_gbps": round(found.bottleneck_gbps, 3),
            "latency_ns": best.latency_ns(),
            "path": [fabric.nodes[s].label for s in best.switches],
            "paths_listed": len(found.paths),
        }

        def render(console: Console) -> None:
            console.print(f"{payload['src']} -> {payload['dst']}: {found.hops} hops, "
                          f"{found.ecmp_paths} equal-cost paths, bottleneck "
                          f"{found.bottleneck_gbps:.1f} Gb/s, latency {best.latency_ns():.0f} ns")
            table = Table(title="Best path")
            table.add_column("hop")
            table.add_column("switch")
            table.add_column("level", justify="right")
            for i, switch in enumerate(best.switches, start=1):
                table.add_row(str(i), fabric.nodes[switch].label, str(fabric.levels.get(switch, "-")))
            console.print(table)

        _emit(as_json, payload, render)


def _find_ca(fabric: Fabric, ref: str) -> str:
    from gpupool.exporters.slurm import host_of

    hosts = [ca for ca in fabric.cas if host_of(fabric, ca) == ref]
    node = hosts[0] if hosts else fabric.find(ref)
    if fabric.is_switch(node):
        raise InvalidInput(f"{ref} is a switch; give a CA (host channel adapter) instead.")
    return node


@app.command()
def tables(
    path: Path = FILE_ARG,
    as_json: bool = JSON,
    roots: Path | None = ROOTS,
    out: Path | None = typer.Option(None, "--out", "-o", help="Also write every switch's table."),
) -> None:
    """Compute the up*/down* forwarding tables: every switch's output port toward every CA.

    Example: gpupool fabric tables fabric.topo --out tables.txt
    """
    from gpupool.core.fabric.forwarding import NO_ROUTE, compute_tables

    with _errors():
        fabric = load_fabric(path)
        root_ids = _ids(fabric, roots)
        started = time.perf_counter()
        result = compute_tables(fabric, roots=root_ids)
        wall_s = time.perf_counter() - started
        unreachable = int((result.ports == NO_ROUTE).sum())
        payload = {
            "switches": len(result.arrays.switches), "cas": len(result.cas),
            "entries": result.entries, "unreachable_entries": unreachable,
            "roots": [fabric.nodes[r].label for r in result.arrays.roots],
            "wall_s": round(wall_s, 4),
        }
        if out is not None:
            _write_tables(out, fabric, result)

        def render(console: Console) -> None:
            table = Table(title="Up*/down* forwarding tables")
            table.add_column("what")
            table.add_column("value", justify="right")
            for key in ("switches", "cas", "entries", "unreachable_entries", "wall_s"):
                table.add_row(key, str(payload[key]))
            console.print(table)

        _emit(as_json, payload, render)


def _write_tables(out: Path, fabric: Fabric, result: Any) -> None:
    lines = []
    for s, switch in enumerate(result.arrays.switches):
        lines.append(f"Switch {fabric.nodes[switch].label}")
        for c, ca in enumerate(result.cas):
            lines.append(f"  {fabric.nodes[ca].label} {int(result.ports[s, c])}")
    out.write_text("\n".join(lines) + "\n")


@app.command("fail-link")
def fail_link_cmd(
    first: str = typer.Argument(..., metavar="LINK|FILE", help=(
        "NODE:PORT of a cable of the running pool's fabric, failed there (admin); or a topology file, "
        "to see what failing its cable LINK would do.")),
    where: str | None = typer.Argument(None, metavar="[LINK]", help="With a FILE: NODE:PORT of its cable."),
    as_json: bool = JSON,
    roots: Path | None = ROOTS,
) -> None:
    """Fail one cable: on the running pool (LINK alone; gangs cut off are requeued, slowed ones told),
    or in a topology file (FILE LINK): recompute routes and list the CA pairs that lose
    connectivity or bandwidth.

    Example: gpupool fabric fail-link leaf-3:13

    Example: gpupool fabric fail-link fabric.topo S-0008f10500108bba:13
    """
    if where is None:
        from gpupool.cli.fabric_live import change_link

        reports_errors(change_link)(first, failed=True, as_json=as_json)
        return
    from gpupool.core.fabric.analysis import fail_link

    path = Path(first)
    with _errors():
        fabric = load_fabric(path)
        node_ref, sep, port_text = where.rpartition(":")
        if not sep or not port_text.isdigit():
            raise InvalidInput(f"Expected NODE:PORT such as S-0008f10500108bba:13, got {where!r}.")
        link = fabric.find_link(fabric.find(node_ref), int(port_text))
        impact = fail_link(fabric, link, roots=_ids(fabric, roots))
        label = fabric.nodes
        degraded = [
            {"a": label[a].label, "b": label[b].label, "paths_before": p0, "paths_after": p1}
            for a, b, p0, p1 in impact.degraded_sample
        ]
        payload = {
            "link": _link_json(fabric, link),
            "lost_pairs": impact.lost_pairs, "degraded_pairs": impact.degraded_pairs,
            "lost_sample": [[label[a].label, label[b].label] for a, b in impact.lost_sample],
            "degraded_sample": degraded,
        }

        def render(console: Console) -> None:
            console.print(f"Failing {label[link.a].label}[{link.a_port}] <-> "
                          f"{label[link.b].label}[{link.b_port}] ({link.width_speed}): "
                          f"{impact.lost_pairs} CA pairs lose connectivity, "
                          f"{impact.degraded_pairs} lose bandwidth (fewer or longer paths).")
            for row in degraded[:10]:
                console.print(f"  {row['a']} <-> {row['b']} (and their leaves): "
                              f"{row['paths_before']} -> {row['paths_after']} paths")

        _emit(as_json, payload, render)


@app.command()
def draw(
    path: Path = FILE_ARG,
    out: Path = typer.Option(Path("topo.png"), "--out", "-o", help="The picture: PNG, or SVG, PDF, EPS "
                             "or JPEG by the name's suffix."),
    node_map: Path | None = NODE_MAP,
) -> None:
    """Draw the fabric (PNG, or SVG, PDF, EPS or JPEG by the name): levels as rows, named switches and
    hosts, a legend.

    Up to 64 hosts are named; above that each leaf switch shows how many hosts hang below it.
    Degraded links are dashed red.

    Example: gpupool fabric draw fabric.topo --out fabric.svg
    """
    from gpupool.exporters.draw import draw_fabric

    with _errors():
        check_plot_path(out, "--out")
        fabric = load_fabric(path, node_map)
        draw_fabric(fabric, out, title=path.name)
        typer.echo(f"Wrote {out}")


from gpupool.cli import fabric_export as _fabric_export  # noqa: E402,F401  (registers sub-commands)
from gpupool.cli import fabric_live as _fabric_live  # noqa: E402,F401  (the running pool's fabric)
