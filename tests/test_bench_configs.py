"""The benches' configurations and workload mixes stay valid as the schema and the API move on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpupool.api.workloads import WorkloadSpec
from gpupool.config import PoolConfig, load_config
from gpupool.fedfile import FederationConfig, load_federation

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from _control_plane import COHORT_TENANTS, workload_mix  # noqa: E402

LIVE_FULL = {"live-full-1x8.yaml": 8, "live-full-16x8.yaml": 128}
"""Each live configuration and the devices of the pool its bench starts (1x8xH100, 16x8xH100)."""


@pytest.mark.parametrize("path", sorted(BENCH.glob("configs/*.yaml")), ids=lambda p: p.name)
def test_every_bench_configuration_is_accepted(path: Path) -> None:
    if path.name.startswith("federation"):  # a federation's fed.yaml (the replay reads it as the hub does)
        assert isinstance(load_federation(path, replay=True), FederationConfig)
    else:
        assert isinstance(load_config(path), PoolConfig)


@pytest.mark.parametrize("mix", ["plain", "cohort"])
def test_every_spec_of_a_mix_is_a_valid_submission(mix: str) -> None:
    specs = [WorkloadSpec.model_validate(s) for s in workload_mix(mix)]
    assert specs


@pytest.mark.parametrize(("name", "devices"), sorted(LIVE_FULL.items()))
def test_the_cohort_mix_exercises_the_full_configuration(name: str, devices: int) -> None:
    config = load_config(BENCH / "configs" / name)
    specs = [WorkloadSpec.model_validate(s) for s in workload_mix("cohort")]
    queues = {q.tenant: q for q in config.queues}
    assert {s.tenant for s in specs} == set(COHORT_TENANTS) == set(queues)
    assert {q.cohort for q in queues.values()} == {"pool"}
    assert sum(q.quota or 0 for q in queues.values()) == devices  # the cohort's quotas are the pool
    assert any(q.borrowing_limit for q in queues.values()) and any(q.lending_limit for q in queues.values())
    classes = {c.name: c for c in config.priority_classes}
    default_classes = {c.name for c in PoolConfig().priority_classes}
    used = {s.priority_class for s in specs}
    assert len(used) >= 3 and used <= set(classes) and used <= default_classes  # both sides accept it
    assert any(classes[str(n)].grace is not None for n in used)
    assert any(s.time_limit_s for s in specs) and any(s.resources.gpus == 1 for s in specs)
