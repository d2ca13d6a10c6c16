"""bench/side_by_side.py --args-a/--args-b runs this checkout on both sides, each side's own
arguments added to the benchmark's; bench/_control_plane.submit_to_running_s reads each started
workload's submission-to-start time from the store."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from _control_plane import RunningServer, submit_to_running_s  # noqa: E402

ECHO = """
import json, sys
args = sys.argv[1:]
out = args[args.index("--json") + 1]
mode = args[args.index("--mode") + 1] if "--mode" in args else "none"
json.dump({"args": args, "figure": {"none": 1.0, "fast": 3.0, "slow": 2.0}[mode]}, open(out, "w"))
"""


def test_each_side_gets_its_own_arguments_and_the_ratio_is_b_over_a(tmp_path: Path) -> None:
    script = tmp_path / "echo_bench.py"
    script.write_text(ECHO)
    out = tmp_path / "out.json"
    argv = [sys.executable, str(ROOT / "bench" / "side_by_side.py"), "--args-a", "--mode slow", "--args-b",
            "--mode fast", "--rounds", "2", "--metric", "figure", "--json", str(out), "--", str(script),
            "--common", "x"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["figures"]["figure"] == {"a": [2.0, 2.0], "b": [3.0, 3.0]}
    assert result["ratios"]["figure"] == 1.5
    assert result["sides"] == {"a": ["--mode", "slow"], "b": ["--mode", "fast"]}
    for side, mode in (("a", "slow"), ("b", "fast")):
        args = result["results"][side][0]["args"]
        assert args[:4] == ["--common", "x", "--mode", mode]


def test_two_ways_of_comparing_at_once_are_refused_with_what_to_give(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "side_by_side.py"), "--ref", "HEAD",
                           "--args-b", "--mode fast", "--", "bench/jobs_e2e.py"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "one of the three" in done.stderr and "Traceback" not in done.stderr


def test_submit_to_running_is_read_for_the_started_workloads_only(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "gpupool.sqlite") as db:
        db.execute("CREATE TABLE workloads (id TEXT, submit_s REAL, started_s REAL)")
        db.executemany("INSERT INTO workloads VALUES (?, ?, ?)",
                       [("w1", 100.0, 100.5), ("w2", 100.0, 102.0), ("w3", 101.0, None)])
    server = RunningServer(url="", token="", data_dir=tmp_path, pid=0)
    assert sorted(submit_to_running_s(server)) == [0.5, 2.0]
