"""bench/victim_switch.py: both sides of a switch decide the same on a small pool, the table and the
JSON come out, the module is left as it was, and a name that is no switch is refused (exit 2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import victim_switch  # noqa: E402
from gpupool.core.scheduling import preemption  # noqa: E402


def _run(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["victim_switch.py", *args])
    return victim_switch.main()


def test_a_small_run_compares_both_sides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    part = preemption._drop_apart
    out = tmp_path / "switch.json"
    assert _run(monkeypatch, "--switch", "put_back_from_base", "--part", "_drop_apart", "--nodes", "40",
                "--pending", "200", "--cycles", "3", "--warmup", "1", "--json", str(out)) == 0
    result = json.loads(out.read_text())
    assert result["cycles_deciding_otherwise"] == 0
    assert result["on"]["cycle_cpu_median_ms"] > 0 and result["off"]["cycle_cpu_median_ms"] > 0
    assert "cycles deciding otherwise: 0" in capsys.readouterr().out
    assert preemption._drop_apart is part and preemption.put_back_from_base is True


def test_a_name_that_is_no_switch_is_refused(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(monkeypatch, "--switch", "MAX_TRIM_TRIALS", "--part", "_drop_apart") == 2
    assert "--switch must name a boolean" in capsys.readouterr().err


def test_a_switch_of_another_module_and_a_method_part(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    from gpupool.core.scheduling.policies import fgd

    part = fgd.Fgd._place_feasible
    out = tmp_path / "switch.json"
    assert _run(monkeypatch, "--module", fgd.__name__, "--switch", "lazy_refresh", "--part",
                "Fgd._place_feasible", "--nodes", "40", "--pending", "200", "--cycles", "3", "--warmup", "1",
                "--json", str(out)) == 0
    result = json.loads(out.read_text())
    assert result["cycles_deciding_otherwise"] == 0
    assert result["on"]["part_ms_per_cycle"] > 0 and result["off"]["part_ms_per_cycle"] > 0
    assert fgd.Fgd._place_feasible is part and fgd.lazy_refresh is True
    assert _run(monkeypatch, "--module", "gpupool.no_such_module", "--switch", "x", "--part", "y") == 2
