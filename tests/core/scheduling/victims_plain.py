"""The plain definition of the victim search, kept for tests: what `select_victims` must decide.

It is the search as it stood at commit 9612e0a with every shortcut taken out: the candidates are
listed and sorted in full (`candidates()`), every single-victim trial places the preemptor, the
greedy step detaches victims one by one and scans every node, and victims go back one by one. The
optimised search must make the same placement calls on the same states (so the same victims, the
same placement, and the same draws from the rng and the same policy state), except calls whose
first pod fits no node: those return NoFit without touching the rng, so leaving one out changes
nothing for a policy whose `place` keeps no count of its calls.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Set

from gpupool.core.model import Workload
from gpupool.core.scheduling.gang import GangPlacement, place_gang, release_gang
from gpupool.core.scheduling.policies.base import NoFit, PlacementPolicy
from gpupool.core.scheduling.preemption import (
    DEFAULT_RULES,
    MAX_SINGLE_TRIALS,
    MAX_TRIM_TRIALS,
    VictimIndex,
    VictimSet,
    candidates,
    free_milli,
    lost_device_s,
)
from gpupool.core.scheduling.reach import PreemptionRules
from gpupool.core.scheduling.view import ClusterView, Running
from gpupool.core.scheduling.workloads import lower_bound_usage


def select_victims_plain(
    preemptor: Workload,
    cq: str,
    view: ClusterView,
    policy: PlacementPolicy,
    rng: random.Random,
    now_s: float,
    exclude: Set[str] = frozenset(),
    index: VictimIndex | None = None,
    rules: PreemptionRules = DEFAULT_RULES,
) -> VictimSet | None:
    found, reclaim = candidates(preemptor, cq, view, exclude, rules)
    if not found:
        return None
    cost = {r.workload.id: lost_device_s(r, now_s) for r in found}
    by_cost = sorted(found, key=lambda r: (cost[r.workload.id], r.rank, r.workload.id))
    by_rank = sorted(found, key=lambda r: (r.rank, cost[r.workload.id], r.workload.id))
    need = preemptor.total_device_milli - free_milli(view, preemptor)

    def fits() -> GangPlacement | None:
        if view.quota.fits(cq, lower_bound_usage(preemptor)) is not None:
            return None
        gang = place_gang(preemptor, view.state, policy, rng)
        if isinstance(gang, NoFit):
            return None
        if view.quota.fits(cq, view.usage_of(gang.allocs)) is not None:
            release_gang(gang, view.state)
            return None
        return gang

    for run in by_cost[:MAX_SINGLE_TRIALS]:
        if run.device_milli < need:
            continue
        view.detach(run)
        gang = fits()
        if gang is not None:
            return VictimSet((run,), reclaim & {run.workload.id}, gang)
        view.attach(run)
    chosen = _greedy(preemptor, by_rank, need, view, fits)
    if chosen is None:
        return None
    chosen = _trim(chosen, cost, view, fits)
    gang = fits()
    assert gang is not None
    return VictimSet(tuple(chosen), reclaim & {r.workload.id for r in chosen}, gang)


def _greedy(
    preemptor: Workload,
    found: list[Running],
    need: int,
    view: ClusterView,
    fits: Callable[[], GangPlacement | None],
) -> list[Running] | None:
    chosen: list[Running] = []
    freed = 0
    for run in found:
        view.detach(run)
        chosen.append(run)
        freed += run.device_milli
        if freed < need or not view.state.node_fits(preemptor.pods[0]).any():
            continue
        gang = fits()
        if gang is None:
            continue
        release_gang(gang, view.state)
        # Drop, in one step, the victims holding nothing on the nodes of the placement found.
        nodes = {a.node for _, a in gang.allocs}
        apart = [r for r in chosen if all(a.node not in nodes for _, a in r.allocs)]
        if not apart or len(apart) == len(chosen):
            return chosen
        for r in apart:
            view.attach(r)
        trial = fits()
        if trial is None:
            for r in reversed(apart):
                view.detach(r)
            return chosen
        release_gang(trial, view.state)
        dropped = {id(r) for r in apart}
        return [r for r in chosen if id(r) not in dropped]
    for run in reversed(chosen):
        view.attach(run)
    return None


def _trim(
    chosen: list[Running], cost: dict[str, float], view: ClusterView, fits: Callable[[], GangPlacement | None]
) -> list[Running]:
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
