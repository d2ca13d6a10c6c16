"""A seeded share of Philly's jobs in the class `critical`, and the replay's figures per class."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from typer.testing import CliRunner

from gpupool.cli.sim import app
from gpupool.sim.jobs import philly_jobs

FIXTURES = Path(__file__).parents[1] / "fixtures" / "replay"
TINY = FIXTURES / "philly_tiny.csv"


def test_the_critical_share_is_seeded_and_leaves_the_other_draws_alone() -> None:
    plain = philly_jobs(TINY, 8, seed=3)
    marked = philly_jobs(TINY, 8, seed=3, critical_share=0.5)
    assert marked == philly_jobs(TINY, 8, seed=3, critical_share=0.5)
    changed = [(a.workload.priority_class, b.workload.priority_class)
               for a, b in zip(plain, marked, strict=True) if a != b]
    assert changed and all(after == "critical" for _, after in changed)
    assert all(before != "critical" for before, _ in changed)
    everything = philly_jobs(TINY, 8, seed=3, critical_share=1.0)
    assert Counter(j.workload.priority_class for j in everything) == {"critical": len(plain)}


def _replay(tmp_path: Path, *extra: str) -> tuple[int, str, Path]:
    out = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["replay", "--cluster", "2x8xV100M32", "--trace", f"philly:{TINY}",
                                      "--ordering", "priority-fifo", "--preemption", "--no-backfill",
                                      "--seed", "1", "--json", str(out), *extra])
    return result.exit_code, result.output, out


def test_the_replay_reports_each_class(tmp_path: Path) -> None:
    code, output, out = _replay(tmp_path, "--critical-share", "0.5")
    assert code == 0, output
    data = json.loads(out.read_text())
    by_class = data["by_priority_class"]
    assert by_class["critical"]["started"] > 0
    assert sum(c["started"] for c in by_class.values()) == len(philly_jobs(TINY, 8, seed=1))
    assert set(by_class["critical"]["queue_delay_s"]) == {"mean", "p50", "p95", "p99"}
    assert data["config"]["critical_share"] == 0.5


def test_a_bad_critical_share_is_one_sentence(tmp_path: Path) -> None:
    code, output, _ = _replay(tmp_path, "--critical-share", "5")
    assert code == 2 and "--critical-share must be a fraction from 0 to 1" in output
    assert "Traceback" not in output
    config = tmp_path / "pool.yaml"
    config.write_text("priority_classes:\n  - {name: low, value: 0}\n  - {name: high, value: 10}\n")
    code, output, _ = _replay(tmp_path, "--critical-share", "0.1", "--config", str(config))
    assert code == 2 and "which the configuration's priority_classes do not have" in output


def test_the_replay_says_which_setting_wins_as_up_does(tmp_path: Path) -> None:
    config = tmp_path / "pool.yaml"
    config.write_text("preemption: {scope: pool}\npriority_classes:\n  - {name: normal, value: 0, "
                      "preemptible: false}\n  - {name: high, value: 100}\n")
    code, output, _ = _replay(tmp_path, "--config", str(config))
    assert code == 0, output
    assert "Note: preemption.scope is pool, but priority class 'normal' is not preemptible" in output
