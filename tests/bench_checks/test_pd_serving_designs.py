"""bench/pd_serving.py sizes its iso-cost designs as Splitwise's own scripts do."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import pd_serving  # noqa: E402


def test_splitwise_scale_is_40_dgx_h100_against_86_dgx_a100_and_ha_mixes_by_its_formula() -> None:
    by_name: dict[str, list[str]] = {}
    for name, cluster, _mode, _shares in pd_serving.designs(40, "splitwise"):
        by_name.setdefault(name, []).append(cluster)
    assert by_name["co-located H100"] == ["40x8xH100"]
    assert by_name["co-located A100"] == ["86x8xA100"]  # int(40 x 4.76 / 2.21)
    assert by_name["split HH"] == ["40x8xH100"]
    # Splitwise-HA in its iso-cost throughput script: 30 DGX-H100 (prompt) and 21 DGX-A100 (token)
    assert "30x8xH100,21x8xA100" in by_name["split HA"]


def test_the_price_book_sizes_the_a100_designs_by_its_own_ratio() -> None:
    clusters = {name: cluster for name, cluster, _m, _s in pd_serving.designs(8, "book")}
    assert clusters["co-located A100"] == "11x8xA100"  # 8 x 2.50 / 1.80
