"""EASY backfill: a reservation for the stuck head of the queue, and runtime estimates to honour it.

The head's reservation is the earliest time at which, by the estimated ends of the running
workloads, the head fits (placed with the cycle's placement policy on a "shadow" state: the
pool as it will be then). A later workload may start now only if it ends (by its estimate)
before that time, or if the head still fits in the shadow state with it added: it never delays
the head, as long as the estimates hold. Workloads without an estimate never end in this
reckoning, so they backfill only into room the head does not need.

Estimates come from the user when given, else from history: the mean run time of earlier runs of
the same (tenant, workload name), else of the tenant, else of all, else none. `RuntimeEstimator` keeps that
history and measures its own error.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np

from gpupool.core.model import Workload
from gpupool.core.scheduling.gang import GangPlacement, place_gang, release_gang
from gpupool.core.scheduling.policies.base import NoFit, PlacementPolicy
from gpupool.core.scheduling.view import ClusterView, Running
from gpupool.core.state import BoolArray, ClusterState, clone_state, release_many


@dataclass(slots=True)
class Reservation:
    """The head's reserved start and the shadow state (the pool at that time) that guards it."""

    head: Workload
    start_s: float
    shadow: ClusterState


MAX_RESERVATION_TRIALS = 64
"""How many future end times are tried for the head before giving up on a reservation."""


def reserve(
    head: Workload, view: ClusterView, now_s: float, policy: PlacementPolicy, rng: random.Random
) -> Reservation | None:
    """The earliest time the head fits by the running workloads' estimated ends; None if never."""
    view.materialize()
    # (run.expected_end_s(now_s), id, run) for the runs with an estimate, read off planned_end_s
    runs = sorted(
        (end if end > now_s else now_s, rid, run)
        for rid, run in view.running.items()
        if (end := run.planned_end_s) != math.inf
    )
    if not runs:
        return None
    shadow = clone_state(view.state)
    allowed = _allowed(head, shadow)
    # skip ahead to the first end time at which enough compute is free in aggregate
    if bool(allowed.sum() == shadow.dev_valid.sum()):
        freed = np.cumsum([run.device_milli for _, _, run in runs])
    else:
        freed = np.cumsum([_allowed_milli(run, allowed) for _, _, run in runs])
    short = head.total_device_milli - int(shadow.dev_milli_free[allowed].sum())
    i = int(np.searchsorted(freed, short, side="left")) if short > 0 else 0
    if i >= len(runs):
        return None
    done = 0
    for _ in range(MAX_RESERVATION_TRIALS):
        t = runs[i][0]
        while i < len(runs) and runs[i][0] == t:
            i += 1
        release_many(shadow, [rec for _, _, run in runs[done:i] for _, rec in run.allocs])
        done = i
        gang = place_gang(head, shadow, policy, rng)
        if not isinstance(gang, NoFit):
            release_gang(gang, shadow)
            return Reservation(head, t, shadow)
        if i >= len(runs):
            return None
    return None


def _allowed_milli(run: Running, allowed: BoolArray) -> int:
    return sum(
        m for _, a in run.allocs for d, m in zip(a.devices, a.device_milli, strict=True) if allowed[a.node, d]
    )


def may_backfill(
    gang: GangPlacement,
    estimate_s: float | None,
    reservation: Reservation,
    now_s: float,
    policy: PlacementPolicy,
    rng: random.Random,
) -> bool:
    """Whether a candidate already placed in the live state may start without delaying the head.

    On True the candidate also holds its resources in the shadow state (when it outlasts the
    reservation); on False the shadow state is unchanged.
    """
    if estimate_s is not None and now_s + estimate_s <= reservation.start_s:
        return True
    shadow = reservation.shadow
    statement = shadow.statement()
    for _, record in gang.allocs:
        statement.allocate(record)
    head = place_gang(reservation.head, shadow, policy, rng)
    if isinstance(head, NoFit):
        statement.discard()
        return False
    release_gang(head, shadow)
    statement.commit()
    return True


def _allowed(w: Workload, state: ClusterState) -> BoolArray:
    if any(not p.allowed_models for p in w.pods if p.num_devices):
        return state.allowed_devices(frozenset())
    return state.allowed_devices(frozenset().union(*(p.allowed_models for p in w.pods)))


@dataclass(slots=True)
class EstimateError:
    """Running totals of the estimator's error over finished workloads that had an estimate."""

    count: int = 0
    abs_error_s: float = 0.0
    abs_rel_error: float = 0.0
    under: int = 0

    def add(self, estimate_s: float, actual_s: float) -> None:
        self.count += 1
        self.abs_error_s += abs(estimate_s - actual_s)
        self.abs_rel_error += abs(estimate_s - actual_s) / max(actual_s, 1.0)
        self.under += estimate_s < actual_s

    def summary(self) -> dict[str, float]:
        n = max(self.count, 1)
        return {
            "estimated": self.count,
            "mean_abs_error_s": self.abs_error_s / n,
            "mean_abs_rel_error": self.abs_rel_error / n,
            "underestimated_pct": 100.0 * self.under / n,
        }


@dataclass(slots=True)
class RuntimeEstimator:
    """Run-time history per (tenant, workload name) and per tenant; the user's estimate wins."""

    by_name: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    by_tenant: dict[str, tuple[int, float]] = field(default_factory=dict)
    overall: tuple[int, float] = (0, 0.0)
    user_error: EstimateError = field(default_factory=EstimateError)
    history_error: EstimateError = field(default_factory=EstimateError)

    def estimate_s(self, w: Workload) -> float | None:
        """The user's estimate, else the history mean (by name, then by tenant), else None."""
        if w.runtime_estimate_s is not None:
            return w.runtime_estimate_s
        return self.history_s(w)

    def history_s(self, w: Workload) -> float | None:
        for found in (
            self.by_name.get((w.tenant, w.name)) if w.name else None,
            self.by_tenant.get(w.tenant),
            self.overall if self.overall[0] else None,
        ):
            if found is not None:
                return found[1] / found[0]
        return None

    def observe(self, w: Workload, actual_s: float, estimate_used_s: float | None) -> None:
        """A workload finished after `actual_s` of run time; record it and the error of its estimate."""
        if estimate_used_s is not None:
            target = self.user_error if w.runtime_estimate_s is not None else self.history_error
            target.add(estimate_used_s, actual_s)
        if w.name:
            n, total = self.by_name.get((w.tenant, w.name), (0, 0.0))
            self.by_name[(w.tenant, w.name)] = (n + 1, total + actual_s)
        n, total = self.by_tenant.get(w.tenant, (0, 0.0))
        self.by_tenant[w.tenant] = (n + 1, total + actual_s)
        self.overall = (self.overall[0] + 1, self.overall[1] + actual_s)
