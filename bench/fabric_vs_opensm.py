"""Benchmark: gpupool's up*/down* forwarding tables beside OpenSM's updn on the same ibsim fabrics.

For each 3-level fat tree of 36-port switches (1,296 / 5,184 / 11,664 hosts by default) it writes
the fabric in ibnetdiscover and ibsim net formats, starts ibsim, runs OpenSM once with -R updn and
reads its routing time from its own log, then times gpupool computing the equivalent tables (every
switch's output port toward every CA). It checks that sampled gpupool routes are minimum-hop under
up*/down* rules, compares hop counts with the paths OpenSM programmed (ibtracert) on fabrics up to
1,296 hosts, times parsing the largest fabric's ibnetdiscover output, and times
`gpupool fabric show` on the PSMN file.

Then one leaf-spine (leaf-to-aggregation) link fails: gpupool updates the affected forwarding
entries incrementally (core/fabric/reroute.py; median of 3, tables checked equal to a full
recomputation on the fabric without the link), beside OpenSM re-routing the same fabric after the
same `Unlink` typed into the ibsim console (updn has no incremental mode: its routing time is that
of a full re-route, read from its log as above).

    .venv/bin/python bench/fabric_vs_opensm.py [--pods 4,16,36] [--json PATH] [--skip-opensm]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from gpupool.agent.probes.ibtools import IbSim, find_tool, ibtracert_hops, missing_tools
from gpupool.core.fabric.forwarding import ForwardingTables, compute_tables, is_up_down, walk
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.model import Fabric, Link
from gpupool.core.fabric.parse import parse_topology
from gpupool.core.fabric.reroute import reroute_after_failure
from gpupool.core.fabric.updown import SwitchArrays
from gpupool.core.fabric.write import to_ibnetdiscover, to_ibsim_net
from gpupool.sim.datadir import data_dir

REPO = Path(__file__).resolve().parents[1]
console = Console()


class ConsoleIbSim(IbSim):
    """ibsim with its console on a pipe (no -n), so the bench can type `Unlink` into it."""

    def start(self) -> ConsoleIbSim:
        ibsim = find_tool("ibsim")
        if ibsim is None:
            raise SystemExit("ibsim is not installed; run scripts/ib-deps.sh.")
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "opensm-cache").mkdir(exist_ok=True)
        cmd = [ibsim, "-s", "-N", str(self.max_nodes), "-S", str(self.max_switches),
               "-P", str(self.max_ports), str(self.netfile)]
        env = dict(os.environ, IBSIM_SOCKNAME=self.socket_name)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(cmd, cwd=self.workdir, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.PIPE)
        self._wait_ready()
        return self

    def __enter__(self) -> ConsoleIbSim:
        return self.start()

    def console(self, line: str, timeout_s: float = 60.0) -> None:
        """Type one console command and wait for the next prompt (the command has been applied)."""
        assert self.process is not None and self.process.stdin is not None
        prompts = self.log_path.read_text(errors="replace").count("sim>")
        self.process.stdin.write((line + "\n").encode())
        self.process.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while self.log_path.read_text(errors="replace").count("sim>") <= prompts:
            if time.monotonic() > deadline:
                raise SystemExit(f"ibsim did not answer {line!r} within {timeout_s:.0f} s.")
            time.sleep(0.05)


def leaf_uplink(fabric: Fabric, rng: random.Random) -> Link:
    """A random healthy link between a leaf and the switch level above it."""
    levels = fabric.levels
    links = [lk for lk in fabric.links if fabric.is_switch(lk.a) and fabric.is_switch(lk.b)
             and sorted((levels[lk.a], levels[lk.b])) == [0, 1]]
    return rng.choice(links)


def time_reroute(fabric: Fabric, tables: ForwardingTables, link: Link) -> dict[str, Any]:
    """gpupool's incremental update after `link` fails (median of 3), checked against a full run."""
    _ = (fabric.levels, fabric.links_by_node)  # cached structure, as in a long-lived view
    runs, update = [], None
    for _ in range(3):
        started = time.perf_counter()
        update = reroute_after_failure(fabric, tables, link)
        runs.append(time.perf_counter() - started)
    assert update is not None
    started = time.perf_counter()
    full = compute_tables(fabric.without_links([link]))
    full_s = time.perf_counter() - started
    equal = np.array_equal(update.tables.ports, full.ports) and np.array_equal(update.tables.hops, full.hops)
    return {"failed_link": f"{fabric.nodes[link.a].label}[{link.a_port}] - {fabric.nodes[link.b].label}"
                           f"[{link.b_port}]",
            "gpupool_update_ms": round(1000 * sorted(runs)[1], 2), "gpupool_full_after_s": round(full_s, 3),
            "update_incremental": update.incremental, "entries_changed": update.changed_entries,
            "update_equals_full": equal, "_tables": update.tables}


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
    row["gpupool_tables_s"] = round(sorted(runs)[1], 4)  # median of 3
    row["gpupool_tables_first_s"] = round(runs[0], 3)
    row["entries"] = tables.entries
    console.print(f"  gpupool tables: {row['gpupool_tables_s']} s for {tables.entries:,} entries")
    rng = random.Random(pods)
    pairs = [tuple(rng.sample(parsed.cas, 2)) for _ in range(args.pairs)]
    row["min_hop_ok"] = f"{check_min_hop(parsed, tables, pairs)}/{len(pairs)}"  # type: ignore[arg-type]
    console.print(f"  up*/down* minimum-hop check: {row['min_hop_ok']}")
    link = leaf_uplink(parsed, random.Random(1000 + pods))
    reroute = time_reroute(parsed, tables, link)
    after = reroute.pop("_tables")
    row.update(reroute)
    console.print(f"  link {row['failed_link']} fails: gpupool update {row['gpupool_update_ms']} ms "
                  f"({row['entries_changed']:,} entries changed), equal to a full recomputation: "
                  f"{row['update_equals_full']}")
    if args.skip_opensm:
        return row
    sim_dir = workdir / f"sim-{pods}"
    nodes = hosts + switches
    with ConsoleIbSim(topo, sim_dir, max_nodes=nodes + 64, max_switches=switches + 16,
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
        if pods == max(args.pods) and not args.skip_discover:
            row.update(parse_discovered(sim, workdir / f"discovered-{pods}.topo"))
        sim.console(f'Unlink "{link.a}"[{link.a_port}]')
        console.print("  Unlink typed into ibsim; OpenSM re-routes the fabric ...")
        again = sim.opensm_once(routing="updn", timeout_s=1800)
        row["opensm_reroute_s"] = round(again.routing_s, 3) if again.routing_s is not None else None
        row["opensm_reroute_subnet_up"] = again.subnet_up
        if again.routing_s:
            row["reroute_speedup"] = round(1000 * again.routing_s / row["gpupool_update_ms"], 1)
        console.print(f"  OpenSM re-route after Unlink: {row['opensm_reroute_s']} s")
        if hosts <= args.trace_max_hosts:
            row["ibtracert_agree_after"] = f"{trace_agreement(sim, parsed, after, pairs)}/{len(pairs)}"  # type: ignore[arg-type]
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
    parser.add_argument("--skip-discover", action="store_true",
                        help="skip timing the parse of ibnetdiscover on the largest fabric")
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
    failure = Table(title="One leaf-spine link fails: gpupool's incremental update vs OpenSM's re-route")
    failure_columns = ["hosts", "opensm_reroute_s", "gpupool_update_ms", "reroute_speedup",
                       "entries_changed", "update_equals_full", "ibtracert_agree_after"]
    for view, names in ((table, columns), (failure, failure_columns)):
        for column in names:
            view.add_column(column, justify="right")
        for row in rows:
            view.add_row(*(str(row.get(column, "-")) for column in names))
        console.print(view)
    console.print(f"gpupool fabric show on the PSMN file: {show['show_psmn_s']} s (best of 3 CLI runs, "
                  f"with interpreter start-up); parse + levels in-process {show['show_psmn_in_process_s']} s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"fabrics": rows, **show}, indent=2))
    console.print(f"Wrote {args.json}")


if __name__ == "__main__":
    main()
