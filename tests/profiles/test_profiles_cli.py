"""`gpupool profiles` lists every profile as a table or JSON and reports bad files in one sentence."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpupool.cli.main import app

runner = CliRunner()


def test_profiles_table_lists_models() -> None:
    result = runner.invoke(app, ["profiles"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for model in ("H100-SXM-80GB", "V100M32", "Ascend910B", "G2"):
        assert model in result.output


def test_profiles_json() -> None:
    result = runner.invoke(app, ["profiles", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    by_model = {r["model"]: r for r in rows}
    assert by_model["T4"]["memory_mib"] == 16384
    assert by_model["Z100"]["kind"] == "dcu"


def test_bad_profile_dir_exits_2_with_one_sentence(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("model: X\n")
    result = runner.invoke(app, ["profiles", "--dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "bad.yaml" in result.output and "Traceback" not in result.output
