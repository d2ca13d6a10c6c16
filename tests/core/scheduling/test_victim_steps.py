"""The greedy victim search's bound in array passes (`FirstPodFits.within_steps`, used by
`preemption._first_fitting`) is the bound per victim: the same nodes after each victim, so the
search checks and places on the same states and decides the same."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest
import test_victim_search as search
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.config import load_config
from gpupool.core.model import Allocation, ClusterSnapshot, Device, Node, PodRequest
from gpupool.core.quota import QuotaConfig
from gpupool.core.scheduling import preemption
from gpupool.core.scheduling.cycle import CycleResult, Policies
from gpupool.core.scheduling.keeper import ViewKeeper
from gpupool.core.scheduling.victim_state import FirstPodFits
from gpupool.core.scheduling.view import ClusterView

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import cycle_latency

ROOT = Path(__file__).resolve().parents[3]


def _pool(nodes: int, seed: int) -> ClusterView:
    """A full pool of the cycle benchmark's shapes, with two device models (so a pod may refuse some)."""
    snapshot, _ = cycle_latency.build(nodes, 0, seed)
    mixed = tuple(
        Node(n.name, n.cpu_milli, n.memory_mib,
             tuple(Device(d.uuid, "A100" if (i + d.index) % 3 == 0 else d.model, d.index, d.memory_mib)
                   for d in n.devices))
        for i, n in enumerate(snapshot.nodes))
    view = ClusterView.from_snapshot(ClusterSnapshot(mixed, snapshot.allocations))
    view.materialize()
    return view


pods = st.builds(
    lambda shape, cpu, models: PodRequest("p", cpu_milli=cpu, memory_mib=8192, num_devices=shape[0],
                                          device_milli=shape[1], allowed_models=models),
    st.sampled_from([(0, 0), (1, 250), (1, 500), (1, 1000), (2, 1000), (4, 1000), (8, 1000)]),
    st.sampled_from([1000, 8000, 40_000, 95_000]),
    st.sampled_from([frozenset(), frozenset({"A100"}), frozenset({"V100M32"})]),
)


@settings(max_examples=60, deadline=None)
@given(pods, st.integers(0, 5), st.integers(0, 40), st.lists(st.integers(1, 40), min_size=1, max_size=6),
       st.randoms(use_true_random=False))
def test_bound_in_arrays_is_the_bound_per_victim(pod: PodRequest, seed: int, before: int, chunks: list[int],
                                                  order: random.Random) -> None:
    """After each victim, the nodes it freed that are within the bound: per victim (`freed`, the
    amounts `fits_somewhere` reads) and in array passes over chunks of any size, carried on from
    the victims before them told one by one."""
    view = _pool(12, seed)
    runs = list(view.running.values())
    order.shuffle(runs)
    plain = FirstPodFits(view.state, pod)
    expected: list[list[int]] = []
    for run in runs:
        plain.freed(run)
        expected.append(sorted(n for n in plain.touched if plain._within(n, plain.free[n])))
        plain.touched.clear()

    fast = FirstPodFits(view.state, pod)
    for run in runs[:before]:
        fast.freed(run)
    got: list[list[int]] = []
    at = min(before, len(runs))
    for size in chunks * len(runs):
        if at >= len(runs):
            break
        got += [sorted(rows) for rows in fast.within_steps(runs[at:at + size])]
        at += size
    assert got == expected[min(before, len(runs)):]


def _bench_loop(policies: Policies, cycles: int, churn: int = 4) -> list[tuple[CycleResult, object]]:
    """The cycle benchmark's loop, scaled down (60 nodes, 300 waiting): per cycle its result and
    the rng's state after it."""
    snapshot, pending = cycle_latency.build(60, 300, seed=7)
    rng = random.Random(3)
    keeper = ViewKeeper()
    running = {a.workload.id: a for a in snapshot.allocations}
    waiting = {w.id: w for w in pending}
    now, serial, out = 3600.0, 500_000, []
    for k in range(cycles):
        for wid in rng.sample(sorted(running), min(churn, len(running))):
            del running[wid]
        for _ in range(churn):
            w = cycle_latency._workload(serial, rng, now)
            serial += 1
            waiting[w.id] = w
        current = ClusterSnapshot(snapshot.nodes, tuple(running.values()))
        draws = random.Random(k)
        result = keeper.cycle(current, list(waiting.values()), policies, now, draws)
        for stop in result.preempted:
            waiting[stop.workload_id] = running.pop(stop.workload_id).workload
        for admission in result.admitted:
            w = waiting.pop(admission.workload_id)
            running[w.id] = Allocation(w, admission.placements, now)
        out.append((result, draws.getstate()))
        now += 10.0
    return out


@pytest.mark.parametrize("config", ["default", "bench/configs/full.yaml"])
def test_the_bench_loop_decides_the_same_with_the_bound_in_arrays(config: str) -> None:
    """Every decision of every cycle (victims, their order, placements) and the rng after it equal
    with the bound per victim; the array passes did find the victims of most searches."""
    policies = load_config(None if config == "default" else ROOT / config).policies()
    calls = []
    original = preemption._first_fitting

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        found = original(*args, **kwargs)
        calls.append(found is not None)
        return found

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preemption, "_first_fitting", counted)
        fast = _bench_loop(policies, cycles=8)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preemption, "array_steps", False)
        plain = _bench_loop(policies, cycles=8)
    assert sum(calls) >= 10, f"the array passes found only {sum(calls)} searches' victims"
    for (a, rng_a), (b, rng_b) in zip(fast, plain, strict=True):
        assert a.decisions == b.decisions
        assert list(map(type, a.decisions)) == list(map(type, b.decisions))
        assert a.preempted == b.preempted
        assert rng_a == rng_b
    assert sum(len(r.preempted) for r, _ in fast) > 0


@settings(max_examples=120, deadline=None)
@given(search.steps, search.placements, st.sampled_from(["priority-fifo", "drf"]), st.booleans(),
       st.integers(2, 6))
def test_gangs_under_quotas_decide_the_same_with_the_bound_in_arrays(
    plan: list[Any], placement: tuple[str, dict[str, Any]], ordering: str, quota: bool, nodes: int
) -> None:
    """Random gangs, quotas and policies (`test_victim_search`'s cases): every cycle's decisions, the
    rng's state and the policy's count of its calls equal with the bound per victim (a placement
    after the victim the first pod fits with may fail: the search goes on from the next one)."""
    policies = Policies(placement=placement[0], placement_options=placement[1], ordering=ordering,
                        preemption=True, quota=search.QUOTA if quota else QuotaConfig())
    fast = search._drive(plan, policies, nodes, nodes)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preemption, "array_steps", False)
        plain = search._drive(plan, policies, nodes, nodes)
    assert fast == plain
