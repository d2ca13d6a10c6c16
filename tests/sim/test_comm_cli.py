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


def test_the_configurations_congestion_keys_move_gangs_in_the_replay(tmp_path: Path) -> None:
    # fabric.migrate_on_congestion with congestion_threshold / congestion_for, as `gpupool up` reads
    # them: the replay samples link load and its cycles stop gangs due (kind migrate)
    config = tmp_path / "pool.yaml"
    config.write_text("fabric: {migrate_on_congestion: true, congestion_threshold: 0.01, "
                      "congestion_for: 0s}\n")
    trace = tmp_path / "gangs.csv"  # gangs of three nodes: each crosses leaf uplinks
    trace.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + "".join(
        f"2017-10-01 00:0{i}:00,7200.0,24,172800.0,team{i}\n" for i in range(2)))
    args = _args(tmp_path, "--comm-model", "default")
    args[args.index("--trace") + 1] = f"philly:{trace}"
    done = runner.invoke(app, [*args, "--config", str(config)])
    assert done.exit_code == 0, done.output
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["congestion_samples"] > 0 and data["congestion_moves"] > 0
    plain = runner.invoke(app, args)
    assert plain.exit_code == 0, plain.output
    assert "congestion_moves" not in json.loads((tmp_path / "r.json").read_text())
