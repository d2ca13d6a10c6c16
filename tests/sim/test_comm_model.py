"""The replay's communication model: calibration, sharing, link failures, reading the trace."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import cluster, node, pod
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.model import Fabric
from gpupool.core.model import Workload
from gpupool.core.scheduling.cycle import Policies
from gpupool.errors import InvalidInput
from gpupool.sim.comm import (
    EstimateMode,
    JobComm,
    ModelClass,
    Origin,
    assign_classes,
    default_comm_model,
    load_comm_model,
    spread_slowdown,
)
from gpupool.sim.comm_net import CommSetup, CommTracker, LinkFailure
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import ReplayConfig, replay

MODEL = default_comm_model()
FF = Policies(placement="first-fit", ordering="fifo")


@cache
def tracker_on(ports: int, oversubscription: float = 1.0) -> tuple[CommTracker, Fabric]:
    fabric = fat_tree(ports, 3, oversubscription=oversubscription)
    nodes = cluster(len(fabric.cas))
    profiles = {f"g{k.value}": JobComm(k, MODEL.classes[k]) for k in ModelClass}
    return CommTracker(fabric, nodes, MODEL, profiles), fabric


def leaf_nodes(tracker: CommTracker, leaf: int) -> list[int]:
    return [i for i, d in enumerate(tracker.net.leaf_id.tolist()) if d == leaf]


def rate_of(tracker: CommTracker, wid: str, nodes: list[int]) -> float:
    tracker.start(wid, nodes, 8.0 * len(nodes))
    try:
        return tracker.rates()[wid]
    finally:
        tracker.stop(wid)


@settings(max_examples=40, deadline=None)
@given(klass=st.sampled_from(list(ModelClass)), first=st.integers(1, 4), second=st.integers(1, 4))
def test_packed_in_one_leaf_is_free_and_two_leaves_cost_1_1_to_1_67(klass, first, second) -> None:
    tracker, _ = tracker_on(8)  # 1:1, four hosts per leaf, four leaves per spine group
    wid = f"g{klass.value}"
    one_leaf = leaf_nodes(tracker, 0)[: max(2, first)]
    assert rate_of(tracker, wid, one_leaf) == pytest.approx(1.0)
    spread = leaf_nodes(tracker, 0)[:first] + leaf_nodes(tracker, 1)[:second]
    assert tracker.net.spine_id[spread[0]] == tracker.net.spine_id[spread[-1]]
    assert 1.1 <= 1.0 / rate_of(tracker, wid, spread) <= 1.67


@pytest.mark.parametrize("klass", list(ModelClass))
def test_calibration_holds_for_every_gang_size(klass: ModelClass) -> None:
    values = [spread_slowdown(MODEL, klass, ranks) for ranks in (2, 3, 4, 8, 16, 64, 128)]
    assert all(1.1 <= v <= 1.67 for v in values)
    assert values == sorted(values)  # bigger rings communicate more per step


def test_gangs_sharing_oversubscribed_uplinks_slow_each_other() -> None:
    tracker, _ = tracker_on(8, oversubscription=4.0)  # 6 hosts and 2 uplinks per leaf
    a, b = leaf_nodes(tracker, 0), leaf_nodes(tracker, 1)
    alone = rate_of(tracker, "glanguage", [a[0], b[0]])
    for i in range(3):  # three other gangs cross the same two leaves
        heavy = JobComm(ModelClass.LANGUAGE, MODEL.classes[ModelClass.LANGUAGE])
        tracker.profiles = {**tracker.profiles, f"x{i}": heavy}
        tracker.start(f"x{i}", [a[1 + i], b[1 + i]], 16.0)
    try:
        shared = tracker.rates()
        crowded = rate_of(tracker, "glanguage", [a[4], b[4]])
        assert crowded < alone
        assert shared["x0"] < alone
    finally:
        for i in range(3):
            tracker.stop(f"x{i}")
    assert rate_of(tracker, "glanguage", [a[0], b[0]]) == pytest.approx(alone)


def test_classes_are_seeded_and_estimates_differ_from_the_truth() -> None:
    jobs = [(f"j{i}", 1 + i % 3, True) for i in range(3000)]
    one = assign_classes(jobs, MODEL, seed=4)
    assert one == assign_classes(jobs, MODEL, seed=4)
    assert one != assign_classes(jobs, MODEL, seed=5)
    share = sum(j.klass is ModelClass.LANGUAGE for j in one.values()) / len(one)
    assert 0.56 < share < 0.64
    noisy = assign_classes(jobs, MODEL, seed=4, estimate=EstimateMode.NOISY)
    ratios = {round(j.estimate_ratio / j.spec.comm_ratio, 6) for j in noisy.values() if j.estimate_ratio}
    assert ratios == {0.5, 1.5}
    assert all(j.estimate_ratio is None
               for j in assign_classes(jobs, MODEL, 4, EstimateMode.HOPS_ONLY).values())
    heavy = assign_classes(jobs, MODEL.with_comm_heavy(0.0), seed=4)
    assert not any(j.klass is ModelClass.LANGUAGE for j in heavy.values())


def test_origin_two_leaves_divides_passed_multi_node_jobs_only() -> None:
    model = MODEL.model_copy(update={"origin": Origin.TWO_LEAVES})
    out = assign_classes([("single", 1, True), ("gang", 2, True), ("failed", 2, False)], model, seed=1)
    assert out["single"].origin_slowdown == 1.0
    assert out["failed"].origin_slowdown == 1.0
    assert out["gang"].origin_slowdown == pytest.approx(spread_slowdown(model, out["gang"].klass, 2))


def test_comm_model_files(tmp_path: Path) -> None:
    assert load_comm_model("default") == MODEL
    good = tmp_path / "comm.yaml"
    good.write_text("cross_leaf_efficiency: 0.7\norigin: two-leaves\n")
    assert load_comm_model(str(good)).cross_leaf_efficiency == 0.7
    bad = tmp_path / "bad.yaml"
    bad.write_text("classes: {image: {share: 0.5, comm_ratio: 1, overlap: 2, gradient_mib: 10}}\n")
    with pytest.raises(InvalidInput, match="not a valid communication model"):
        load_comm_model(str(bad))
    with pytest.raises(InvalidInput, match="does not exist"):
        load_comm_model(str(tmp_path / "missing.yaml"))


# ------------------------------------------------------------------ in the replay

def _gang(wid: str, gpus: int, submit: float, duration: float) -> TraceJob:
    pods = tuple(pod(8, name=f"p{i}") for i in range(gpus // 8))
    return TraceJob(Workload(id=wid, pods=pods, submit_time_s=submit), submit, duration)


def _comm_replay(jobs: tuple[TraceJob, ...], profiles: dict[str, JobComm],
                 cuts: tuple[LinkFailure, ...] = ()) -> tuple[dict, Fabric]:
    fabric = fat_tree(4, 3, pods=2)  # 8 hosts, two per leaf: node00002 and node00003 sit on two leaves
    nodes = (node("node00002"), node("node00003"))  # a node takes the fabric host of its own name
    setup = CommSetup(fabric, MODEL, profiles)
    config = ReplayConfig(nodes, jobs, FF, comm=setup, link_failures=cuts, check_invariants=True)
    return replay(config), fabric


SPEECH = JobComm(ModelClass.SPEECH, MODEL.classes[ModelClass.SPEECH])
GANG = (_gang("g", 16, 1.0, 1000.0),)


def test_a_spread_gang_runs_slower_by_its_slowdown_and_a_failed_one_does_not() -> None:
    result, _ = _comm_replay(GANG, {"g": SPEECH})
    s = spread_slowdown(MODEL, ModelClass.SPEECH, 2, ref_gbps=200.0 * 64 / 66)
    assert result["jct_s"]["mean"] == pytest.approx(1000.0 * s, rel=1e-3)
    assert result["cross_leaf_bytes"] > 0 and result["cross_spine_bytes"] == 0
    assert 0 < result["link_util_max"] <= 1.0
    failed, _ = _comm_replay(GANG, {"g": JobComm(ModelClass.SPEECH, SPEECH.spec, passed=False)})
    assert failed["jct_s"]["mean"] == pytest.approx(1000.0)


def test_a_cut_leaf_stalls_the_gang_until_the_repair() -> None:
    base, fabric = _comm_replay(GANG, {"g": SPEECH})
    leaf = fabric.ca_leaf[fabric.find("node00002 HCA-1")][0]
    uplinks = [lk for lk in fabric.links
               if leaf in (lk.a, lk.b) and fabric.is_switch(lk.a) and fabric.is_switch(lk.b)]
    cuts = tuple(LinkFailure(100.0, lk.key, repair_after_s=50.0) for lk in uplinks)
    cut, _ = _comm_replay(GANG, {"g": SPEECH}, cuts)
    assert cut["jct_s"]["mean"] - base["jct_s"]["mean"] == pytest.approx(50.0, rel=1e-3)
    assert cut["gangs_across_failed_links"] == 0


def test_the_tracker_counts_a_gang_placed_across_a_cut_leaf() -> None:
    fabric = fat_tree(4, 3, pods=2)
    tracker = CommTracker(fabric, (node("node00002"), node("node00003")), MODEL, {"g": SPEECH, "h": SPEECH})
    leaf = fabric.ca_leaf[fabric.find("node00002 HCA-1")][0]
    uplinks = [lk for lk in fabric.links
               if leaf in (lk.a, lk.b) and fabric.is_switch(lk.a) and fabric.is_switch(lk.b)]
    tracker.set_link(uplinks[0].key, healthy=False)
    tracker.start("g", [0, 1], 16.0)  # one uplink left: degraded, not cut off
    tracker.stop("g")
    tracker.set_link(uplinks[1].key, healthy=False)
    tracker.start("h", [0, 1], 16.0)
    report = tracker.report(10.0, 16.0, 10.0)
    assert report["gangs_on_degraded_link_pools"] == 1
    assert report["gangs_across_failed_links"] == 1
    assert tracker.rates()["h"] == pytest.approx(1e-6)
