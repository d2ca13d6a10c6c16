"""bench/cycle_latency.py with `--fresh after`: the fresh view's cycles run after the timed loop,
on each cycle's own inputs, and their decisions are still compared with the kept view's."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import cycle_latency
from gpupool.core.scheduling.cycle import Admit, Policies


def _loop(fresh_after: bool) -> dict[str, object]:
    snapshot, pending = cycle_latency.build(40, 200, seed=3)
    return cycle_latency.time_loop(snapshot, pending, Policies(), repeat=4, warmup=1, churn=5, seed=3,
                                   fresh_after=fresh_after)


def test_fresh_after_times_as_many_fresh_cycles_and_decides_alike() -> None:
    beside, after = _loop(False), _loop(True)
    assert after["cycles_deciding_otherwise"] == beside["cycles_deciding_otherwise"] == 0
    assert after["admitted_per_cycle"] == beside["admitted_per_cycle"] > 0
    assert isinstance(after["fresh_median_ms"], float) and after["fresh_median_ms"] > 0


def test_fresh_after_still_counts_a_cycle_deciding_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh view that admits nothing differs from the kept one in every timed cycle that admits."""
    real = cycle_latency.run_cycle

    def admits_nothing(*args: object, **kwargs: object) -> object:
        result = real(*args, **kwargs)  # type: ignore[arg-type]
        return replace(result, decisions=tuple(d for d in result.decisions if not isinstance(d, Admit)))

    monkeypatch.setattr(cycle_latency, "run_cycle", admits_nothing)
    after = _loop(True)
    assert after["cycles_deciding_otherwise"] == 4
