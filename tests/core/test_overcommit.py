"""Oversubscription: guaranteed parts shrink by the ratio, slowdown follows the documented formula."""

from __future__ import annotations

import pytest

from factories import pod
from gpupool.core.overcommit import ModelRatio, OvercommitConfig, device_slowdown, guaranteed_pod
from gpupool.errors import InvalidInput


def test_fractional_pod_reserves_its_guaranteed_part() -> None:
    cfg = OvercommitConfig({"V100M32": ModelRatio(compute=2.0, memory=1.5)})
    small = guaranteed_pod(pod(0.5, device_memory_mib=3000), cfg, ["V100M32"])
    assert (small.device_milli, small.device_memory_mib) == (250, 2000)
    whole = pod(1)
    assert guaranteed_pod(whole, cfg, ["V100M32"]) is whole


def test_most_conservative_ratio_of_allowed_models() -> None:
    cfg = OvercommitConfig({"A": ModelRatio(4.0), "B": ModelRatio(2.0)})
    assert guaranteed_pod(pod(0.8), cfg, ["A", "B"]).device_milli == 400


def test_slowdown_formula() -> None:
    assert device_slowdown([500, 400], [0, 0], 0, 4.0) == 1.0
    assert device_slowdown([1000, 500], [0, 0], 0, 4.0) == pytest.approx(1.5)
    # 40 GiB asked of a 32 GiB card: 1 + 4 * 8/40
    assert device_slowdown([500, 500], [20480, 20480], 32768, 4.0) == pytest.approx(1.8)


def test_ratio_below_one_is_refused() -> None:
    with pytest.raises(InvalidInput):
        ModelRatio(compute=0.5)
