"""Victim selection: which running workloads a pending one may preempt, and the cheapest such set.

Candidates are (a) lower-ranked, preemptible workloads of the preemptor's own ClusterQueue and
(b) when the preemptor's queue stays within its nominal quota (it reclaims what it lent), any
preemptible workload of a borrowing ClusterQueue in the same cohort. Among the sets that make the
preemptor fit (quota and placement), we prefer the fewest victims, then the least work lost:
a single victim is searched exhaustively (least lost work first); otherwise victims are added
greedily (lowest rank, least lost work first) and then every victim that is not needed is
dropped again, most lost work first.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Set
from dataclasses import dataclass

from gpupool.core.model import Workload
from gpupool.core.scheduling.gang import GangPlacement, place_gang, release_gang
from gpupool.core.scheduling.policies.base import NoFit, PlacementPolicy
from gpupool.core.scheduling.view import ClusterView, Running, lower_bound_usage

MAX_SINGLE_TRIALS = 16
"""How many single-victim sets are tried before falling back to the greedy search."""

MAX_TRIM_TRIALS = 24
"""How many of the greedy victims (costliest first) are tried for dropping again."""


def checkpoint_split(done_s: float, interval_s: float | None) -> tuple[float, float]:
    """Work done split into (kept at the last checkpoint, lost): all is lost without checkpoints."""
    if not interval_s or interval_s <= 0:
        return 0.0, max(0.0, done_s)
    kept = math.floor(max(0.0, done_s) / interval_s) * interval_s
    return kept, done_s - kept


def lost_work_s(run: Running, now_s: float) -> tuple[float, float]:
    """(progress to resume from, run time lost) if `run` stopped at `now_s` (wall-clock pace)."""
    done = run.progress_s + max(0.0, now_s - run.start_time_s)
    kept, _ = checkpoint_split(done, run.workload.checkpoint_interval_s)
    if not run.workload.checkpoint_interval_s:
        return 0.0, max(0.0, now_s - run.start_time_s)
    kept = max(kept, run.progress_s)
    return kept, done - kept


def lost_device_s(run: Running, now_s: float) -> float:
    return lost_work_s(run, now_s)[1] * run.device_count


@dataclass(frozen=True, slots=True)
class VictimSet:
    """The chosen victims, why each goes (own-queue preemption or cohort reclaim), and the gang."""

    victims: tuple[Running, ...]
    reclaimed: frozenset[str]
    gang: GangPlacement


def candidates(
    preemptor: Workload, cq: str, view: ClusterView, exclude: Set[str] = frozenset()
) -> tuple[list[Running], frozenset[str]]:
    """Eligible victims (never those in `exclude`) and the ids among them that are cohort reclaims."""
    view.materialize()
    rank = view.classes.rank(preemptor)
    demand = lower_bound_usage(preemptor)
    reclaim_ok = view.quota.config.enabled and view.quota.within_nominal(cq, demand)
    members = set(view.quota.cohort_members(cq)) if reclaim_ok else set()
    borrowing = {m for m in members if m != cq and view.quota.is_borrowing(m)}
    found: list[Running] = []
    reclaim: set[str] = set()
    for run in view.by_queue.get(cq, {}).values():
        if run.preemptible and run.rank < rank and run.workload.id not in exclude:
            found.append(run)
    for member in sorted(borrowing - {cq}):
        for run in view.by_queue.get(member, {}).values():
            if run.preemptible and run.workload.id not in exclude:
                found.append(run)
                reclaim.add(run.workload.id)
    return found, frozenset(reclaim)


def select_victims(
    preemptor: Workload,
    cq: str,
    view: ClusterView,
    policy: PlacementPolicy,
    rng: random.Random,
    now_s: float,
    exclude: Set[str] = frozenset(),
    costs: dict[str, float] | None = None,
) -> VictimSet | None:
    """The victims to preempt so `preemptor` fits, with its placement taken; None leaves all unchanged.

    `exclude`: workloads that may not be victims (those admitted earlier in the same cycle).
    `costs`: a cache of `lost_device_s` at `now_s` by workload id, shared by a cycle's searches.
    """
    found, reclaim = candidates(preemptor, cq, view, exclude)
    if not found:
        return None
    known = {} if costs is None else costs
    for r in found:
        if r.workload.id not in known:
            known[r.workload.id] = lost_device_s(r, now_s)
    cost = known
    need = preemptor.total_device_milli - free_milli(view, preemptor)

    def fits() -> GangPlacement | None:
        return _fits(preemptor, cq, view, policy, rng)

    singles = heapq.nsmallest(
        MAX_SINGLE_TRIALS, found, key=lambda r: (cost[r.workload.id], r.rank, r.workload.id)
    )
    for run in singles:
        if run.device_milli < need:
            continue
        view.detach(run)
        gang = fits()
        if gang is not None:
            return VictimSet((run,), reclaim & {run.workload.id}, gang)
        view.attach(run)
    found.sort(key=lambda r: (r.rank, cost[r.workload.id], r.workload.id))
    chosen = _greedy(found, need, view, fits)
    if chosen is None:
        return None
    chosen = _trim(chosen, cost, view, fits)
    gang = fits()
    if gang is None:  # cannot happen: _trim keeps the set feasible; restore to be safe
        for run in chosen:
            view.attach(run)
        return None
    ids = {r.workload.id for r in chosen}
    return VictimSet(tuple(chosen), reclaim & ids, gang)


def _greedy(
    found: list[Running], need: int, view: ClusterView, fits: Callable[[], GangPlacement | None]
) -> list[Running] | None:
    chosen: list[Running] = []
    freed = 0
    for run in found:
        view.detach(run)
        chosen.append(run)
        freed += run.device_milli
        if freed < need:
            continue
        gang = fits()
        if gang is not None:
            release_gang(gang, view.state)
            return chosen
    for run in reversed(chosen):
        view.attach(run)
    return None


def _trim(
    chosen: list[Running], cost: dict[str, float], view: ClusterView, fits: Callable[[], GangPlacement | None]
) -> list[Running]:
    """Drop every victim the preemptor does not need, trying the costliest first."""
    keep = list(chosen)
    for run in sorted(chosen, key=lambda r: -cost[r.workload.id])[:MAX_TRIM_TRIALS]:
        if len(keep) == 1:
            break
        view.attach(run)
        gang = fits()
        if gang is None:
            view.detach(run)
            continue
        release_gang(gang, view.state)
        keep.remove(run)
    return keep


def _fits(
    w: Workload, cq: str, view: ClusterView, policy: PlacementPolicy, rng: random.Random
) -> GangPlacement | None:
    """Place `w` if both quota and capacity allow it now (quota is not charged; the caller admits)."""
    if view.quota.fits(cq, lower_bound_usage(w)) is not None:
        return None
    gang = place_gang(w, view.state, policy, rng)
    if isinstance(gang, NoFit):
        return None
    if view.quota.fits(cq, view.usage_of(gang.allocs)) is not None:
        release_gang(gang, view.state)
        return None
    return gang


def free_milli(view: ClusterView, w: Workload) -> int:
    """Free compute (milli) on the devices any of the workload's pods may use."""
    state = view.state
    if any(not p.allowed_models for p in w.pods if p.num_devices):
        models: frozenset[str] = frozenset()
    else:
        models = frozenset().union(*(p.allowed_models for p in w.pods))
    return int(state.dev_milli_free[state.allowed_devices(models)].sum())
