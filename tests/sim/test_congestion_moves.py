"""Congestion in the replay (sim/congestion.py): the truth's link load fed to the scheduler as
telemetry, and gangs whose bottleneck pool stays hot moved off it (checkpoint-requeued) by the
cycle (`Policies.migrate`, a stop of kind migrate)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from factories import cluster, pod
from gpupool.config import parse_config
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.model import Workload
from gpupool.core.scheduling.congestion import MigrateRule
from gpupool.core.scheduling.cycle import CycleResult, EventKind, Policies
from gpupool.core.scheduling.preemption import checkpoint_split
from gpupool.core.scheduling.topology import LEAF_UP, FabricView
from gpupool.core.topology_spec import Tier, TopologySpec
from gpupool.errors import InvalidInput
from gpupool.sim.comm import JobComm, ModelClass, default_comm_model
from gpupool.sim.comm_net import CommSetup, CommTracker
from gpupool.sim.congestion import CongestionRule, CongestionWatch
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import Replay, ReplayConfig

MODEL = default_comm_model().with_comm_heavy(1.0)
LANGUAGE = JobComm(ModelClass.LANGUAGE, MODEL.classes[ModelClass.LANGUAGE])
FABRIC = fat_tree(4, 2, oversubscription=3.0)
"""4 leaves of 3 hosts (n000-n002 on leaf 0, n003-n005 on leaf 1, ...), one uplink each."""
NODES = tuple(cluster(12))
INTERVAL = 50.0
"""The gangs' checkpoint interval."""
ALONE, SHARED = 0.335, 0.410
"""Utilisation of the leaf uplink pools under one of these gangs, and under two (see the first test)."""
HOT = 0.38
"""Between the two: the pools are hot only while both gangs share them."""


def _job(wid: str, pods: int, submit_s: float, duration_s: float) -> TraceJob:
    w = Workload(id=wid, pods=tuple(pod(8, name=f"p{i}") for i in range(pods)), submit_time_s=submit_s,
                 runtime_estimate_s=duration_s, checkpoint_interval_s=INTERVAL if pods > 1 else None)
    return TraceJob(w, submit_s, duration_s)


ENDS = {2: 10.0, 3: 10.0, 1: 20.0, 4: 20.0, 6: 50.0, 7: 50.0, 8: 50.0}
JOBS = tuple(sorted(
    [_job(f"s{i:02d}", 1, 0.0, ENDS.get(i, 3000.0)) for i in range(12)]
    + [_job("a", 2, 5.0, 1000.0), _job("b", 2, 15.0, 1000.0)], key=lambda j: j.submit_s))
"""Twelve whole-node jobs fill the pool (first-fit: s_i on n00i). Gang a starts at t=10 spread over
n002 and n003 (no leaf has two free nodes), gang b at t=20 over n001 and n004: both cross the uplinks
of leaves 0 and 1. Leaf 2 is free from t=50. Everything ends by t=3000 or so."""
POLICIES = Policies(placement="first-fit", ordering="fifo",
                    topology_default=TopologySpec(preferred=Tier.LEAF), max_locality_wait_s=0.0)
"""Preferred leaf, never waiting for one: a gang spreads when no leaf fits, packs when one does."""


class _Stops(Replay):
    """A replay that keeps every stop its cycles decided."""

    def __init__(self, config: ReplayConfig) -> None:
        super().__init__(config)
        self.stops: list[tuple[float, str, EventKind]] = []

    def _apply(self, result: CycleResult, now_s: float) -> None:
        self.stops += [(now_s, s.workload_id, s.kind) for s in result.stopped]
        super()._apply(result, now_s)


def _replay(rule: CongestionRule | None, migrate: MigrateRule | None = None) -> tuple[_Stops, dict]:
    setup = CommSetup(FABRIC, MODEL, {"a": LANGUAGE, "b": LANGUAGE})
    policies = replace(POLICIES, migrate=migrate)
    run = _Stops(ReplayConfig(NODES, JOBS, policies, comm=setup, congestion=rule, check_invariants=True))
    return run, run.run()


def _nodes(run: Replay, wid: str) -> set[int]:
    return {n for n, _ in run.jobs[wid].devices}


def _leaf(nodes: set[int]) -> set[int]:
    return {n // 3 for n in nodes}


def test_the_truth_gives_each_pool_and_each_gangs_bottleneck_its_utilisation() -> None:
    truth = CommTracker(FABRIC, NODES, MODEL, {"a": LANGUAGE, "b": LANGUAGE})
    truth.start("a", [2, 3], 16.0)
    truth.rates()
    alone = truth.pool_utilisation()
    assert alone[(LEAF_UP, 0)] == alone[(LEAF_UP, 1)] == pytest.approx(ALONE, abs=1e-3)
    assert truth.bottleneck_utilisation() == {"a": pytest.approx(ALONE, abs=1e-3)}
    truth.start("b", [1, 4], 16.0)
    truth.rates()
    shared = truth.pool_utilisation()
    assert shared[(LEAF_UP, 0)] == pytest.approx(SHARED, abs=1e-3)
    assert shared[(LEAF_UP, 0)] > 1.9 * shared[(0, 1)]  # b's access link carries b alone
    assert truth.bottleneck_utilisation() == {"a": shared[(LEAF_UP, 0)], "b": shared[(LEAF_UP, 0)]}


def test_a_sample_sets_the_measured_load_in_the_schedulers_view_and_clears_it_after() -> None:
    truth = CommTracker(FABRIC, NODES, MODEL, {"a": LANGUAGE})
    view = FabricView.from_fabric(FABRIC, NODES)
    watch = CongestionWatch(CongestionRule())
    truth.start("a", [2, 3], 16.0)
    truth.rates()
    (uplink,) = truth.pool_links((LEAF_UP, 0))
    assert watch.sample(truth, view, 0.0) == {"a": pytest.approx(ALONE, abs=1e-3)}  # its bottleneck's load
    state = view.link_state(uplink)
    assert state is not None and state[1] == pytest.approx(ALONE, abs=1e-3)
    truth.stop("a")
    assert watch.active(truth)  # the view still holds load: one more sample clears it
    watch.sample(truth, view, 60.0)
    state = view.link_state(uplink)
    assert state is not None and state[1] == 0.0
    assert not watch.active(truth)


def test_gangs_sharing_a_hot_pool_move_after_the_hold_time_losing_the_work_since_a_checkpoint() -> None:
    run, result = _replay(CongestionRule(sample_s=60.0), MigrateRule(threshold=HOT, hold_s=120.0))
    # Samples at 70, 130, 190 (a's start + 60 s each): hot from 70 (b joined at 20), due at 190.
    assert result["congestion_moves"] == 2 and result["congestion_same_nodes"] == 0
    # the cycle decided it: one stop of kind migrate each, at the sample that found them due
    assert run.stops == [(190.0, "a", EventKind.MIGRATE), (190.0, "b", EventKind.MIGRATE)]
    assert result["preemptions"] == 0  # a move is not a preemption
    for wid, before in (("a", {2, 3}), ("b", {1, 4})):
        assert _nodes(run, wid) != before and len(_leaf(_nodes(run, wid))) == 1  # placed again in one leaf
    assert result["comm"]["multi_node_gangs"] == 4 and result["comm"]["placed_in_one_leaf"] == 2
    truth = CommTracker(FABRIC, NODES, MODEL, {"a": LANGUAGE, "b": LANGUAGE})
    truth.start("a", [2, 3], 16.0)
    alone = truth.rates()["a"]
    truth.start("b", [1, 4], 16.0)
    shared = truth.rates()["a"]
    lost = 0.0
    for done in (alone * 10.0 + shared * 170.0, shared * 170.0):
        kept, gone = checkpoint_split(done, INTERVAL)
        assert kept > 0
        lost += gone * 16
    assert result["congestion_lost_gpu_h"] * 3600 == pytest.approx(lost)
    assert result["lost_gpu_hours"] * 3600 == pytest.approx(lost)
    assert result["unfinished"] == 0


def test_without_migrate_or_below_the_threshold_nobody_moves() -> None:
    for migrate in (None, MigrateRule(threshold=0.45, hold_s=120.0)):
        run, result = _replay(CongestionRule(), migrate)
        assert result["congestion_moves"] == 0 and result["congestion_lost_gpu_h"] == 0.0
        assert result["congestion_samples"] > 0
        assert _nodes(run, "a") == {2, 3} and _nodes(run, "b") == {1, 4}


def test_sampling_stops_when_no_gang_runs() -> None:
    run, result = _replay(CongestionRule(), MigrateRule(threshold=HOT, hold_s=1e6))
    assert result["unfinished"] == 0
    # gangs ran from t=10 to about t=10 + 1000 / rate: one sample a minute, plus one to clear the view
    last_end = max(run.jobs[w].first_start_s or 0.0 for w in "ab") + 1000.0 / 0.42
    assert result["congestion_samples"] <= math.ceil((last_end - 10.0) / 60.0) + 1
    assert run.sample_at is None
    only_single = tuple(j for j in JOBS if len(j.workload.pods) == 1)
    quiet = Replay(ReplayConfig(NODES, only_single, POLICIES, comm=CommSetup(FABRIC, MODEL, {}),
                                congestion=CongestionRule()))
    assert quiet.run()["congestion_samples"] == 0


def test_a_rule_out_of_range_is_refused() -> None:
    for bad in ({"sample_s": 0.0}, {"sample_s": math.inf}):
        with pytest.raises(InvalidInput):
            CongestionRule(**bad)
    for wrong in ({"threshold": 0.0}, {"hold_s": -1.0}, {"threshold": math.nan}):
        with pytest.raises(InvalidInput):
            MigrateRule(**wrong)


def test_the_pools_configuration_keys_are_the_replays() -> None:
    # fabric.migrate_on_congestion, congestion_threshold, congestion_for: what `gpupool up` runs and
    # `sim replay --config` replays, one rule of the cycle
    config = parse_config("fabric: {migrate_on_congestion: true, congestion_threshold: 0.38, "
                          "congestion_for: 2m}\n")
    assert config.policies().migrate == MigrateRule(threshold=HOT, hold_s=120.0)
    assert parse_config("{}").policies().migrate is None
    run, result = _replay(CongestionRule(), config.policies().migrate)
    assert result["congestion_moves"] == 2 and [s[1:] for s in run.stops] == [
        ("a", EventKind.MIGRATE), ("b", EventKind.MIGRATE)]


class _Ends(Replay):
    """A replay that keeps when each job ended."""

    def __init__(self, config: ReplayConfig) -> None:
        super().__init__(config)
        self.ends: dict[str, float] = {}

    def _finish(self, wid: str, now_s: float) -> None:
        super()._finish(wid, now_s)
        self.ends[wid] = now_s


def test_a_model_that_only_measures_load_leaves_gangs_at_the_traces_rate() -> None:
    """`comm_slows=False` (the parity test's replay): the gangs run their trace duration, as the live
    pool's pods run what their provider gives them, and the model still measures their links' load."""
    setup = CommSetup(FABRIC, MODEL, {"a": LANGUAGE, "b": LANGUAGE})
    slowed = _Ends(ReplayConfig(NODES, JOBS, POLICIES, comm=setup, congestion=CongestionRule()))
    measured = _Ends(ReplayConfig(NODES, JOBS, POLICIES, comm=setup, congestion=CongestionRule(),
                                  comm_slows=False))
    slow, result = slowed.run(), measured.run()
    for wid, start in (("a", 10.0), ("b", 20.0)):  # as placed in the module's trace
        assert measured.ends[wid] == pytest.approx(start + 1000.0)
        assert slowed.ends[wid] > start + 1000.0 / 0.5
    assert result["congestion_samples"] > 0 and result["link_util_max"] == pytest.approx(SHARED, abs=1e-3)
    assert slow["link_util_max"] > 0
