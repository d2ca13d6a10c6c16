"""Why a pod waits: the most specific reason, devices before a default share of the host."""

from __future__ import annotations

import random

from factories import node
from gpupool.core.model import ClusterSnapshot, PodRequest, Reason, Workload
from gpupool.core.scheduling.cycle import Policies, run_cycle


def _one(wid: str, submit_s: float, cpu_milli: int = 0) -> Workload:
    pod = PodRequest("r0", num_devices=1, device_milli=1000, cpu_milli=cpu_milli)
    return Workload(wid, (pod,), submit_time_s=submit_s)


def test_a_full_pool_says_devices_not_the_default_cpu_share() -> None:
    pool = [node("a", devices=2, cpu_milli=8_000)]
    pending = [_one("x", 0), _one("y", 1), _one("z", 2)]
    result = run_cycle(ClusterSnapshot(tuple(pool)), pending, Policies(placement="first-fit"), 0.0,
                       random.Random(0))
    assert [a.workload_id for a in result.admitted] == ["x", "y"]
    assert {r.workload_id: r.reason for r in result.rejected} == {"z": Reason.INSUFFICIENT_DEVICES}


def test_a_free_device_without_its_cpu_says_cpu() -> None:
    pool = [node("a", devices=2, cpu_milli=8_000)]
    pending = [_one("hungry", 0, cpu_milli=6_000), _one("plain", 1)]
    result = run_cycle(ClusterSnapshot(tuple(pool)), pending, Policies(placement="first-fit"), 0.0,
                       random.Random(0))
    assert {r.workload_id: r.reason for r in result.rejected} == {"plain": Reason.INSUFFICIENT_CPU}
