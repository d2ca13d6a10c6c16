"""What the replay tells the scheduler about a job's communication (exact, noisy, hop counts only), and
the part of each job's queueing delay spent waiting for locality."""

from __future__ import annotations

import pytest

from factories import cluster, pod
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.model import Workload
from gpupool.core.scheduling.cycle import Policies
from gpupool.core.scheduling.locality import WaitCap
from gpupool.sim.comm import EstimateMode, ModelClass, default_comm_model
from gpupool.sim.comm_net import comm_setup
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import Replay, ReplayConfig, replay

HEAVY_ONLY = default_comm_model().with_comm_heavy(1.0)
"""Every job a language model (ratio 1.5): the truth is the same in every run below."""
FABRIC = fat_tree(4, 2, oversubscription=3.0)
"""4 leaves of 3 hosts (n000-n002 on leaf 0, n003-n005 on leaf 1, ...), one uplink each."""


def _job(wid: str, pods: int, submit_s: float, duration_s: float,
         estimate_s: float | None = None) -> TraceJob:
    w = Workload(id=wid, pods=tuple(pod(8, name=f"p{i}") for i in range(pods)), submit_time_s=submit_s,
                 runtime_estimate_s=duration_s if estimate_s is None else estimate_s)
    return TraceJob(w, submit_s, duration_s)


ENDS = {2: 10.0, 3: 10.0, 1: 20.0, 4: 20.0, 6: 200.0, 7: 200.0}
JOBS = tuple(sorted(
    [_job(f"s{i:02d}", 1, 0.0, ENDS.get(i, 1e5)) for i in range(12)]
    + [_job("b", 2, 5.0, 1e4, estimate_s=5.0), _job("g", 2, 20.0, 1000.0)], key=lambda j: j.submit_s))
"""Twelve whole-node jobs fill the pool (first-fit: s_i on n00i). At t=10, gang b can start only spread
over leaves 0 and 1 (n002, n003); it is expected to end in 5 s (it runs far longer), so spreading
costs it less than the 10 s until leaf 0 would free: it spreads. At t=20, gang g can
start only across the same two uplinks, already carrying b (half the bandwidth), and leaf 2 is whole
again at t=200 (n006, n007): 180 s away."""


def _run(estimate: EstimateMode, jobs: tuple[TraceJob, ...] = JOBS, cap: WaitCap = WaitCap.FIXED) -> dict:
    nodes = tuple(cluster(12))
    setup = comm_setup(FABRIC, jobs, HEAVY_ONLY, seed=0, devices_per_node=8, estimate=estimate)
    policies = Policies(placement="first-fit", ordering="fifo", locality_wait_cap=cap)
    return replay(ReplayConfig(nodes, jobs, policies, comm=setup, check_invariants=True))


def test_the_scheduler_reads_each_jobs_estimate_never_its_truth() -> None:
    """Told the ratio (1.5), g waits 180 s for leaf 2; knowing hop counts only (the uniform
    assumption, ratio 0.08), it spreads at once beside b, although the truth is the same."""
    exact, hops = _run(EstimateMode.EXACT), _run(EstimateMode.HOPS_ONLY)
    assert exact["comm"]["placed_in_one_leaf"] == 1 and hops["comm"]["placed_in_one_leaf"] == 0
    assert exact["comm"]["classes"] == hops["comm"]["classes"] == {"language": 14}
    assert exact["multi_pod_gangs"]["queue_delay_s"]["mean"] == pytest.approx((5.0 + 180.0) / 2)
    assert hops["multi_pod_gangs"]["queue_delay_s"]["mean"] == pytest.approx((5.0 + 0.0) / 2)


def test_locality_wait_is_the_time_wait_or_spread_held_the_gang_back() -> None:
    exact = _run(EstimateMode.EXACT)
    gangs = exact["by_gang_size"]["9-32"]  # b and g, 16 GPUs each
    assert gangs["count"] == 2
    assert gangs["locality_wait_s"]["mean"] == pytest.approx(90.0)  # g: 180 s, b (never held): 0
    assert gangs["locality_wait_s"]["p99"] == pytest.approx(180.0 * 0.99)
    assert exact["locality_wait_s_total"] == pytest.approx(180.0)
    assert exact["locality_waited_jobs"] == 1
    assert exact["by_gang_size"]["2-8"]["locality_wait_s"]["mean"] == 0.0  # the single-node jobs
    hops = _run(EstimateMode.HOPS_ONLY)
    assert hops["locality_wait_s_total"] == 0.0 and hops["locality_waited_jobs"] == 0


def test_a_held_gang_spreads_when_its_max_wait_runs_out_even_if_nothing_else_happens() -> None:
    """Leaf 2 is expected at t=200 but its jobs run until t=5000: g waits 300 s (the default
    max_locality_wait_s), then spreads at t=320, with no other event then."""
    late = tuple(_job(j.workload.id, 1, 0.0, 5000.0, 200.0) if j.workload.id in ("s06", "s07") else j
                 for j in JOBS)
    result = _run(EstimateMode.EXACT, late)
    assert result["locality_wait_s_total"] == pytest.approx(300.0)
    assert result["multi_pod_gangs"]["queue_delay_s"]["mean"] == pytest.approx((5.0 + 300.0) / 2)
    assert result["comm"]["placed_in_one_leaf"] == 0


def test_under_the_loss_cap_a_held_gang_waits_its_own_cap_then_spreads_with_no_other_event() -> None:
    """The same, waiting up to the loss: g's spread would cost it more than 300 s (a 1000 s heavy job
    sharing b's uplinks), so it waits that long, then spreads at 20 s + that cap, long before leaf 2
    frees at t=5000 (the replay wakes at each gang's own cap)."""
    late = tuple(_job(j.workload.id, 1, 0.0, 5000.0, 200.0) if j.workload.id in ("s06", "s07") else j
                 for j in JOBS)
    result = _run(EstimateMode.EXACT, late, cap=WaitCap.LOSS)
    waited = result["locality_wait_s_total"]
    assert 300.0 < waited < 5000.0 - 20.0 and result["comm"]["placed_in_one_leaf"] == 0
    assert result["multi_pod_gangs"]["queue_delay_s"]["mean"] == pytest.approx((5.0 + waited) / 2)
    assert result["locality_waited_jobs"] == 1


def test_the_replay_binds_the_estimates_of_the_setup() -> None:
    setup = comm_setup(FABRIC, JOBS, HEAVY_ONLY, seed=3, devices_per_node=8, estimate=EstimateMode.NOISY)
    run = Replay(ReplayConfig(tuple(cluster(12)), JOBS, Policies(), comm=setup))
    told = {j.workload.id: run.view.comm_ratio(j.workload) for j in JOBS} if run.view.comm_ratio else {}
    assert set(told.values()) <= {0.75, 2.25} and len(set(told.values())) == 2  # 1.5 x (1 +/- 0.5)
    assert all(setup.profiles[w].klass is ModelClass.LANGUAGE for w in told)
