"""Numbers no command can use (inf, nan, a radix of 0, a month before the epoch or past year 9998)
are refused with one sentence and exit 2 before anything is sent, built or simulated; never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cli_inproc import run_cli
from serving_factories import write_profile, write_trace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize(("args", "said"), [
    (["fabric", "generate", "fat-tree", "--ports", "8", "--oversubscription", "nan"],
     "Oversubscription is down:up and must be 1.0 to 8 (the radix), got nan"),
    (["fabric", "generate", "fat-tree", "--ports", "8", "--oversubscription", "inf"], "got inf"),
    (["fabric", "generate", "rail", "--nodes", "4", "--ports", "0"], "an even switch radix of at least 2"),
    (["fabric", "generate", "rail", "--nodes", "4", "--ports", "1"], "got 1."),
    (["invoice", "--tenant", "alice", "--month", "0000-01"], "a month from 1970-01 to 9998-12, got"),
    (["invoice", "--tenant", "alice", "--month", "9999-12"], "got '9999-12'"),
    (["tenant", "set", "alice", "--budget", "inf"], "not finite (inf or nan), which JSON cannot carry"),
], ids=["oversub-nan", "oversub-inf", "rail-radix-0", "rail-radix-1", "month-0", "month-9999", "budget-inf"])
def test_a_number_no_command_can_use_is_one_sentence(args: list[str], said: str, tmp_path: Path) -> None:
    env = {**os.environ, "GPUPOOL_URL": "http://127.0.0.1:9", "GPUPOOL_TOKEN": "gp_x", "COLUMNS": "200"}
    done = run_cli([*args, *(["--out", str(tmp_path / "f.topo")] if args[0] == "fabric" else [])], env)
    assert done.returncode == 2 and said in done.stderr, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("args", "said"), [
    (["serve", "--rate-scale", "nan"], "--rate-scale takes finite multipliers above 0 (1: the trace's own "
                                       "rate), got nan."),
    (["serve", "--rate-scale", "1,inf"], "--rate-scale takes finite multipliers above 0"),
    (["serve", "--seeds", "nan"], "--seeds takes whole numbers separated by commas (e.g. 0,1,2), got 'nan'."),
    (["serve", "--limit-s", "nan"], "--limit-s takes a finite number of seconds above 0, got nan."),
    (["colocate", "--cold-start", "nan"], "--cold-start takes a finite number of seconds >= 0, got nan."),
    (["colocate", "--cold-start", "inf"], "--cold-start takes a finite number of seconds >= 0, got inf."),
    (["colocate", "--grace", "nan"], "--grace takes a finite number of seconds >= 0, got nan."),
    (["colocate", "--days", "inf"], "--days must be a finite number above 0, not inf."),
    (["colocate", "--azure-target", "inf"], "--azure-target is requests in flight a replica, finite and"),
], ids=["rate-scale-nan", "rate-scale-inf", "seeds-nan", "limit-s-nan", "cold-start-nan", "cold-start-inf",
        "grace-nan", "days-inf", "azure-target-inf"])
def test_a_simulator_number_it_cannot_use_is_one_sentence(args: list[str], said: str, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    if args[0] == "serve":
        trace = write_trace(tmp_path / "conv.csv", [(0.5 * i, 300, 5) for i in range(8)])
        inputs = ["--trace", f"azure-conv:{trace}", "--profiles", str(write_profile(tmp_path / "perf.csv")),
                  "--cluster", "2x8xH100"]
    else:
        inputs = ["--services", str(FIXTURES / "colocation" / "alibaba_tiny.csv"), "--batch",
                  str(FIXTURES / "replay" / "philly_tiny.csv"), "--cluster", "4x8xA100-80GB", "--variants",
                  "colocated"]
    done = run_cli(["sim", args[0], *inputs, *args[1:], "--json", str(out)], {**os.environ, "COLUMNS": "200"})
    assert done.returncode == 2 and said in done.stderr, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists()  # refused before the simulation
