"""Packing services' replicas, so whole nodes stay free for wide batch gangs (`Policies.pack_classes`).

A replica that lands on an empty node breaks that node for every gang that needs it whole, and
replicas live for days while batch comes and goes. So a workload of a packed class is placed, in
this order, on the first of these node sets where it fits (the others marked unschedulable for
that one attempt, whatever the placement policy):

1. nodes already holding a pod of a packed class (the services' nodes),
2. nodes already holding any pod (a fully free node is the last resort).

A replica of a spread service (`Workload.spread_key`) tries these away from its service's nodes
first, then any node away from them (as `spread` does: spreading a service stays the stronger
preference), then the two sets beside them. Where none of these fits, the caller
places it as usual (a fully free node). At scale-down, the replica to remove is the one on the
emptiest node (`emptiest_first`): it is the node closest to becoming whole again.

Deterministic: the same view, policy and random state give the same result.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

import numpy as np

from gpupool.core.model import Workload
from gpupool.core.scheduling.domains import only
from gpupool.core.scheduling.gang import GangPlacement, place_gang
from gpupool.core.scheduling.policies.base import NoFit, PlacementPolicy
from gpupool.core.scheduling.spread import sibling_nodes
from gpupool.core.scheduling.view import ClusterView

K = TypeVar("K", bound=Hashable)
N = TypeVar("N", bound=Hashable)


def class_nodes(view: ClusterView, classes: frozenset[str]) -> set[int]:
    """Node indexes holding a pod of a running or admitted workload of one of `classes`."""
    view.materialize()
    return {record.node for run in view.running.values() if run.workload.priority_class in classes
            for _, record in run.allocs}


def _mask(n: int, nodes: Iterable[int]) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    idx = list(nodes)
    if idx:
        mask[idx] = True
    return mask


def packed_gang(w: Workload, view: ClusterView, policy: PlacementPolicy, rng: random.Random,
                classes: frozenset[str]) -> GangPlacement | None:
    """`w`'s placement on the first node set above where it fits, or None: it fits only on a fully
    free node (or nowhere), and the caller places it as usual."""
    state = view.state
    n = len(state.schedulable)
    used = (state.dev_valid & (state.dev_milli_free < state.dev_milli_cap)).any(axis=1)
    held = _mask(n, class_nodes(view, classes)) & used
    tiers = [held, used]
    if w.spread_key:
        away = ~_mask(n, sibling_nodes(view, w.spread_key))
        tiers = [held & away, used & away, away, *tiers]
    tried: list[np.ndarray] = []
    for mask in tiers:
        mask = mask & state.schedulable
        if not mask.any() or any(np.array_equal(mask, t) for t in tried):
            continue
        tried.append(mask)
        with only(state, mask):
            gang = place_gang(w, state, policy, rng)
        if not isinstance(gang, NoFit):
            return gang
    return None


def emptiest_first(replicas: Iterable[tuple[K, N]], used: Mapping[N, float]) -> list[K]:
    """The replicas (key, node) in the order to remove them at scale-down: the one on the node with
    the least in use first (`used[node]`: devices in use there, the replicas' own included), then
    the node with fewer of these replicas; ties keep the given order."""
    items = list(replicas)
    count: dict[N, int] = {}
    for _, node in items:
        count[node] = count.get(node, 0) + 1
    ranked = sorted(enumerate(items), key=lambda e: (used.get(e[1][1], 0.0), count[e[1][1]], e[0]))
    return [key for _, (key, _) in ranked]
