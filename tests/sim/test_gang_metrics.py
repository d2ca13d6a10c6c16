"""The replay's metrics by gang size (GPUs per workload: 1, 2-8, 9-32, >32)."""

from __future__ import annotations

import pytest

from factories import cluster, pod
from gpupool.core.model import Workload
from gpupool.core.scheduling.cycle import Policies
from gpupool.sim.jobs import TraceJob
from gpupool.sim.metrics import GANG_BUCKETS, gang_bucket
from gpupool.sim.replay import ReplayConfig, replay


def _job(wid: str, gpus: int, submit: float, duration: float) -> TraceJob:
    sizes = [8] * (gpus // 8) + ([gpus % 8] if gpus % 8 else [])
    pods = tuple(pod(n, name=f"p{i}") for i, n in enumerate(sizes))
    return TraceJob(Workload(id=wid, pods=pods, submit_time_s=submit), submit, duration)


@pytest.mark.parametrize(("gpus", "bucket"), [(0.5, "1"), (1, "1"), (2, "2-8"), (8, "2-8"), (9, "9-32"),
                                               (32, "9-32"), (33, ">32"), (128, ">32")])
def test_buckets(gpus: float, bucket: str) -> None:
    assert gang_bucket(gpus) == bucket


def test_by_gang_size_counts_and_percentiles() -> None:
    # 8 nodes x 8 GPUs; a 64-GPU gang holds everything for 100 s, the rest queue behind it
    jobs = (
        _job("big", 64, 0.0, 100.0),
        *(_job(f"one{i}", 1, 1.0, 10.0 * (i + 1)) for i in range(20)),
        _job("mid", 4, 2.0, 50.0),
        _job("wide", 16, 3.0, 30.0),
    )
    result = replay(ReplayConfig(tuple(cluster(8)), jobs, Policies(placement="first-fit", ordering="fifo")))
    by = result["by_gang_size"]
    assert list(by) == list(GANG_BUCKETS)
    assert [by[b]["count"] for b in GANG_BUCKETS] == [20, 1, 1, 1]
    assert by[">32"]["jct_s"]["mean"] == 100.0 and by[">32"]["queue_delay_s"]["p99"] == 0.0
    ones = by["1"]
    assert ones["queue_delay_s"]["mean"] == pytest.approx(99.0)  # all started at 100
    assert ones["jct_s"]["p50"] < ones["jct_s"]["p95"] <= ones["jct_s"]["p99"] <= 99.0 + 200.0
    assert ones["jct_s"]["p99"] == pytest.approx(max(99.0 + 10.0 * k for k in range(1, 21)), rel=0.01)
    assert by["9-32"]["queue_delay_s"]["mean"] == pytest.approx(97.0)
    assert set(by["2-8"]["jct_s"]) == {"mean", "p50", "p95", "p99"}
    gangs = result["multi_pod_gangs"]  # big (8 pods) and wide (2 pods); mid is one pod of 4
    assert gangs["count"] == 2
    assert gangs["jct_s"]["mean"] == pytest.approx((100.0 + 97.0 + 30.0) / 2)
