"""A greedy victim search resumes the last walk of the cycle for the same first pod and sources
(`preemption.resume_walks`): it takes the victims after which that pod fitted no node at once, when
it still fits no node once they are freed, and goes on from the stream after them. The same states
are placed on, so the same decisions; a node changed since the earlier walk is checked, not assumed."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from bench_loop import assert_same_cycles, bench_loop

from factories import node
from gpupool.config import load_config
from gpupool.core.model import Allocation, ClusterSnapshot, PodPlacement, PodRequest, Slice, Workload
from gpupool.core.scheduling import preemption, victim_state
from gpupool.core.scheduling.cycle import CycleResult, Policies
from gpupool.core.scheduling.preemption import VictimIndex, select_victims
from gpupool.core.scheduling.view import ClusterView

ROOT = Path(__file__).resolve().parents[3]
NOW = 1000.0


def _job(wid: str, cls: str, devices: int = 1, submit_s: float = 0.0) -> Workload:
    pod = PodRequest("p0", cpu_milli=1000 * devices, memory_mib=4096 * devices, num_devices=devices,
                     device_milli=1000)
    return Workload(id=wid, pods=(pod,), tenant="t", priority_class=cls, submit_time_s=submit_s)


def _on(w: Workload, where: str, device: int, start_s: float) -> Allocation:
    pod = w.pods[0]
    return Allocation(w, (PodPlacement("p0", where, (Slice(device, 1000, 32_768),), pod.cpu_milli,
                                       pod.memory_mib),), start_s)


def _pool() -> ClusterView:
    """Three full nodes in the order c, a, b: c runs 8 `normal` jobs, a 7 cheap `best-effort` ones and
    one `high` job (no victim of a `high` preemptor), b 8 `best-effort` ones started earlier (dearer).
    A whole-node `high` preemptor walks a's seven, then b's eight, and lands on b."""
    allocations = [_on(_job(f"c{i}", "normal"), "c", i, 100.0) for i in range(8)]
    allocations += [_on(_job(f"a{i}", "best-effort"), "a", i, 900.0) for i in range(7)]
    allocations.append(_on(_job("h", "high"), "a", 7, 0.0))
    allocations += [_on(_job(f"b{i}", "best-effort"), "b", i, 500.0) for i in range(8)]
    snapshot = ClusterSnapshot((node("c"), node("a"), node("b")), tuple(allocations))
    view = ClusterView.from_snapshot(snapshot)
    view.materialize()
    return view


def _recording(answers: list[bool]) -> Callable[..., bool]:
    """`FirstPodFits.resume` that also appends each answer to `answers`."""
    original = victim_state.FirstPodFits.resume

    def told(self: victim_state.FirstPodFits, *args: object) -> bool:
        answers.append(original(self, *args))  # type: ignore[arg-type]
        return answers[-1]

    return told


def _two_searches(resume: bool, h_ends: bool) -> tuple[list[str], list[str], list[str], list[bool]]:
    """Two whole-node `high` preemptors searched one after the other on one index, as a cycle does
    (the first admitted, its victims gone); between them the `high` job on a ends when `h_ends`.
    Returns each search's victims, the second's node, and what `FirstPodFits.resume` answered."""
    answers: list[bool] = []
    told = _recording(answers)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preemption, "resume_walks", resume)
        mp.setattr(victim_state.FirstPodFits, "resume", told)
        view = _pool()
        policy = view.placement_policy("first-fit", {})
        index, admitted = VictimIndex(view, NOW), set[str]()
        x1, x2 = _job("x1", "high", 8, 950.0), _job("x2", "high", 8, 951.0)
        first = select_victims(x1, "", view, policy, random.Random(0), NOW, admitted, index)
        assert first is not None
        for run in first.victims:
            view.forget(run)
        view.admit(x1, first.gang, "", NOW)
        admitted.add(x1.id)
        if h_ends:
            h = view.running["h"]
            view.detach(h)
            view.forget(h)
        second = select_victims(x2, "", view, policy, random.Random(0), NOW, admitted, index)
        assert second is not None
        nodes = [view.state.nodes[record.node].name for _, record in second.gang.allocs]
    return ([r.workload.id for r in first.victims], [r.workload.id for r in second.victims], nodes,
            answers)


def test_a_second_search_resumes_the_first_walk_and_chooses_as_the_plain_walk() -> None:
    plain = _two_searches(resume=False, h_ends=False)
    resumed = _two_searches(resume=True, h_ends=False)
    assert plain[0] == [f"b{i}" for i in range(8)]
    assert plain[1] == [f"c{i}" for i in range(8)] and plain[2] == ["c"]
    assert resumed[:3] == plain[:3]
    assert resumed[3] == [True]  # the second search took a0..a6 without walking them
    assert plain[3] == []


def test_a_node_changed_since_the_walk_is_checked_not_assumed_full() -> None:
    """After the `high` job on a ends, a holds the pod once a0..a6 go: the second search must land
    there, at a0..a6, as the plain walk does. Resuming past them (as if a were unchanged) would
    free c's jobs too and place on c, the first node first-fit reads."""
    plain = _two_searches(resume=False, h_ends=True)
    resumed = _two_searches(resume=True, h_ends=True)
    assert plain[1] == [f"a{i}" for i in range(7)] and plain[2] == ["a"]
    assert resumed[:3] == plain[:3]
    assert resumed[3] == [False]  # resume refused: a changed and is within the bound


def test_the_stream_after_a_victim_is_the_rest_of_the_stream() -> None:
    """`VictimIndex.by_rank_after` continues the by-rank stream exactly after the given victim."""
    snapshot, _ = _bench()
    policies = load_config(None).policies()
    view = ClusterView.from_snapshot(snapshot, policies.quota, policies.priority_classes)
    view.materialize()
    index = VictimIndex(view, 5000.0)
    preemptor = _job("x", "high", 8, 4000.0)
    cq = view.cluster_queue(preemptor) or ""
    sources = index.sources(preemptor, cq)
    whole = list(index.search_order(preemptor, cq, frozenset(), True, sources)[0])
    assert len(whole) > 20 and len({r.rank for r in whole}) > 1
    for k in (0, 1, len(whole) // 3, len(whole) // 2, len(whole) - 2, len(whole) - 1):
        after = index.by_rank_after(sources, frozenset(), index.place_of(whole[k]))
        assert list(after) == whole[k + 1:]


def _bench() -> tuple[ClusterSnapshot, list[Workload]]:
    import cycle_latency  # (bench/ is on the path: bench_loop puts it there)

    return cycle_latency.build(16, 0, 3)


def _bench_loop(policies: Policies) -> list[tuple[CycleResult, object]]:
    return bench_loop(policies, 16, nodes=60, pending=300, seed=7, churn_seed=3, churn=4)


@pytest.mark.parametrize("config", ["default", "bench/configs/full.yaml"])
def test_the_bench_loop_decides_the_same_resuming_walks(config: str) -> None:
    """Every decision of every cycle (victims in order, placements) and the rng after it equal with
    every victim walked; walks were resumed."""
    policies = load_config(None if config == "default" else ROOT / config).policies()
    answers: list[bool] = []
    told = _recording(answers)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(victim_state.FirstPodFits, "resume", told)
        fast = _bench_loop(policies)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preemption, "resume_walks", False)
        plain = _bench_loop(policies)
    assert sum(answers) >= 5, f"only {sum(answers)} of {len(answers)} searches resumed a walk"
    assert_same_cycles(fast, plain)
    assert sum(len(r.preempted) for r, _ in fast) > 0
