"""Prefill/decode pairs: a service's replicas near its partner's replicas on the fabric, a preference.

A workload with a `pair_key` is first placed inside the leaf domains that hold a pod of its partner
(the workloads whose `spread_key` is that key), then inside their spine domains; inside each it still
keeps away from its own siblings where it can (`spread.spread_gang`). When it fits in neither, or the
pool knows no fabric, or no partner runs yet, the caller places it as usual. Deterministic: the same
view, policy and random state give the same result.
"""

from __future__ import annotations

import random

import numpy as np

from gpupool.core.model import Workload
from gpupool.core.scheduling.domains import only
from gpupool.core.scheduling.gang import GangPlacement, place_gang
from gpupool.core.scheduling.policies.base import NoFit, PlacementPolicy
from gpupool.core.scheduling.spread import sibling_nodes, spread_gang
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.topology_spec import Tier

PAIR_TIERS = (Tier.LEAF, Tier.SPINE)


def near_mask(view: ClusterView, key: str, tier: Tier) -> np.ndarray | None:
    """The nodes sharing a `tier` domain with a pod of `key`'s workloads; None without a fabric or
    without such a pod."""
    fabric = view.topology
    if fabric is None or not fabric.fabric_known:
        return None
    partners = sorted(sibling_nodes(view, key))
    ids = fabric.domain_of(tier)
    wanted = {int(ids[i]) for i in partners if i < len(ids) and ids[i] >= 0}
    if not wanted:
        return None
    return np.isin(ids, sorted(wanted))


def pair_gang(w: Workload, view: ClusterView, policy: PlacementPolicy,
              rng: random.Random) -> GangPlacement | None:
    """The placement of `w` in its partner's leaf, else its spine (away from its siblings there when
    it can), or None: no fabric, no partner placed, or it fits near none (the caller then places it
    as usual)."""
    if not w.pair_key:
        return None
    for tier in PAIR_TIERS:
        mask = near_mask(view, w.pair_key, tier)
        if mask is None:
            return None
        with only(view.state, mask):
            gang = spread_gang(w, view, policy, rng) if w.spread_key else None
            if gang is None:
                placed = place_gang(w, view.state, policy, rng)
                gang = None if isinstance(placed, NoFit) else placed
        if gang is not None:
            return gang
    return None
