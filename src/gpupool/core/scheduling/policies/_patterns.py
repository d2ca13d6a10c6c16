"""Device fill patterns for fractional pods: the Gilmore-Gomory cutting-stock LP.

Fractional pods share devices; every device they open and leave partly empty is capacity no later
pod may be able to use. Which sizes should share a device is a cutting-stock problem: given how
often each slice size is asked for, choose fill patterns (how many slices of each size go on one
device, at most one device's worth) and how often to use each, so that every slice is covered by
as few devices as possible. Its LP relaxation is solved by column generation (Gilmore and Gomory,
1961): start with one single-size pattern per size, solve the LP, price a new pattern with an
unbounded knapsack over the LP's dual values, and stop when no pattern prices below one device.

The LP is small (one row per distinct slice size) and solved with HiGHS through scipy, imported
only when a plan is first computed. The result is deterministic for the same size counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from gpupool.core.units import MILLI

_MAX_ROUNDS = 200
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class FillPlan:
    """Patterns over `sizes`: counts[k, i] slices of sizes[i] on one device, used weight[k] times."""

    sizes: tuple[int, ...]
    counts: npt.NDArray[np.int64]
    weight: npt.NDArray[np.float64]
    devices_lp: float
    """The LP's optimum: a lower bound on the devices any packing of the given slices needs."""


def plan_patterns(demand: Mapping[int, int], capacity: int = MILLI) -> FillPlan | None:
    """The LP-optimal fill patterns for `demand` (slice milli -> how many), or None when empty."""
    items = tuple(sorted((int(s), int(c)) for s, c in demand.items() if 0 < s < capacity and c > 0))
    if not items:
        return None
    return _solve(items, capacity)


@lru_cache(maxsize=32)
def _solve(items: tuple[tuple[int, int], ...], capacity: int) -> FillPlan:
    from scipy.optimize import linprog  # heavy; only the policies that plan need it

    sizes = tuple(s for s, _ in items)
    need = np.array([c for _, c in items], dtype=np.float64)
    unit = math.gcd(capacity, *sizes)
    weights = [s // unit for s in sizes]
    room = capacity // unit
    patterns: list[list[int]] = [
        [room // weights[i] if j == i else 0 for j in range(len(sizes))] for i in range(len(sizes))
    ]
    result = None
    for _ in range(_MAX_ROUNDS):
        matrix = np.array(patterns, dtype=np.float64).T
        result = linprog(np.ones(matrix.shape[1]), A_ub=-matrix, b_ub=-need, bounds=(0, None), method="highs")
        if result.status != 0:  # pragma: no cover - the LP is always feasible and bounded
            break
        duals = -np.asarray(result.ineqlin.marginals, dtype=np.float64)
        value, column = _knapsack(weights, duals, room)
        if value <= 1.0 + _EPS or column in patterns:
            break
        patterns.append(column)
    assert result is not None
    x = np.asarray(result.x, dtype=np.float64)
    keep = x > _EPS
    return FillPlan(
        sizes=sizes,
        counts=np.array(patterns, dtype=np.int64)[keep],
        weight=x[keep],
        devices_lp=float(result.fun),
    )


def _knapsack(weights: list[int], values: npt.NDArray[np.float64], room: int) -> tuple[float, list[int]]:
    """Unbounded knapsack: the most valuable multiset of items (weights, values) within `room`."""
    best = np.zeros(room + 1, dtype=np.float64)
    take = np.full(room + 1, -1, dtype=np.int64)
    for c in range(1, room + 1):
        best[c], take[c] = best[c - 1], -1
        for i, w in enumerate(weights):
            if w <= c and best[c - w] + values[i] > best[c] + _EPS:
                best[c], take[c] = best[c - w] + values[i], i
    column = [0] * len(weights)
    c = room
    while c > 0:
        i = int(take[c])
        if i < 0:
            c -= 1
            continue
        column[i] += 1
        c -= weights[i]
    return float(best[room]), column
