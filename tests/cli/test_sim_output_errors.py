"""The `gpupool sim` commands: an output that cannot be written is one sentence and exit 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli.sim import app

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
OPENB = ROOT / "openb"


COMMANDS = {
    "fill": ["fill", "--nodes", str(OPENB / "nodes.csv"), "--pods", str(OPENB / "pods.csv"), "--seed", "42"],
    "replay": ["replay", "--cluster", "2x8xV100M32", "--trace", f"philly:{ROOT}/replay/philly_tiny.csv",
               "--window", "2017-10-01:2017-10-03", "--seed", "1"],
}


@pytest.mark.parametrize("command", ["fill", "replay"])
def test_an_unwritable_json_path_is_one_sentence_and_exit_2(tmp_path: Path, command: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = blocker / "out.json"  # its parent is a file: not writable, even as root
    result = CliRunner().invoke(app, [*COMMANDS[command], "--json", str(target)])
    assert result.exit_code == 2, result.output
    assert "cannot write output (" in result.output and str(blocker) in result.output
    assert "Traceback" not in result.output
