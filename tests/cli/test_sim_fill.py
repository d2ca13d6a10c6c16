"""`gpupool sim fill` on a tiny fixture: table, JSON of the documented shape, plot, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpupool.cli._common import default_policy
from gpupool.cli.sim import app

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "openb"
runner = CliRunner()


def args(*extra: str) -> list[str]:
    return ["fill", "--nodes", str(FIXTURES / "nodes.csv"), "--pods", str(FIXTURES / "pods.csv"), *extra]


def test_fill_writes_table_json_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    result = runner.invoke(
        app,
        args(
            "--policy",
            "fgd",
            "--policy",
            "best-fit",
            "--seeds",
            "42,43",
            "--json",
            str(out),
            "--plot",
            str(png),
        ),
    )
    assert result.exit_code == 0, result.output
    assert "fgd" in result.output and "best-fit" in result.output
    doc = json.loads(out.read_text())
    assert set(doc["summary"]) == {"fgd", "best-fit"}
    assert set(doc["summary"]["fgd"]) == {"90", "100", "130"}
    assert [(r["policy"], r["seed"]) for r in doc["runs"]] == [
        ("fgd", 42),
        ("fgd", 43),
        ("best-fit", 42),
        ("best-fit", 43),
    ]
    assert all(len(r["alloc_pct"]) == 131 and r["wall_s"] >= 0 for r in doc["runs"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_default_policy_is_the_servers(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    result = runner.invoke(app, args("--seed", "42", "--json", str(out)))
    assert result.exit_code == 0, result.output
    assert list(json.loads(out.read_text())["summary"]) == [default_policy()] == ["fgd-strand"]


def test_bad_input_is_one_sentence_and_exit_2(tmp_path: Path) -> None:
    result = runner.invoke(app, args("--policy", "fgdd"))
    assert result.exit_code == 2
    assert "Did you mean 'fgd'?" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, args("--seeds", "51-42"))
    assert result.exit_code == 2 and "Cannot read seeds" in result.output
    result = runner.invoke(
        app, ["fill", "--nodes", str(tmp_path / "no.csv"), "--pods", str(tmp_path / "no.csv")]
    )
    assert result.exit_code == 2 and "does not exist" in result.output
    bad = tmp_path / "pods.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,two,1000\n")
    result = runner.invoke(app, ["fill", "--nodes", str(FIXTURES / "nodes.csv"), "--pods", str(bad)])
    assert result.exit_code == 2 and f"{bad}:2:" in result.output
