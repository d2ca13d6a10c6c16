"""The reservation search finds the first end time at which the head passes the device check by
doubling and halving batches of end times (`backfill._first_passing`); it must reserve exactly as
checking every end time in turn does (the plain walk below, the search as it was)."""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import replace

import numpy as np
import pytest

from factories import cluster, pod, workload
from gpupool.core.model import Workload
from gpupool.core.scheduling import backfill
from gpupool.core.scheduling.backfill import Reservation
from gpupool.core.scheduling.cycle import Policies, cycle_on
from gpupool.core.scheduling.gang import place_gang, release_gang
from gpupool.core.scheduling.policies.base import NoFit, make_policy
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.state import ClusterState, clone_state, release_many

EASY = Policies(placement="first-fit", ordering="fifo", backfill=True)


def _plain_first_fit_in_time(
    head: Workload, view: ClusterView, now_s: float, policy: object, rng: random.Random,
    ends: list[tuple[float, str]], end_milli: list[int],
) -> Reservation | None:
    """The search checking every end time in turn, from the first with enough compute free."""
    running = view.running
    shadow = clone_state(view.state)
    allowed = backfill._allowed(head, shadow)
    if bool(allowed.sum() == shadow.dev_valid.sum()):
        freed = np.cumsum(end_milli)
    else:
        freed = np.cumsum([backfill._allowed_milli(running[rid], allowed) for _, rid in ends])
    short = head.total_device_milli - int(shadow.dev_milli_free[allowed].sum())
    i = int(np.searchsorted(freed, short, side="left")) if short > 0 else 0
    if i >= len(ends):
        return None
    done = 0
    could_fit = backfill._device_check(head, backfill._required_domains(head, view, policy))  # type: ignore[arg-type]
    trials = 0
    while trials < backfill.MAX_RESERVATION_TRIALS:
        t = max(ends[i][0], now_s)
        i = bisect.bisect_right(ends, t, lo=i, key=backfill._end)
        release_many(shadow, [rec for _, rid in ends[done:i] for _, rec in running[rid].allocs])
        done = i
        if could_fit(shadow):
            trials += 1
            gang = place_gang(head, shadow, policy, rng)  # type: ignore[arg-type]
            if not isinstance(gang, NoFit):
                release_gang(gang, shadow)
                return Reservation(head, t, shadow, fits_on=backfill.nodes_mask(gang, shadow))
        if i >= len(ends):
            return None
    return None


def _state_key(state: ClusterState) -> tuple[object, ...]:
    arrays = (state.cpu_free, state.mem_free, state.dev_milli_free, state.dev_mem_free, state.node_version)
    kinds = [sorted(k.items()) for k in state.node_pod_kinds]
    return (*(a.tolist() for a in arrays), state.heavy_slices, kinds)


def _busy_pool(rng: random.Random) -> tuple[ClusterView, float]:
    """A pool of 6 nodes x 4 devices filled with whole and fractional pods and gangs of random
    estimates (some alike, some overdue by the time returned)."""
    view = ClusterView.empty(cluster(6, devices=4))
    now = 0.0
    for k in range(40):
        shape = rng.choice([0.25, 0.5, 1, 2, 4])
        pods = tuple(pod(shape) for _ in range(rng.choice([1, 1, 2, 3])))
        estimate = rng.choice([None, float(rng.choice([50, 100, 100, 200, 300, 400, 800]))])
        w = replace(workload(*pods, wid=f"r{k}", submit_s=now), runtime_estimate_s=estimate)
        cycle_on(view, [w], EASY, now, random.Random(k))
        now += rng.choice([0.0, 5.0, 10.0])
    return view, now + rng.choice([0.0, 60.0, 150.0])


@pytest.mark.parametrize("seed", range(40))
def test_the_batched_search_reserves_as_checking_every_end_time(seed: int) -> None:
    rng = random.Random(seed)
    view, now = _busy_pool(rng)
    view.materialize()
    if not view.ends:
        pytest.skip("no run with an estimate")
    ends, end_milli, _ = backfill._expected_ends(view, now, True)
    policy = make_policy("first-fit")
    checked = 0
    for h in range(12):
        shape = rng.choice([0.5, 1, 2, 3, 4])
        head = workload(*(pod(shape) for _ in range(rng.choice([1, 2, 3, 5]))), wid=f"head{h}")
        fast = backfill._first_fit_in_time(head, view, now, policy, random.Random(h), ends, end_milli)
        plain = _plain_first_fit_in_time(head, view, now, policy, random.Random(h), ends, end_milli)
        assert (fast is None) == (plain is None)
        if fast is not None and plain is not None:
            checked += 1
            assert fast.start_s == plain.start_s
            assert np.array_equal(fast.fits_on, plain.fits_on)  # type: ignore[arg-type]
            assert _state_key(fast.shadow) == _state_key(plain.shadow)
    assert checked or math.isfinite(now)
