"""`sim fill --fabric` and `sim replay --fabric`: the nodes mapped onto a fabric file's hosts, the scheduler
placing by it, and a fabric with too few hosts refused in one sentence."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpupool.cli.sim import app
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.write import to_ibnetdiscover
from gpupool.sim.fill import fill, load_fabric_file
from gpupool.sim.traces.openb import load_openb_nodes, load_openb_pods

OPENB = Path(__file__).resolve().parents[1] / "fixtures" / "openb"
REPLAY = Path(__file__).resolve().parents[1] / "fixtures" / "replay"
runner = CliRunner()


def fabric_file(tmp_path: Path, ports: int = 4, pods: int | None = None) -> Path:
    path = tmp_path / f"tree{ports}.topo"
    path.write_text(to_ibnetdiscover(fat_tree(ports, levels=2, pods=pods)))
    return path


def test_fill_with_a_fabric_gives_the_same_figures(tmp_path: Path) -> None:
    """Fill places single pods, which no topology binds: the figures do not move."""
    nodes, pods = load_openb_nodes(OPENB / "nodes.csv"), load_openb_pods(OPENB / "pods.csv")
    fabric = load_fabric_file(str(fabric_file(tmp_path)))
    for policy in ("fgd-strand", "network-aware"):
        bound = fill(nodes, pods, policy, 42, fabric=fabric)
        assert bound.alloc_pct == fill(nodes, pods, policy, 42).alloc_pct


def test_cli_fill_takes_a_fabric_and_refuses_one_too_small(tmp_path: Path) -> None:
    base = ["fill", "--nodes", str(OPENB / "nodes.csv"), "--pods", str(OPENB / "pods.csv"), "--seed", "42",
            "--policy", "network-aware"]
    done = runner.invoke(app, [*base, "--fabric", str(fabric_file(tmp_path))])
    assert done.exit_code == 0, done.output
    small = runner.invoke(app, [*base, "--fabric", str(fabric_file(tmp_path, ports=2))])  # 1 host
    assert small.exit_code == 2 and "hosts for" in small.output and "Traceback" not in small.output


def test_cli_replay_places_gangs_by_the_fabric(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = ["replay", "--cluster", "8x8xV100M32", "--trace", f"philly:{REPLAY / 'philly_tiny.csv'}",
            "--window", "2017-10-01:2017-10-03", "--policy", "network-aware", "--ordering", "priority-fifo",
            "--no-preemption", "--no-backfill", "--seed", "1",
            "--fabric", str(fabric_file(tmp_path)), "--json", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["finished"] == 6 and data["config"]["fabric"].endswith("tree4.topo")
    missing = runner.invoke(app, [*args[:-4], "--fabric", str(tmp_path / "nope.topo"), "--json", str(out)])
    assert missing.exit_code == 2 and "does not exist" in missing.output
