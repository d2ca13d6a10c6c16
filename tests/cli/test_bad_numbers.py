"""Numbers no command can use (inf, nan, a radix of 0, a month before the epoch or past year 9998)
are refused with one sentence and exit 2 before anything is sent or built; never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cli_inproc import run_cli


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
