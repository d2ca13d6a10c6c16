"""Moves in the replay (`Policies.moves`): a gang that started spread is moved into one leaf, the
single-node work that made room restarts on the node it left, and each pays its restart."""

from __future__ import annotations

from dataclasses import replace

import pytest

from factories import cluster, pod
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.model import Workload
from gpupool.core.scheduling.cycle import CycleResult, Policies
from gpupool.core.scheduling.moves import MoveRule
from gpupool.core.topology_spec import Tier, TopologySpec
from gpupool.sim.comm import JobComm, ModelClass, default_comm_model
from gpupool.sim.comm_net import CommSetup
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import Replay, ReplayConfig

MODEL = default_comm_model().with_comm_heavy(1.0)
FABRIC = fat_tree(4, 2, oversubscription=3.0)
"""4 leaves of 3 hosts (n000-n002 on leaf 0, n003-n005 on leaf 1, ...), one uplink each."""
NODES = tuple(cluster(12))
INTERVAL = 50.0
RESTART_S = 300.0
RUN_S = 50_000.0


def _job(wid: str, pods: int, submit_s: float, duration_s: float) -> TraceJob:
    w = Workload(id=wid, pods=tuple(pod(8, name=f"p{i}") for i in range(pods)), submit_time_s=submit_s,
                 runtime_estimate_s=duration_s, checkpoint_interval_s=INTERVAL)
    return TraceJob(w, submit_s, duration_s)


JOBS = tuple(sorted(
    [_job(f"s{i:02d}", 1, 0.0, 10.0 if i in (2, 3) else 200_000.0) for i in range(12)]
    + [_job("a", 2, 5.0, RUN_S), _job("late", 1, 30.0, 100.0)], key=lambda j: j.submit_s))
"""Twelve whole-node jobs fill the pool (s_i on n00i); s02 and s03 end at t=10, so gang a starts
there spread over leaves 0 and 1. At t=30 a job arrives that fits nowhere: the cycle that looks at
it moves a into leaf 0 (s00 or s01 makes room, moving to the node a left)."""


QUIET = tuple(sorted(
    [_job(f"s{i:02d}", 1, 0.0, 10.0 if i in (2, 3) else 40.0 if i == 5 else 200_000.0) for i in range(12)]
    + [_job("a", 2, 5.0, RUN_S)], key=lambda j: j.submit_s))
"""As JOBS, without the late job: after a starts nothing is pending. s05 (leaf 1) ends at t=40."""


def _replay(moves: MoveRule | None, jobs: tuple[TraceJob, ...] = JOBS) -> tuple[Replay, dict]:
    policies = Policies(placement="network-aware", ordering="fifo", backfill=True, moves=moves,
                        topology_default=TopologySpec(preferred=Tier.LEAF), max_locality_wait_s=0.0)
    setup = CommSetup(FABRIC, MODEL, {"a": JobComm(ModelClass.LANGUAGE, MODEL.classes[ModelClass.LANGUAGE])})
    run = Replay(ReplayConfig(NODES, jobs, policies, comm=setup, check_invariants=True))
    return run, run.run()


def test_a_spread_gang_is_moved_into_a_leaf_and_ends_sooner() -> None:
    still, before = _replay(None)
    moved, after = _replay(MoveRule(restart_s=RESTART_S))
    assert before["moves"] == {"gangs": 0, "others": 0, "cost_gpu_hours": 0.0}
    assert after["moves"]["gangs"] == 1 and after["moves"]["others"] == 1
    # the work a did in its 20 s spread (at its spread rate: checkpoint every 50 s, so all lost) and
    # the single job's 30 s, plus restarts: what the truth lost, not the 20 s of wall time
    spread_rate = still.jobs["a"].rate
    assert 0 < spread_rate < 1
    assert after["moves"]["cost_gpu_hours"] * 3600 == pytest.approx(
        (20.0 * spread_rate + RESTART_S) * 16 + (30.0 + RESTART_S) * 8)
    assert {n // 3 for n, _ in still.jobs["a"].devices} == {0, 1}
    assert {n // 3 for n, _ in moved.jobs["a"].devices} == {0}
    a_still = still.jobs["a"].last_update_s
    a_moved = moved.jobs["a"].last_update_s
    assert a_moved < a_still  # packed, it runs faster than the move costs it
    assert a_moved >= 30.0 + RUN_S + RESTART_S  # it restarted from t=0's progress at t=30
    assert after["finished"] == before["finished"] == len(JOBS)


def test_a_spread_gang_moves_when_work_ends_with_nothing_pending() -> None:
    moved, after = _replay(MoveRule(restart_s=RESTART_S), QUIET)
    assert after["moves"]["gangs"] == 1
    assert len({n // 3 for n, _ in moved.jobs["a"].devices}) == 1
    assert moved.jobs["a"].run_start_s == 40.0  # moved when s05 ended, the first cycle after t=10
    # the replay keeps the core's count of moves when it restarts the work (`max_moves_each`)
    counted = {wid: (i.moves, i.moved_s) for wid, i in moved.view.info.items() if i.moves}
    assert counted == {"a": (1, 40.0), "s00": (1, 40.0)}


def test_a_gang_moved_then_preempted_in_the_same_cycle_is_only_preempted() -> None:
    """JOBS, but the late job outranks the rest and preemption is on: the cycle at t=30 moves a into
    leaf 0, and its walk then preempts a (just restarted, it loses the least). The cycle reports a
    as preempted only (not also moved), and the replay goes on (it used to fail on a KeyError)."""
    late = _job("late", 1, 30.0, 100.0)
    late = replace(late, workload=replace(late.workload, priority=10))
    jobs = tuple(sorted([j for j in JOBS if j.workload.id != "late"] + [late], key=lambda j: j.submit_s))
    policies = Policies(placement="network-aware", ordering="fifo", backfill=True,
                        moves=MoveRule(restart_s=RESTART_S), preemption=True,
                        topology_default=TopologySpec(preferred=Tier.LEAF), max_locality_wait_s=0.0)
    setup = CommSetup(FABRIC, MODEL, {"a": JobComm(ModelClass.LANGUAGE, MODEL.classes[ModelClass.LANGUAGE])})
    run = Replay(ReplayConfig(NODES, jobs, policies, comm=setup, check_invariants=True))
    results: list[CycleResult] = []
    apply = run._apply

    def recorded(result: CycleResult, now_s: float) -> None:
        results.append(result)
        apply(result, now_s)

    run._apply = recorded  # type: ignore[method-assign]
    summary = run.run()
    both = [(m.workload_id, r) for r in results for m in r.moved
            if m.workload_id in {p.workload_id for p in r.preempted}]
    assert both == []
    [stop] = [p for r in results for p in r.preempted]
    assert (stop.workload_id, stop.preemptor_id) == ("a", "late")
    assert summary["preemptions"] == 1 and summary["moves"]["gangs"] == 0
    assert summary["finished"] == len(jobs)

