"""Benchmark: gpupool's up*/down* forwarding tables beside OpenSM's updn on the same ibsim fabrics.

For each 3-level fat tree of 36-port switches (1,296 / 5,184 / 11,664 hosts by default) it writes
the fabric in ibnetdiscover and ibsim net formats, starts ibsim, runs OpenSM once with -R updn and
reads its routing time from its own log, then times gpupool computing the equivalent tables (every
switch's output port toward every CA). It checks that sampled gpupool routes are minimum-hop under
up*/down* rules, compares hop counts with the paths OpenSM programmed (ibtracert) on fabrics up to
1,296 hosts, times parsing the largest fabric's ibnetdiscover output, and times
`gpupool fabric show` on the PSMN file.

    .venv/bin/python bench/fabric_vs_opensm.py [--pods 4,16,36] [--json PATH] [--skip-opensm]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpupool.agent.probes.ibtools import IbSim, ibtracert_hops, missing_tools
from gpupool.core.fabric.forwarding import ForwardingTables, compute_tables, is_up_down, walk
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.model import Fabric
from gpupool.core.fabric.parse import parse_topology
from gpupool.core.fabric.updown import SwitchArrays
from gpupool.core.fabric.write import to_ibnetdiscover, to_ibsim_net
from gpupool.sim.datadir import data_dir

REPO = Path(__file__).resolve().parents[1]
console = Console()


def brute_force_hops(adjacency: list[list[tuple[int, bool]]], start: int, goal: int) -> int:
    """Shortest legal up*/down* switch path by BFS over (switch, has-gone-down) states."""
    seen = {(start, False)}
    queue = deque([(start, False, 0)])
    while queue:
        node, down, hops = queue.popleft()
        if node == goal:
            return hops
        for nxt, up in adjacency[node]:
            if up and down:
                continue
            state = (nxt, down or not up)
            if state not in seen:
                seen.add(state)
                queue.append((nxt, state[1], hops + 1))
    return -1


def check_min_hop(fabric: Fabric, tables: ForwardingTables, pairs: list[tuple[str, str]]) -> int:
    """How many sampled routes are legal up*/down* and as short as brute force finds."""
    arrays: SwitchArrays = tables.arrays
    adjacency: list[list[tuple[int, bool]]] = [[] for _ in arrays.switches]
    for s, d, up in zip(arrays.src.tolist(), arrays.dst.tolist(), arrays.up.tolist(), strict=True):
        adjacency[s].append((d, up))
    good = 0
    for a, b in pairs:
        steps = walk(fabric, tables, a, b)
        switches = [s for s, _ in steps]
        leaf_a = arrays.index[fabric.ca_leaf[a][0]]
        leaf_b = arrays.index[fabric.ca_leaf[b][0]]
        if steps and is_up_down(arrays, switches) and len(switches) - 1 == brute_force_hops(
            adjacency, leaf_a, leaf_b
        ):
            good += 1
    return good


def trace_agreement(
    sim: IbSim, fabric: Fabric, tables: ForwardingTables, pairs: list[tuple[str, str]]
) -> int:
    done = sim.run(["ibnetdiscover"], timeout_s=600)
    found = parse_topology(done.stdout, source="ibnetdiscover")
    agree = 0
    for i, (a, b) in enumerate(pairs):
        trace = sim.run(["ibtracert", str(found.port_lids[(a, 1)]), str(found.port_lids[(b, 1)])])
        ours = tables.ca_hops(tables.cas.index(a), tables.cas.index(b))
        agree += int(trace.returncode == 0 and ibtracert_hops(trace.stdout) == ours)
        if (i + 1) % 50 == 0:
            console.print(f"    ibtracert {i + 1}/{len(pairs)}: {agree} agree")
    return agree


def run_size(pods: int, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    fabric = fat_tree(36, 3, pods=pods)
    hosts, switches = len(fabric.cas), len(fabric.switches)
    console.print(f"[bold]{hosts} hosts[/bold] ({switches} switches, {len(fabric.links)} links)")
    topo, net = workdir / f"fat36-{pods}.topo", workdir / f"fat36-{pods}.net"
    topo.write_text(to_ibnetdiscover(fabric))
    net.write_text(to_ibsim_net(fabric))
    row: dict[str, Any] = {"hosts": hosts, "switches": switches, "links": len(fabric.links),
                           "topo_mb": round(topo.stat().st_size / 1e6, 2)}
    started = time.perf_counter()
    parsed = parse_topology(topo.read_text(), source=topo.name)
    row["parse_written_s"] = round(time.perf_counter() - started, 3)
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        tables = compute_tables(parsed)
        runs.append(time.perf_counter() - started)
    row["gpupool_tables_s"] = round(sorted(runs)[1], 3)  # median of 3
    row["gpupool_tables_first_s"] = round(runs[0], 3)
    row["entries"] = tables.entries
    console.print(f"  gpupool tables: {row['gpupool_tables_s']} s for {tables.entries:,} entries")
    rng = random.Random(pods)
    pairs = [tuple(rng.sample(parsed.cas, 2)) for _ in range(args.pairs)]
    row["min_hop_ok"] = f"{check_min_hop(parsed, tables, pairs)}/{len(pairs)}"  # type: ignore[arg-type]
    console.print(f"  up*/down* minimum-hop check: {row['min_hop_ok']}")
    if args.skip_opensm:
        return row
    sim_dir = workdir / f"sim-{pods}"
    nodes = hosts + switches
    with IbSim(topo, sim_dir, max_nodes=nodes + 64, max_switches=switches + 16,
               max_ports=4 * (hosts * 2 + switches * 37), ready_timeout_s=900) as sim:
        console.print("  ibsim ready; running OpenSM -R updn once (may take minutes) ...")
        osm = sim.opensm_once(routing="updn", timeout_s=1800)
        row["opensm_updn_s"] = round(osm.routing_s, 3) if osm.routing_s is not None else None
        row["opensm_wall_s"] = round(osm.wall_s, 1)
        row["opensm_subnet_up"] = osm.subnet_up
        if osm.routing_s:
            row["speedup"] = round(osm.routing_s / row["gpupool_tables_s"], 1)
        console.print(f"  OpenSM updn routing: {row['opensm_updn_s']} s (wall {row['opensm_wall_s']} s)")
        if hosts <= args.trace_max_hosts:
            row["ibtracert_agree"] = f"{trace_agreement(sim, parsed, tables, pairs)}/{len(pairs)}"  # type: ignore[arg-type]
        if pods == max(args.pods):
            row.update(parse_discovered(sim, workdir / f"discovered-{pods}.topo"))
    return row


def parse_discovered(sim: IbSim, out: Path) -> dict[str, Any]:
    console.print("  ibnetdiscover on the largest fabric ...")
    done = sim.run(["ibnetdiscover"], timeout_s=1800)
    out.write_text(done.stdout)
    started = time.perf_counter()
    fabric = parse_topology(done.stdout, source=out.name)
    elapsed = time.perf_counter() - started
    console.print(f"  parsed {out.stat().st_size / 1e6:.1f} MB in {elapsed:.2f} s")
    return {"discovered_mb": round(out.stat().st_size / 1e6, 2), "parse_discovered_s": round(elapsed, 3),
            "discovered_cas": len(fabric.cas)}


def time_show() -> dict[str, Any]:
    root = data_dir()
    psmn = (root / "infiniband" / "psmn-X5-fattree.topofile") if root else None
    if psmn is None or not psmn.exists():
        psmn = REPO / "tests" / "fixtures" / "infiniband" / "psmn-X5-fattree.topofile"
    gpupool = Path(sys.executable).with_name("gpupool")
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([str(gpupool), "fabric", "show", str(psmn), "--json"], check=True,
                       capture_output=True)
        best = min(best, time.perf_counter() - started)
    started = time.perf_counter()
    fabric = parse_topology(psmn.read_text(), source=psmn.name)
    _ = (fabric.levels, fabric.degraded_links, fabric.roots)
    in_process = time.perf_counter() - started
    return {"show_psmn_s": round(best, 3), "show_psmn_in_process_s": round(in_process, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", default="4,16,36", help="pods of the k=36 3-level fat tree (comma list)")
    parser.add_argument("--pairs", type=int, default=200, help="CA pairs to check per fabric")
    parser.add_argument("--trace-max-hosts", type=int, default=1296, help="ibtracert up to this size")
    parser.add_argument("--skip-opensm", action="store_true", help="time gpupool only")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "fabric_vs_opensm.json")
    args = parser.parse_args()
    args.pods = [int(p) for p in args.pods.split(",")]
    missing = missing_tools()
    if missing and not args.skip_opensm:
        console.print(f"[red]Missing {', '.join(missing)}; run scripts/ib-deps.sh or pass --skip-opensm.")
        raise SystemExit(2)
    compute_tables(fat_tree(8, 3))  # warm numpy up once, as OpenSM's figure excludes its start-up
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-fabric-") as tmp:
        for pods in args.pods:
            rows.append(run_size(pods, Path(tmp), args))
    show = time_show()
    table = Table(title="Up*/down* forwarding tables: gpupool vs OpenSM 3.3 updn (same ibsim fabric)")
    columns = ["hosts", "switches", "opensm_updn_s", "gpupool_tables_s", "speedup", "min_hop_ok",
               "ibtracert_agree", "parse_discovered_s"]
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*(str(row.get(column, "-")) for column in columns))
    console.print(table)
    console.print(f"gpupool fabric show on the PSMN file: {show['show_psmn_s']} s (best of 3 CLI runs, "
                  f"with interpreter start-up); parse + levels in-process {show['show_psmn_in_process_s']} s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"fabrics": rows, **show}, indent=2))
    console.print(f"Wrote {args.json}")


if __name__ == "__main__":
    main()
