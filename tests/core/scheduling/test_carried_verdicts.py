"""A victim search's verdict (its walk freed every candidate and the first pod still fitted no node)
kept from one cycle to the next while it provably holds (`preemption.carry_verdicts`): the same
decisions as searching again, and each way capacity may come back drops it."""

from __future__ import annotations

import random
from typing import Any

import pytest

import gpupool.core.scheduling.cycle as cycle
from factories import cluster, node, pod
from gpupool.core.model import (
    Allocation,
    ClusterSnapshot,
    PodPlacement,
    PodRequest,
    Slice,
    SliceDefaults,
    Workload,
)
from gpupool.core.scheduling import preemption
from gpupool.core.scheduling.cycle import Policies
from gpupool.core.scheduling.preemption import KeptVerdicts, VictimIndex, select_victims
from gpupool.core.scheduling.reach import PreemptionRules, WithinQueue
from gpupool.core.scheduling.view import ClusterView
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import NodeFailure, Replay, ReplayConfig

NOW = 1000.0


def _job(wid: str, cls: str, devices: int = 1, submit_s: float = 0.0) -> Workload:
    p = PodRequest("p0", cpu_milli=1000 * max(devices, 1), memory_mib=4096, num_devices=devices,
                   device_milli=1000 if devices else 0)
    return Workload(id=wid, pods=(p,), tenant="t", priority_class=cls, submit_time_s=submit_s)


def _on(w: Workload, where: str, first: int, start_s: float = 500.0) -> Allocation:
    p = w.pods[0]
    slices = tuple(Slice(first + d, 1000, 32_768) for d in range(p.num_devices))
    return Allocation(w, (PodPlacement("p0", where, slices, p.cpu_milli, p.memory_mib),), start_s)


def _pool(on_a7: str = "high", spare: bool = False) -> ClusterView:
    """Node a: 7 `best-effort` jobs and `h` (of class `on_a7`) on its last device; node b: 4
    `best-effort` jobs and a 4-device `normal` job `nb`; with `spare`, an empty node d. A whole-node
    `normal` preemptor may take the `best-effort` jobs: 7 devices on a, 4 on b, so (without d) it fits
    no node even with all of them gone."""
    allocations = [_on(_job(f"a{i}", "best-effort"), "a", i) for i in range(7)]
    allocations.append(_on(_job("h", on_a7), "a", 7))
    allocations += [_on(_job(f"b{i}", "best-effort"), "b", i) for i in range(4)]
    allocations.append(_on(_job("nb", "normal", 4), "b", 4))
    nodes = (node("a"), node("b"), *((node("d"),) if spare else ()))
    view = ClusterView.from_snapshot(ClusterSnapshot(nodes, tuple(allocations)))
    view.materialize()
    return view


class _Walks:
    """Counts the searches that made a walk (`FirstPodFits`); one answered by a verdict makes none."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made = 0
        original = preemption.FirstPodFits.__init__

        def counted(inner: preemption.FirstPodFits, *args: Any) -> None:
            self.made += 1
            original(inner, *args)

        monkeypatch.setattr(preemption.FirstPodFits, "__init__", counted)


def _search(view: ClusterView, wid: str, exclude: set[str] | None = None) -> list[str] | None:
    """A whole-node `normal` job's search, on a fresh index (a new cycle)."""
    policy = view.placement_policy("first-fit", {})
    chosen = select_victims(_job(wid, "normal", 8, 950.0), "", view, policy, random.Random(0), NOW,
                            exclude if exclude is not None else set(), VictimIndex(view, NOW))
    return None if chosen is None else sorted(r.workload.id for r in chosen.victims)


def test_a_verdict_answers_the_next_cycle_while_candidates_leave(monkeypatch: pytest.MonkeyPatch) -> None:
    """x1's walk finds nothing; a candidate ends: x2 in the next cycle is answered by x1's verdict (no
    walk), as searching again answers."""
    walks = _Walks(monkeypatch)
    view = _pool()
    assert _search(view, "x1") is None and walks.made == 1
    assert isinstance(view.listener, KeptVerdicts) and len(view.listener.verdicts) == 1
    view.remove("a0")  # a candidate: it was counted as freed
    assert _search(view, "x2") is None and walks.made == 1
    monkeypatch.setattr(preemption, "carry_verdicts", False)
    assert _search(view, "x3") is None and walks.made == 2


@pytest.mark.parametrize("cls", ["high", "critical"])
def test_a_non_candidate_ending_drops_the_verdict(cls: str) -> None:
    """`h` (`high`, or `critical`: never a victim; no candidate of a `normal` job) ends: node a is then
    free once its 7 `best-effort` jobs go, which x1's verdict did not count."""
    view = _pool(on_a7=cls)
    assert _search(view, "x1") is None
    view.remove("h")
    assert _search(view, "x2") == [f"a{i}" for i in range(7)]


def test_a_preempted_non_candidate_drops_the_verdict() -> None:
    """As above, where `h` is `normal` work (of the preemptor's rank: no candidate of it) that a
    `high` job's search took: detached, then forgotten, it gives back what the verdict did not count."""
    view = _pool(on_a7="normal")
    assert _search(view, "x1") is None
    h = view.running["h"]
    view.detach(h)
    view.forget(h)  # preempted (by a `high` job, say): given back for good
    assert _search(view, "x2") == [f"a{i}" for i in range(7)]


def test_a_repaired_node_drops_the_verdict() -> None:
    """Node d is broken when x1 searches; repaired, it holds x2 alone (the search then takes its
    cheapest single victim, by its definition): the verdict would refuse it."""
    view = _pool(spare=True)
    view.mark_unhealthy("d")
    assert _search(view, "x1") is None
    view.mark_healthy("d")
    assert _search(view, "x2") is not None


def test_an_excluded_candidate_keeps_no_verdict() -> None:
    """`h` is `best-effort` work admitted in x1's cycle (excluded then): x1 finds nothing; in the
    next cycle `h` is a candidate, and node a is free once it and a0..a6 go."""
    view = _pool(on_a7="best-effort")
    assert _search(view, "x1", {"h"}) is None
    assert _search(view, "x2") == sorted([f"a{i}" for i in range(7)] + ["h"])


def test_new_slice_defaults_drop_every_verdict() -> None:
    """Other defaults change what a pod needs (less, it may be): the verdicts go; the same keep them."""
    view = _pool()
    assert _search(view, "x1") is None
    kept = view.listener
    assert isinstance(kept, KeptVerdicts) and kept.verdicts
    view.use_defaults(view.state.defaults)
    assert kept.verdicts
    view.use_defaults(SliceDefaults(cpu_milli_per_device=1000))
    assert not kept.verdicts


def _replay_config(seed: int, rules: PreemptionRules) -> ReplayConfig:
    """A backed-up pool of six 8-device nodes that break and are repaired: gangs of one to four
    whole-node pods of three priorities, small jobs of every priority (one on a node keeps every
    whole-node pod off it), in two tenants' queues under drf."""
    rng = random.Random(seed)
    jobs, at = [], 0.0
    for i in range(260):
        at += rng.expovariate(1 / 25.0)
        kind = rng.random()
        if kind < 0.3:
            pods, gpus, run_s = rng.choice([1, 2, 3, 4]), 8, rng.lognormvariate(6.0, 0.8)
        else:
            pods, gpus, run_s = 1, rng.choice([1, 2, 4]), rng.lognormvariate(6.8, 1.0)
        w = Workload(id=f"j{i:03d}", pods=tuple(pod(gpus, name=f"p{k}") for k in range(pods)),
                     tenant=f"t{rng.randrange(3)}", priority=rng.choice([0, 0, 3, 5]), submit_time_s=at)
        jobs.append(TraceJob(w, at, run_s))
    failures = tuple(NodeFailure(rng.uniform(0.0, at), f"n{rng.randrange(6):03d}", rng.uniform(300.0, 3000.0))
                     for _ in range(4))
    policies = Policies(placement="first-fit", ordering="drf", backfill=True, preemption=True,
                        preemption_rules=rules)
    return ReplayConfig(tuple(cluster(6)), tuple(jobs), policies, seed=seed, failures=failures,
                        check_invariants=True)


def _result(replay: Replay) -> dict[str, Any]:
    return {k: v for k, v in replay.run().items() if k not in ("wall_s", "cycle_ms_mean")}


@pytest.mark.parametrize("rules", [PreemptionRules(),
                                   PreemptionRules(within_queue=WithinQueue.LOWER_OR_NEWER_EQUAL_PRIORITY)])
def test_replays_decide_the_same_with_carried_verdicts(monkeypatch: pytest.MonkeyPatch,
                                                       rules: PreemptionRules) -> None:
    """Every metric of backed-up replays with node failures (their decisions) equal with every
    search made again; carried verdicts answered searches in every one."""
    answered = [0]
    plain = preemption.KeptVerdicts.keep

    class Counting(dict[Any, Any]):
        def __contains__(self, key: object) -> bool:
            found = super().__contains__(key)
            answered[0] += found
            return found

    def keep(self: KeptVerdicts, *args: Any) -> None:
        if not isinstance(self.verdicts, Counting):
            self.verdicts = Counting(self.verdicts)
        plain(self, *args)

    monkeypatch.setattr(preemption.KeptVerdicts, "keep", keep)
    monkeypatch.setattr(cycle, "VictimIndex", VictimIndex)
    for seed in (1, 2, 5):
        answered[0] = 0
        carried = _result(Replay(_replay_config(seed, rules)))
        assert answered[0] > 20 and carried["preemptions"] > 20, (seed, answered[0])
        with monkeypatch.context() as off:
            off.setattr(preemption, "carry_verdicts", False)
            assert _result(Replay(_replay_config(seed, rules))) == carried, seed
