"""`gpupool sim fill` on a tiny fixture: table, JSON of the documented shape, plot, and bad input."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import NoReturn

import pytest
from typer.testing import CliRunner

from gpupool.cli._common import default_policy
from gpupool.cli.sim import app
from gpupool.sim import fill

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


def test_too_many_seeds_are_refused_before_the_list_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo'd range (0-999999999) would build a list of a billion seeds, and a run for each, before
    any fill ran: it is one sentence naming the limit --help states, at once. A range too long to
    build, and every fill, is replaced by a stand-in that fails, so a missing refusal fails the test
    instead of filling memory."""
    built = range

    def bounded(*bounds: int) -> range:
        span = built(*bounds)
        assert len(span) <= fill.MAX_SEEDS, f"range{bounds} built before the seeds were refused"
        return span

    def never(*_args: object, **_kwargs: object) -> NoReturn:
        raise AssertionError("a fill started before the seeds were refused")

    monkeypatch.setattr(fill, "range", bounded, raising=False)
    monkeypatch.setattr(fill, "run_jobs", never)
    monkeypatch.setattr(fill, "FillJob", never)
    limit = f"{fill.MAX_SEEDS:,}"
    for seeds, count in (("0-999999999", "1,000,000,000"), ("0-1000", "1,001"),
                         ("0-600,500-1100", f"more than {limit}"),
                         ("7,0-99999999999999999999", f"more than {limit}")):
        started = time.perf_counter()
        result = runner.invoke(app, args("--seeds", seeds))
        assert time.perf_counter() - started < 5
        assert result.exit_code == 2, (result.output, result.exception)
        assert (f"Seeds '{seeds}' name {count} seeds, but a fill takes at most {limit} (each is a run of "
                "every policy, seconds each); give a shorter range or list, such as 42-51.") in result.output
        assert "Traceback" not in result.output
    shown = runner.invoke(app, ["fill", "--help"], env={"COLUMNS": "200"}).output
    assert f"at most {limit} seeds" in " ".join(shown.replace("│", " ").split())
    assert len(fill.parse_seeds("0-999")) == fill.MAX_SEEDS  # the limit itself is taken
    assert fill.parse_seeds("0-600,0-600,5") == list(range(601))  # a seed named twice counts once
