"""`sim replay --comm-model`: the communication model's figures in the JSON, its errors in one sentence."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpupool.cli.sim import app
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.write import to_ibnetdiscover

REPLAY = Path(__file__).resolve().parents[1] / "fixtures" / "replay"
runner = CliRunner()


def _args(tmp_path: Path, *extra: str) -> list[str]:
    fabric = tmp_path / "tree.topo"
    fabric.write_text(to_ibnetdiscover(fat_tree(4, levels=3, pods=2)))
    return ["replay", "--cluster", "8x8xV100M32", "--trace", f"philly:{REPLAY / 'philly_tiny.csv'}",
            "--window", "2017-10-01:2017-10-03", "--ordering", "priority-fifo", "--no-preemption",
            "--no-backfill", "--seed", "1", "--json", str(tmp_path / "r.json"),
            "--fabric", str(fabric), *extra]


def test_replay_with_the_default_comm_model(tmp_path: Path) -> None:
    done = runner.invoke(app, _args(tmp_path, "--comm-model", "default"))
    assert done.exit_code == 0, done.output
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["config"]["comm_model"] == "default"
    assert data["gangs_across_failed_links"] == 0
    assert {"cross_leaf_bytes", "cross_spine_bytes", "link_util_max", "link_util_p99"} <= set(data)
    assert sum(data["comm"]["classes"].values()) == data["jobs"]
    assert set(data["by_gang_size"]) == {"1", "2-8", "9-32", ">32"}


def test_comm_model_errors_are_one_sentence(tmp_path: Path) -> None:
    args = _args(tmp_path, "--comm-model", str(tmp_path / "missing.yaml"))
    missing = runner.invoke(app, args)
    assert missing.exit_code == 2 and "does not exist" in missing.output and "Traceback" not in missing.output
    no_fabric = [a for a in _args(tmp_path, "--comm-model", "default")]
    at = no_fabric.index("--fabric")
    del no_fabric[at:at + 2]
    refused = runner.invoke(app, no_fabric)
    assert refused.exit_code == 2 and "give --fabric FILE too" in refused.output
