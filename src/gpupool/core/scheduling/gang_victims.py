"""A preempting gang's victims taken where it lands on as few nodes as possible.

The victim search (`preemption.select_victims`) wants the fewest victims and the least lost work:
a gang of two 4-device pods on a pool of 8-device nodes, each running two 4-device jobs, gets the
two cheapest jobs, one on each node, and lands split over two nodes. A gang talks over the fabric
between its nodes; on one node it talks over NVLink. So, once the search has chosen, `fewer_nodes`
looks for the smallest set of nodes that could hold the gang with the candidates on them stopped
(nodes with the most room first); when that set is smaller than the nodes the gang was placed on,
the gang is placed within it, stopping candidates there only (highest rank and most lost work are
given back first while it still fits). Fewer nodes goes before fewer victims; when no such
placement is found the search's choice stands, exactly as it was.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Set

import numpy as np

from gpupool.core.model import Workload, shared_labels
from gpupool.core.scheduling.domains import only
from gpupool.core.scheduling.gang import GangPlacement, hold_gang, release_gang
from gpupool.core.scheduling.policies.base import PlacementPolicy
from gpupool.core.scheduling.preemption import LostWork, VictimSet, _fits
from gpupool.core.scheduling.victim_state import attach_all, detach_all
from gpupool.core.scheduling.view import ClusterView, Running
from gpupool.core.state import row_sums


def fewer_nodes(
    chosen: VictimSet,
    preemptor: Workload,
    cq: str,
    view: ClusterView,
    policy: PlacementPolicy,
    rng: random.Random,
    candidates: Iterable[Running],
    cost: LostWork,
    reclaim_queues: Set[str],
) -> VictimSet:
    """`chosen`, or victims among `candidates` on which the gang lands on fewer nodes.

    On entry and on return the state holds the returned gang with its victims taken off (as
    `select_victims` leaves it). `cost`: the lost device-seconds of the candidates (by run).
    """
    spread = len(set(chosen.gang.nodes))
    if len(preemptor.pods) < 2 or spread < 2:
        return chosen
    state = view.state
    release_gang(chosen.gang, state)
    attach_all(view, list(chosen.victims))
    pool = list(candidates)
    nodes = _fewest_nodes(preemptor, view, pool)
    better = None
    if nodes is not None and len(nodes) < spread:
        better = _within(preemptor, cq, view, policy, rng, pool, nodes, cost)
    if better is None or len(set(better[1].nodes)) >= spread:
        if better is not None:
            release_gang(better[1], state)
            attach_all(view, better[0])
        detach_all(view, list(chosen.victims))
        hold_gang(chosen.gang, state)
        return chosen
    victims, gang = better
    reclaimed = frozenset(r.workload.id for r in victims if r.cluster_queue in reclaim_queues)
    return VictimSet(tuple(victims), reclaimed, gang)


def _fewest_nodes(preemptor: Workload, view: ClusterView, pool: list[Running]) -> list[int] | None:
    """The fewest nodes whose free device compute plus what `pool` holds there covers the gang's
    (the nodes with the most such room first, ties by index); None when all of them do not."""
    state = view.state
    labels = shared_labels(preemptor.pods)
    allowed = state.allowed_devices(_models(preemptor), labels)
    room = row_sums(state.dev_milli_free * allowed)
    for run in pool:
        for _, a in run.allocs:
            room[a.node] += sum(a.device_milli)
    room[~state.schedulable] = 0
    if labels:
        room[~state.labelled(labels)] = 0
    order = sorted(range(len(room)), key=lambda n: (-int(room[n]), n))
    need = preemptor.total_device_milli
    total = 0
    for i, n in enumerate(order):
        total += int(room[n])
        if total >= need:
            return order[: i + 1]
    return None


def _models(w: Workload) -> frozenset[str]:
    """The device models every pod accepts (empty: any), as `preemption.free_milli` reads them."""
    if any(not p.allowed_models for p in w.pods if p.num_devices):
        return frozenset()
    return frozenset().union(*(p.allowed_models for p in w.pods))


def _within(
    preemptor: Workload,
    cq: str,
    view: ClusterView,
    policy: PlacementPolicy,
    rng: random.Random,
    pool: list[Running],
    nodes: list[int],
    cost: LostWork,
) -> tuple[list[Running], GangPlacement] | None:
    """Stop every candidate holding something on `nodes`, place the gang there, then give back the
    victims it does not need (highest rank, then most lost work, first). The state then holds the
    gang with the victims taken off; None leaves it as it was."""
    inside = set(nodes)
    mask = np.zeros(len(view.state.nodes), dtype=bool)
    mask[nodes] = True
    there = [r for r in pool if any(a.node in inside for _, a in r.allocs)]
    if not there:
        return None
    detach_all(view, there)
    gang = _fits_on(preemptor, cq, view, policy, rng, mask)
    if gang is None:
        attach_all(view, there)
        return None
    keep = list(there)
    give_back = sorted(there, key=lambda r: (r.rank, cost.get(r, 0.0), r.workload.id),
                       reverse=True)
    for run in give_back:
        if len(keep) == 1:
            break
        release_gang(gang, view.state)
        view.attach(run)
        trial = _fits_on(preemptor, cq, view, policy, rng, mask)
        if trial is None:
            view.detach(run)
            hold_gang(gang, view.state)
            continue
        gang = trial
        keep.remove(run)
    return keep, gang


def _fits_on(
    w: Workload, cq: str, view: ClusterView, policy: PlacementPolicy, rng: random.Random, mask: np.ndarray
) -> GangPlacement | None:
    """`preemption._fits` on the masked nodes only."""
    with only(view.state, mask):
        return _fits(w, cq, view, policy, rng)
