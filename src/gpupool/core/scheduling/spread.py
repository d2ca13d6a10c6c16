"""Spreading the workloads of one key (a service's replicas) over nodes: a preference, not a rule.

The workload is first placed with the nodes its siblings hold taken out of the placement (marked
unschedulable for that one attempt, whatever the policy); when it fits nowhere else it is placed as
usual, beside them. Deterministic: the same view, policy and random state give the same result.
"""

from __future__ import annotations

import random

from gpupool.core.model import Workload
from gpupool.core.scheduling.gang import GangPlacement, place_gang
from gpupool.core.scheduling.policies.base import NoFit, PlacementPolicy
from gpupool.core.scheduling.view import ClusterView


def sibling_nodes(view: ClusterView, key: str) -> set[int]:
    """Node indexes holding a pod of a running or admitted workload of `key`."""
    view.materialize()
    return {record.node for run in view.running.values() if run.workload.spread_key == key
            for _, record in run.allocs}


def spread_gang(w: Workload, view: ClusterView, policy: PlacementPolicy,
                rng: random.Random) -> GangPlacement | None:
    """The placement away from `w`'s siblings, or None: there are none, or it fits only beside them
    (the caller then places it as usual)."""
    state = view.state
    avoid = sorted(i for i in sibling_nodes(view, w.spread_key) if state.schedulable[i])
    if not avoid:
        return None
    for i in avoid:
        state.set_schedulable(i, False)
    try:
        gang = place_gang(w, state, policy, rng)
    finally:
        for i in avoid:
            state.set_schedulable(i, True)
    return None if isinstance(gang, NoFit) else gang
