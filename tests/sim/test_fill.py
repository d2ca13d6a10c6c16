"""The fill protocol: inflation, the allocation curve as the paper measures it, determinism."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from factories import cluster, pod
from gpupool.core.state import ClusterState
from gpupool.sim.fill import FillJob, allocation_curve, fill, inflate, run_jobs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "openb"


def test_inflate_stops_before_the_target_and_only_clones() -> None:
    pods = [pod(1, name="a"), pod(0.5, name="b"), pod(0, name="c")]
    out = inflate(pods, capacity_milli=10_000, rng=random.Random(1), ratio=1.3)
    total = sum(p.total_device_milli for p in out)
    assert 13_000 - 1000 < total <= 13_000
    assert out[:3] == pods and set(out) <= set(pods)


def test_inflate_trims_a_list_that_asks_too_much() -> None:
    pods = [pod(1, name=f"p{i}") for i in range(30)]
    out = inflate(pods, capacity_milli=10_000, rng=random.Random(1), ratio=1.3)
    assert sum(p.total_device_milli for p in out) == 13_000


def test_curve_takes_the_mean_of_the_samples_rounding_to_each_percent() -> None:
    arrived = np.array([4, 6, 10, 14, 16, 20, 1300], dtype=np.int64) * 1000
    used = np.array([4, 6, 10, 14, 16, 18, 90], dtype=np.int64) * 1000
    curve = allocation_curve(arrived, used, capacity_milli=1000 * 1000)
    assert len(curve) == 131
    assert curve[0] == 0.4  # 0.4 % arrived rounds to 0
    assert curve[1] == 1.0  # 0.6, 1.0 and 1.4 % round to 1: mean of their allocations
    assert curve[2] == 1.7  # 1.6 and 2.0 % round to 2
    assert curve[3] == 1.7  # nothing rounds to 3: the samples within 2..4 stand in
    assert curve[50] == 1.7  # nothing near: the previous value carries on
    assert curve[130] == 9.0


def test_fill_is_deterministic_and_never_exceeds_arrived_demand() -> None:
    nodes = cluster(3, devices=4)
    pods = [pod(g, name=f"p{i}") for i, g in enumerate([1, 0.5, 0.25, 2, 0, 4, 0.75])]
    a = fill(nodes, pods, "fgd", seed=7)
    b = fill(nodes, pods, "fgd", seed=7)
    assert a.alloc_pct == b.alloc_pct and a.placed == b.placed
    assert len(a.alloc_pct) == 131
    assert all(0.0 <= v <= 100.0 for v in a.alloc_pct)
    assert 0 < a.at(130) <= 100
    assert a.placed + a.failed == a.pods
    ClusterState(nodes).check_invariants()


def test_jobs_from_files_run_in_processes_like_in_process() -> None:
    job = FillJob(str(FIXTURES / "nodes.csv"), str(FIXTURES / "pods.csv"), "best-fit", 42)
    inline = run_jobs([job])
    pooled = run_jobs([job, job], workers=2)
    assert inline[0].alloc_pct == pooled[0].alloc_pct == pooled[1].alloc_pct
