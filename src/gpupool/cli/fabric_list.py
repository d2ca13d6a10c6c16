"""`gpupool fabric show FILE --cas / --switches`: the names a newcomer passes to the other verbs."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table

from gpupool.cli.output import console as sized_console
from gpupool.core.fabric.model import Fabric


def _guid(value: int | None) -> str | None:
    return f"0x{value:016x}" if value is not None else None


def ca_rows(fabric: Fabric) -> list[dict[str, Any]]:
    """One row per CA: its name, host, GUID, LID and the leaf switch port it hangs on."""
    from gpupool.exporters.slurm import host_of

    rows = []
    for ca in sorted(fabric.cas, key=lambda c: fabric.nodes[c].label):
        node, leaf = fabric.nodes[ca], fabric.ca_leaf.get(ca)
        rows.append({"name": node.label, "host": host_of(fabric, ca), "guid": _guid(node.guid),
                     "lid": node.lid, "leaf": fabric.nodes[leaf[0]].label if leaf else None,
                     "leaf_port": leaf[1] if leaf else None})
    return rows


def switch_rows(fabric: Fabric) -> list[dict[str, Any]]:
    """One row per switch: its name, fat-tree level, GUID, LID, ports and CAs cabled to it."""
    below = {sw: 0 for sw in fabric.switches}
    for switch, _, _ in fabric.ca_leaf.values():
        below[switch] += 1
    levels = fabric.levels
    ordered = sorted(fabric.switches, key=lambda s: (-levels.get(s, -1), fabric.nodes[s].label))
    return [{"name": fabric.nodes[s].label, "level": levels.get(s), "guid": _guid(fabric.nodes[s].guid),
             "lid": fabric.nodes[s].lid, "ports": fabric.nodes[s].num_ports, "cas": below[s]}
            for s in ordered]


def show_names(fabric: Fabric, *, cas: bool, switches: bool, as_json: bool) -> None:
    payload: dict[str, list[dict[str, Any]]] = {}
    if switches:
        payload["switches"] = switch_rows(fabric)
    if cas:
        payload["cas"] = ca_rows(fabric)
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
        return
    console = sized_console()
    for what, rows in payload.items():
        table = Table(title=f"{len(rows)} {'CAs' if what == 'cas' else 'switches'}")
        for column in rows[0] if rows else ("name",):
            table.add_column(column.upper().replace("_", " "), no_wrap=column in ("name", "guid", "leaf"))
        for row in rows:
            table.add_row(*("-" if v is None else str(v) for v in row.values()))
        console.print(table)
