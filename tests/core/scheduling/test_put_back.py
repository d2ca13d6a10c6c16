"""Victims put back from the free amounts before the search (`victim_state.attach_back`, used by
`preemption._drop_apart`) leave the state and quota exactly as putting back each one's records
(`attach_all`) does: the same searches, the same decisions."""

from __future__ import annotations

import functools
import random
import sys
from pathlib import Path

import pytest
from bench_loop import assert_same_cycles, bench_loop
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.config import load_config
from gpupool.core.model import ClusterSnapshot
from gpupool.core.scheduling import preemption, victim_state
from gpupool.core.scheduling.cycle import CycleResult, Policies
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.state import free_amounts

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import cycle_latency

ROOT = Path(__file__).resolve().parents[3]


@functools.cache
def _snapshot(seed: int) -> ClusterSnapshot:
    return cycle_latency.build(16, 0, seed)[0]


def _view(seed: int) -> ClusterView:
    """A full pool of the cycle benchmark's shapes (fractions of devices among them), with the
    full configuration's quotas, so putting work back adds quota usage too."""
    snapshot = _snapshot(seed)
    policies = load_config(ROOT / "bench/configs/full.yaml").policies()
    view = ClusterView.from_snapshot(snapshot, policies.quota, policies.priority_classes)
    view.materialize()
    return view


def _everything(view: ClusterView) -> tuple[object, ...]:
    state = view.state
    return (state.cpu_free.tolist(), state.mem_free.tolist(), state.dev_milli_free.tolist(),
            state.dev_mem_free.tolist(), state.heavy_slices, state.node_version.tolist(),
            [dict(kinds) for kinds in state.node_pod_kinds],
            {q: dict(u) for q, u in view.quota.usage.items()})


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 4), st.randoms(use_true_random=False), st.integers(1, 60), st.integers(0, 5))
def test_putting_back_from_the_base_is_putting_back_each_run(seed: int, order: random.Random, taken: int,
                                                             kept: int) -> None:
    """Victims taken off in two steps (as the greedy search flushes them), some put back: every free
    amount, the heavy slices, node versions, pods per node and quota usage equal either way."""
    views = [_view(seed), _view(seed)]
    runs = sorted(views[0].running)
    order.shuffle(runs)
    chosen = runs[:taken]
    back, held = chosen[kept:], chosen[:kept]
    for view, fast in zip(views, (True, False), strict=True):
        base = free_amounts(view.state)
        victims = [view.running[w] for w in chosen]
        half = len(victims) // 2
        victim_state.detach_all(view, victims[:half])
        victim_state.detach_all(view, victims[half:])
        out = [view.running[w] for w in back]
        if fast:
            victim_state.attach_back(view, out, base, [view.running[w] for w in held])
        else:
            victim_state.attach_all(view, out)
    assert _everything(views[0]) == _everything(views[1])


def _bench_loop(policies: Policies, cycles: int) -> list[tuple[CycleResult, object]]:
    """60 nodes, 300 waiting: per cycle its result and the rng's state after it."""
    return bench_loop(policies, cycles, nodes=60, pending=300, seed=7, churn_seed=3, churn=4)


@pytest.mark.parametrize("config", ["default", "bench/configs/full.yaml"])
def test_the_bench_loop_decides_the_same_putting_back_from_the_base(config: str) -> None:
    """Every decision of every cycle (victims and their order, placements) and the rng after it equal
    with the victims put back one record at a time; the searches did put victims back this way
    (their trials all made: with `place_known`, the default's never put victims back)."""
    policies = load_config(None if config == "default" else ROOT / config).policies()
    calls = []
    original = victim_state.attach_back

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(args[1]))
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(victim_state, "attach_back", counted)
        mp.setattr(preemption, "place_known", False)
        fast = _bench_loop(policies, cycles=16)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preemption, "place_known", False)
        mp.setattr(preemption, "put_back_from_base", False)
        plain = _bench_loop(policies, cycles=16)
    assert len(calls) >= 5, f"only {len(calls)} searches put victims back from the base"
    assert_same_cycles(fast, plain)
    assert sum(len(r.preempted) for r, _ in fast) > 0
