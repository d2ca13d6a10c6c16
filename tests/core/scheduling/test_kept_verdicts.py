"""A victim search whose walk freed every candidate and left the preemptor's first pod fitting no
node is kept as a verdict for the cycle (`preemption.keep_verdicts`): a later search for the same
first pod from the same sources returns None at once, until a search finds victims (capacity is
then freed that the verdict did not count). The same decisions as searching again."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import pytest

import gpupool.core.scheduling.cycle as cycle
from factories import cluster, node, pod
from gpupool.core.model import (
    Allocation,
    ClusterSnapshot,
    PodPlacement,
    PodRequest,
    Slice,
    Workload,
    shared_labels,
)
from gpupool.core.quota import DEVICE_MILLI, ClusterQueue, QuotaConfig, ResourceQuota
from gpupool.core.scheduling import preemption
from gpupool.core.scheduling.cycle import Policies
from gpupool.core.scheduling.preemption import VictimIndex, select_victims
from gpupool.core.scheduling.reach import PreemptionRules, WithinQueue, reach
from gpupool.core.scheduling.view import ClusterView
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import Replay, ReplayConfig

NOW = 1000.0


def _job(wid: str, cls: str, devices: int = 1, submit_s: float = 0.0, cpu_milli: int = 0) -> Workload:
    pod = PodRequest("p0", cpu_milli=cpu_milli or 1000 * max(devices, 1), memory_mib=4096,
                     num_devices=devices, device_milli=1000 if devices else 0)
    return Workload(id=wid, pods=(pod,), tenant="t", priority_class=cls, submit_time_s=submit_s)


def _on(w: Workload, where: str, first: int, start_s: float) -> Allocation:
    pod = w.pods[0]
    slices = tuple(Slice(first + d, 1000, 32_768) for d in range(pod.num_devices))
    return Allocation(w, (PodPlacement("p0", where, slices, pod.cpu_milli, pod.memory_mib),), start_s)


def _pool() -> ClusterView:
    """Three full nodes in the order c, a, b: c runs 8 `normal` jobs; a 7 `best-effort` ones and one
    `high` job; b 4 `best-effort` ones and a 4-device `normal` job started a second ago (the
    cheapest victim). A whole-node `normal` preemptor may take the 11 `best-effort` jobs: 7 devices
    on a, 4 on b, so it fits no node even with all of them gone."""
    allocations = [_on(_job(f"c{i}", "normal"), "c", i, 100.0) for i in range(8)]
    allocations += [_on(_job(f"a{i}", "best-effort"), "a", i, 900.0) for i in range(7)]
    allocations.append(_on(_job("h", "high"), "a", 7, 0.0))
    allocations += [_on(_job(f"b{i}", "best-effort"), "b", i, 500.0) for i in range(4)]
    allocations.append(_on(_job("nb", "normal", 4), "b", 4, 999.0))
    view = ClusterView.from_snapshot(ClusterSnapshot((node("c"), node("a"), node("b")), tuple(allocations)))
    view.materialize()
    return view


def _searches(keep: bool, clear: bool = True) -> tuple[list[list[str] | None], int]:
    """On one index, as a cycle does: whole-node `normal` x1 and x2 (no victims), then `high` y, a
    cpu-only job that fits b once `nb` goes (admitted: b keeps 4 devices free), then whole-node
    `normal` x3, which now fits b once b0..b3 go. Returns each search's victims and how many
    searches made their `FirstPodFits` (a search cut short by the verdict makes none)."""
    made = [0]
    original = preemption.FirstPodFits.__init__

    def counted(self: preemption.FirstPodFits, *args: object) -> None:
        made[0] += 1
        original(self, *args)  # type: ignore[arg-type]

    out: list[list[str] | None] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preemption, "keep_verdicts", keep)
        mp.setattr(preemption, "carry_verdicts", False)  # (this cycle's verdicts alone)
        mp.setattr(preemption.FirstPodFits, "__init__", counted)
        view = _pool()
        policy = view.placement_policy("first-fit", {})
        index, admitted = VictimIndex(view, NOW), set[str]()
        jobs = [_job("x1", "normal", 8, 950.0, 1000), _job("x2", "normal", 8, 951.0, 1000),
                _job("y", "high", 0, 952.0, 57_000), _job("x3", "normal", 8, 953.0, 1000)]
        kept: dict[Any, Any] = {}
        for w in jobs:
            chosen = select_victims(w, "", view, policy, random.Random(0), NOW, admitted, index)
            out.append(None if chosen is None else [r.workload.id for r in chosen.victims])
            if chosen is not None:
                for run in chosen.victims:
                    view.forget(run)
                view.admit(w, chosen.gang, "", NOW)
                admitted.add(w.id)
                if not clear:  # the verdicts before it kept past the preemption
                    index.nowhere.update(kept)
            kept = dict(index.nowhere)
    return out, made[0]


def test_a_search_repeating_a_verdict_returns_none_without_walking() -> None:
    plain, plain_made = _searches(keep=False)
    kept, kept_made = _searches(keep=True)
    assert plain == [None, None, ["nb"], ["b0", "b1", "b2", "b3"]]
    assert kept == plain
    assert plain_made == 4 and kept_made == 3  # x2 was answered by x1's verdict


def test_a_verdict_kept_past_a_preemption_would_refuse_what_now_fits() -> None:
    """y's preemption frees what x1's verdict did not count (nb was no candidate of a `normal`
    preemptor): kept past it, x3 would be refused."""
    stale, _ = _searches(keep=True, clear=False)
    assert stale[3] is None
    assert _searches(keep=True)[0][3] == ["b0", "b1", "b2", "b3"]


def _replay_config(seed: int) -> ReplayConfig:
    """A backed-up pool of six 8-device nodes: gangs of one to four whole-node `high` pods (the same
    first pod in every shape), small `high` jobs that no gang may preempt (one on a node keeps
    every whole-node pod off it) and small low-priority work, the gangs' candidates."""
    rng = random.Random(seed)
    jobs, at = [], 0.0
    for i in range(240):
        at += rng.expovariate(1 / 30.0)
        kind = rng.random()
        if kind < 0.25:
            pods, gpus, prio, run_s = rng.choice([1, 2, 3, 4]), 8, 5, rng.lognormvariate(6.0, 0.8)
        elif kind < 0.4:
            pods, gpus, prio, run_s = 1, 1, 5, rng.lognormvariate(7.5, 0.5)
        else:
            pods, gpus, prio, run_s = 1, rng.choice([1, 2, 4]), 0, rng.lognormvariate(6.5, 1.0)
        w = Workload(id=f"j{i:03d}", pods=tuple(pod(gpus, name=f"p{k}") for k in range(pods)),
                     tenant=f"t{rng.randrange(4)}", priority=prio, submit_time_s=at)
        jobs.append(TraceJob(w, at, run_s))
    policies = Policies(placement="first-fit", ordering="drf", backfill=True, preemption=True)
    return ReplayConfig(tuple(cluster(6)), tuple(jobs), policies, seed=seed)


class _Counted(dict[Any, Any]):
    """`VictimIndex.nowhere` counting the searches it answered."""

    answered = 0

    def get(self, key: Any, default: Any = None) -> Any:
        found = super().get(key, default)
        _Counted.answered += found is not None
        return found


def test_a_replay_decides_the_same_with_kept_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every metric of a backed-up replay (preemptions, waits, completions: its decisions) equal with
    every search made again, on three seeds; verdicts answered searches on each."""

    class Counting(VictimIndex):
        def __init__(self, view: ClusterView, now_s: float) -> None:
            super().__init__(view, now_s)
            self.nowhere = _Counted()

    monkeypatch.setattr(cycle, "VictimIndex", Counting)
    monkeypatch.setattr(preemption, "carry_verdicts", False)  # (each cycle's verdicts alone)
    for seed in (1, 3):
        _Counted.answered = 0
        kept = _result(Replay(_replay_config(seed)))
        assert _Counted.answered > 50 and kept["preemptions"] > 50, seed
        with monkeypatch.context() as off:
            off.setattr(preemption, "keep_verdicts", False)
            assert _result(Replay(_replay_config(seed))) == kept, seed


def _result(replay: Replay) -> dict[str, Any]:
    return {k: v for k, v in replay.run().items() if k not in ("wall_s", "cycle_ms_mean")}


def test_the_wording_of_a_failed_search_reads_the_reach_it_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a search that found no victims, `reach_after_none` is the reach `sources` computed for
    that preemptor (equal to computing it again); for another preemptor it is that one's own."""
    view = _pool()
    policy = view.placement_policy("first-fit", {})
    index = VictimIndex(view, NOW)
    x1, y = _job("x1", "normal", 8, 950.0, 1000), _job("y", "high", 8, 951.0, 1000)
    rules = preemption.DEFAULT_RULES
    assert select_victims(x1, "", view, policy, random.Random(0), NOW, set(), index) is None
    kept = index.reach_after_none(x1, "", rules)
    assert kept == reach(x1, "", view, rules)
    assert kept is index.reach_after_none(x1, "", rules)  # the search's, not a new one
    other = index.reach_after_none(y, "", rules)
    assert other == reach(y, "", view, rules) and other != kept  # (a `high` job reaches `normal` work)
    monkeypatch.setattr(preemption, "keep_reach", False)
    assert index.reach_after_none(x1, "", rules) is not kept


def _plain_free_milli(view: ClusterView, w: Workload) -> int:
    """`preemption.free_milli` by its definition: the masked copy of the free milli, summed."""
    state = view.state
    if any(not p.allowed_models for p in w.pods if p.num_devices):
        models: frozenset[str] = frozenset()
    else:
        models = frozenset().union(*(p.allowed_models for p in w.pods))
    return int(state.dev_milli_free[state.allowed_devices(models, shared_labels(w.pods))].sum())


def test_free_milli_sums_where_the_mask_holds() -> None:
    """On random pools (two models, labelled nodes, shares and whole devices taken) and workloads
    (models, labels, one to three pods): the free compute their devices offer, as defined."""
    for seed in range(30):
        rng = random.Random(seed)
        made = [node(f"n{i}", devices=rng.choice([2, 4, 8]), model=rng.choice("AB")) for i in range(5)]
        nodes = tuple(dataclasses.replace(n, labels={"rack": rng.choice(["r1", "r2"])}) for n in made)
        view = ClusterView.from_snapshot(ClusterSnapshot(nodes, ()))
        state = view.state
        for _ in range(12):
            p = pod(rng.choice([0.25, 0.5, 1, 2]), name="p0")
            fits = np.flatnonzero(state.node_fits(p))
            if fits.size:
                at = int(fits[rng.randrange(fits.size)])
                slots = np.flatnonzero(state.device_fits(p)[at])[: p.num_devices]
                state.allocate(state.make_alloc(p, at, slots))
        for k in range(10):
            labels = [frozenset(), frozenset({("rack", "r1")}), frozenset({("rack", "r3")})]
            models = [frozenset(), frozenset("A"), frozenset("C")]
            pods = tuple(dataclasses.replace(pod(rng.choice([0, 0.5, 1, 4]), name=f"p{i}",
                                                 models=rng.choice(models)), node_labels=rng.choice(labels))
                         for i in range(rng.randint(1, 3)))
            w = Workload(id=f"w{k}", pods=pods, tenant="t")
            assert preemption.free_milli(view, w) == _plain_free_milli(view, w), (seed, k)
        assert state.dev_milli_free.sum() > 0 and (state.dev_milli_free < state.dev_milli_cap).any()


def test_sources_kept_for_the_cycle_are_those_computed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a quota, `sources` per (rank, queue, rules, submit time where the rules read it) is
    what computing it again gives: other classes reach other groups, and under
    `LOWER_OR_NEWER_EQUAL_PRIORITY` each submit time bounds its own queue's newer work."""
    view = _pool()
    index = VictimIndex(view, NOW)
    newer = PreemptionRules(within_queue=WithinQueue.LOWER_OR_NEWER_EQUAL_PRIORITY)
    asks = [(_job(f"w{i}", cls, 8, submit), rules)
            for i, (cls, submit, rules) in enumerate([
                ("normal", 10.0, preemption.DEFAULT_RULES), ("high", 10.0, preemption.DEFAULT_RULES),
                ("normal", 20.0, preemption.DEFAULT_RULES), ("best-effort", 5.0, newer),
                ("best-effort", 600.0, newer), ("normal", 10.0, newer), ("best-effort", 5.0, newer)])]
    seen = []
    for w, rules in asks:
        kept = index.sources(w, "", rules)
        with monkeypatch.context() as off:
            off.setattr(preemption, "keep_sources", False)
            again = VictimIndex(view, NOW).sources(w, "", rules)
        assert kept == again, w.id
        assert index.reach_after_none(w, "", rules) == reach(w, "", view, rules)
        seen.append(kept)
    assert seen[0] != seen[1] and seen[3] != seen[4] and seen[0] == seen[2] and seen[3] == seen[6]
    assert len(index._sources) == 5  # (w2 and w6 were answered from the kept ones)


def test_sources_are_computed_again_where_a_quota_is_kept() -> None:
    """Under a quota the reach reads the usage: a small job of team-a reclaims what team-b borrows,
    a job beyond team-a's nominal quota may not (borrow_within_cohort never); same class, same queue."""
    quota = QuotaConfig(cluster_queues=(ClusterQueue("team-a", {DEVICE_MILLI: ResourceQuota(2000)}, "pool"),
                                        ClusterQueue("team-b", {DEVICE_MILLI: ResourceQuota(2000)}, "pool")))
    policies = Policies(placement="first-fit", ordering="priority-fifo", preemption=True, quota=quota)
    view = ClusterView.empty(cluster(1, devices=4), policies.quota, policies.priority_classes)
    borrowers = [Workload(id=f"b{i}", pods=(pod(1),), tenant="team-b", priority_class="best-effort")
                 for i in range(4)]
    assert len(cycle.cycle_on(view, borrowers, policies, 0.0, random.Random(0)).admitted) == 4
    index = VictimIndex(view, 10.0)
    small = Workload(id="small", pods=(pod(1),), tenant="team-a", priority_class="normal")
    big = Workload(id="big", pods=(pod(3),), tenant="team-a", priority_class="normal")
    reclaiming, beyond = index.sources(small, "team-a"), index.sources(big, "team-a")
    assert reclaiming.reclaim == ["team-b"] and any(q == "team-b" for _, q in reclaiming.groups)
    assert beyond.reclaim == [] and all(q != "team-b" for _, q in beyond.groups)


def test_a_refusal_is_worded_once_until_victims_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a node of 7 `normal` jobs and one `best-effort` job: whole-node `normal` x1 and x2 find no
    victims, worded once (x2 reads x1's clause); y preempts the `best-effort` job; x3's refusal then
    says nothing (no lower-priority work runs), as wording it again does."""
    calls = [0]
    plain = preemption.out_of_reach

    def counted(*args: Any) -> str:
        calls[0] += 1
        return plain(*args)

    monkeypatch.setattr(preemption, "out_of_reach", counted)
    allocations = [_on(_job(f"c{i}", "normal"), "c", i, 100.0) for i in range(7)]
    allocations.append(_on(_job("be", "best-effort"), "c", 7, 900.0))
    view = ClusterView.from_snapshot(ClusterSnapshot((node("c"),), tuple(allocations)))
    view.materialize()
    policy = view.placement_policy("first-fit", {})
    index, admitted = VictimIndex(view, NOW), set[str]()
    rules = preemption.DEFAULT_RULES
    texts = []
    for w in [_job("x1", "normal", 8, 950.0, 1000), _job("x2", "normal", 8, 951.0, 1000),
              _job("y", "normal", 1, 952.0), _job("x3", "normal", 8, 953.0, 1000)]:
        chosen = select_victims(w, "", view, policy, random.Random(0), NOW, admitted, index, rules)
        if chosen is None:
            texts.append(index.why_none(w, "", rules, admitted))
            again = plain(reach(w, "", view, rules), index.queues(),
                          lambda q: index.preemptible_ranks(q, admitted), rules)
            assert texts[-1] == again, w.id
            continue
        assert [r.workload.id for r in chosen.victims] == ["be"]
        for run in chosen.victims:
            view.forget(run)
        view.admit(w, chosen.gang, "", NOW)
        admitted.add(w.id)
    assert texts[0] == texts[1] and texts[0].startswith("preemption not possible: stopping all")
    assert texts[2] == ""
    assert calls[0] == 2  # x1 and x3 worded, x2 read x1's
