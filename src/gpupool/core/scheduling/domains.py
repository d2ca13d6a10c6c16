"""Topology-constrained gang placement: a whole gang inside one leaf or spine domain, fullest first.

API:
  - `place_default(workload, state, policy, rng)`: `PlacementPolicy.place_gang`'s default. Without a
    bound fabric, or for a workload no constraint applies to, it is `gang.place_pods` (the pod-by-pod
    loop, unchanged); otherwise `place_constrained`.
  - `place_constrained(workload, state, policy, rng, view, spec)`: Kueue / Volcano semantics.
    required=T: the gang inside one domain of tier T, or NoFit(NO_DOMAIN_FITS); preferred=T: one
    domain of T, else one of the next wider tier, else anywhere; slice=N@T: pods in groups of N (pod
    order), each group inside one domain of T. Domains are tried fullest first (the least free
    device capacity that could still hold the gang: Kueue's BestFit, Slurm's topology/block), so
    whole leaves stay free for the next large gang; inside a domain the policy places pod by pod.
  - `tiers_to_try(spec)`, `fitting_domains(...)`, `only(state, mask)` (the nodes outside `mask`
    look cordoned to the policy while it is open) are the building blocks policies reuse.
  - `narrowest_tier(view, nodes)`: the narrowest tier one of whose domains holds all the nodes.
  - `connected(placed, state, view)` / `place_anywhere(...)`: whatever the policy, a gang is never
    placed where a failed link cuts its pods off from one another; when the policy's own choice is
    cut off, the gang is placed again among the nodes no failed link isolates, else NoFit.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from gpupool.core.model import PodRequest, Reason, Workload
from gpupool.core.scheduling.gang import GangPlacement, place_pods, release_gang
from gpupool.core.scheduling.policies._common import free_device_milli
from gpupool.core.scheduling.policies.base import NoFit, PlacementPolicy
from gpupool.core.scheduling.topology import FabricView
from gpupool.core.state import BoolArray, ClusterState, PodAlloc, row_counts
from gpupool.core.topology_spec import Tier, TopologySpec

WIDER: dict[Tier, tuple[Tier, ...]] = {Tier.LEAF: (Tier.SPINE,), Tier.SPINE: ()}


def place_default(
    workload: Workload, state: ClusterState, policy: PlacementPolicy, rng: random.Random
) -> GangPlacement | NoFit:
    context = policy.topology
    if context is None or len(workload.pods) < 2:
        return place_pods(workload, state, policy, rng)
    spec = context.spec_for(workload)
    if spec is None:
        return place_anywhere(workload, state, policy, rng, context.view)
    return place_constrained(workload, state, policy, rng, context.view, spec)


def connected(placed: GangPlacement | NoFit, state: ClusterState, view: FabricView) -> GangPlacement | NoFit:
    """The placement if its pods can reach one another; else it is released and NoFit: whatever the
    policy, a gang is never placed across a failed link."""
    if isinstance(placed, NoFit) or not view.fabric_known or view.reachable(placed.nodes):
        return placed
    release_gang(placed, state)
    return NoFit(
        Reason.NO_DOMAIN_FITS,
        f"The {len(placed.allocs)}-pod gang fits only on nodes cut off from one another by failed links.",
    )


def place_anywhere(
    workload: Workload, state: ClusterState, policy: PlacementPolicy, rng: random.Random,
    view: FabricView, spec: TopologySpec | None = None, mask: BoolArray | None = None,
) -> GangPlacement | NoFit:
    """The gang anywhere in `mask` (None: the whole pool) where its pods can reach one another: the
    policy's own choice when it is connected, else again among the nodes no failed link cuts off."""

    def within(limit: BoolArray | None) -> GangPlacement | NoFit:
        with only(state, limit):
            if spec is None:
                return place_pods(workload, state, policy, rng)
            return _place_slices(workload, state, policy, rng, view, spec, limit,
                                 min(spec.slice_size or 1, len(workload.pods)))

    first = within(mask)
    placed = connected(first, state, view)
    if placed is first:  # placed and connected, or no room at all: no failed link is to blame
        return placed
    wired = view.connected_mask()
    again = connected(within(wired if mask is None else mask & wired), state, view)
    return again if isinstance(again, GangPlacement) else placed  # why: the failed links


def tiers_to_try(spec: TopologySpec) -> list[Tier | None]:
    """The tiers a gang may sit in, narrowest first (None: anywhere)."""
    if spec.required is not None:
        return [spec.required]
    if spec.preferred is not None:
        return [spec.preferred, *WIDER[spec.preferred], None]
    return [None]


@contextmanager
def only(state: ClusterState, mask: BoolArray | None) -> Iterator[None]:
    """While open, the nodes outside `mask` are not schedulable (None: no restriction)."""
    if mask is None:
        yield
        return
    saved = state.schedulable.copy()
    np.logical_and(state.schedulable, mask, out=state.schedulable)
    try:
        yield
    finally:
        state.schedulable[:] = saved


def _fit_counts(pods: Sequence[PodRequest], state: ClusterState) -> tuple[np.ndarray, int]:
    """[node] how many of the commonest pod shape fit on each node now, and how many such pods."""
    first = pods[0]
    same = sum(1 for p in pods if p.num_devices == first.num_devices and p.device_milli == first.device_milli)
    host = state.host_fits(first)
    if not first.num_devices:
        return host.astype(np.int64) * len(pods), same
    per = row_counts(state.device_fits(first)) // first.num_devices
    return np.where(host, per, 0).astype(np.int64), same


@dataclass(frozen=True, slots=True)
class Room:
    """What `fitting_domains` counts of the pool for one set of pods, node by node (0 off `usable`):
    computed once, it serves every tier's count while the state is as it was."""

    usable: BoolArray
    free: np.ndarray
    """[node] free device milli"""
    fit: np.ndarray
    """[node] how many of the commonest pod shape fit"""
    demand: int
    """the pods' device milli together"""
    need: int
    """how many pods of the commonest shape must fit"""

    def anywhere(self) -> bool:
        """The count over every usable node: False means the pods fit nowhere in it (True decides
        nothing: the trial placement does)."""
        return bool(self.free.sum() >= self.demand and self.fit.sum() >= self.need)


def room_for(pods: Sequence[PodRequest], state: ClusterState, within: BoolArray | None = None) -> Room:
    """`Room` for `pods` on the schedulable nodes (of `within`, when given)."""
    usable = state.schedulable.copy() if within is None else state.schedulable & within
    counts, same = _fit_counts(pods, state)
    return Room(
        usable=usable,
        free=np.where(usable, free_device_milli(state), 0),
        fit=np.where(usable, counts, 0),
        demand=sum(p.total_device_milli for p in pods),
        need=min(same, len(pods)),
    )


def fitting_domains(
    pods: Sequence[PodRequest], state: ClusterState, view: FabricView, tier: Tier,
    within: BoolArray | None = None, room: Room | None = None,
) -> list[int]:
    """Domain ids of the tier that could hold `pods` now by a quick count, fullest first.

    Fullest: least free device milli on schedulable nodes (ties: lower id). The count is a
    necessary condition only; the trial placement decides. `room`: `room_for(pods, state, within)`
    computed before (the state unchanged since), so that several tiers count from one pass.
    """
    ids = view.domain_of(tier)
    n = int(ids.max(initial=-1)) + 1
    if n == 0:
        return []
    if room is None:
        room = room_for(pods, state, within)
    sel = room.usable & (ids >= 0)
    free = np.bincount(ids[sel], weights=room.free[sel], minlength=n)
    fit = np.bincount(ids[sel], weights=room.fit[sel], minlength=n)
    ok = np.flatnonzero((free >= room.demand) & (fit >= room.need))
    return [int(d) for d in ok[np.lexsort((ok, free[ok]))]]


def narrowest_tier(view: FabricView, nodes: Sequence[int]) -> Tier | None:
    """LEAF when one leaf domain holds every node, SPINE for one spine group, else None."""
    at = np.asarray(nodes, dtype=np.int64)
    for tier in (Tier.LEAF, Tier.SPINE):
        ids = view.domain_of(tier)[at]
        if (ids == ids[0]).all():
            return tier
    return None


def place_in(
    workload: Workload, state: ClusterState, policy: PlacementPolicy, rng: random.Random,
    view: FabricView, spec: TopologySpec, mask: BoolArray | None,
) -> GangPlacement | NoFit:
    """The gang inside `mask` (None: anywhere), honouring its slices."""
    if spec.slice_size is None or (mask is not None and narrow_enough(spec.slice_tier, mask, view)):
        return place_anywhere(workload, state, policy, rng, view, None, mask)
    return place_anywhere(workload, state, policy, rng, view, spec, mask)


def narrow_enough(tier: Tier, mask: BoolArray, view: FabricView) -> bool:
    """Whether every node of `mask` lies in one domain of `tier`."""
    ids = view.domain_of(tier)[mask]
    return bool(ids.size) and bool((ids == ids[0]).all())


def _place_slices(
    workload: Workload, state: ClusterState, policy: PlacementPolicy, rng: random.Random,
    view: FabricView, spec: TopologySpec, mask: BoolArray | None, size: int,
) -> GangPlacement | NoFit:
    allocs: list[tuple[PodRequest, PodAlloc]] = []
    ids = view.domain_of(spec.slice_tier)
    for first in range(0, len(workload.pods), size):
        group = workload.pods[first:first + size]
        placed: GangPlacement | NoFit | None = None
        for domain in fitting_domains(group, state, view, spec.slice_tier, mask):
            inside = ids == domain if mask is None else mask & (ids == domain)
            with only(state, inside):
                placed = place_pods(workload, state, policy, rng, group)
            if isinstance(placed, GangPlacement):
                break
        if not isinstance(placed, GangPlacement):
            for _, record in reversed(allocs):
                state.release(record)
            return NoFit(
                Reason.NO_DOMAIN_FITS,
                f"No {spec.slice_tier} has room for pods {first + 1}-{first + len(group)} of the "
                f"{len(workload.pods)}-pod gang together (slice={spec.slice_size}@{spec.slice_tier}).",
            )
        allocs.extend(placed.allocs)  # held in the state already
    return GangPlacement(workload, tuple(allocs))


def place_constrained(
    workload: Workload, state: ClusterState, policy: PlacementPolicy, rng: random.Random,
    view: FabricView, spec: TopologySpec,
) -> GangPlacement | NoFit:
    """Place the gang by its constraint (see the module docstring); the state is unchanged on NoFit."""
    last: NoFit | None = None
    for tier in tiers_to_try(spec):
        if tier is None:
            return place_in(workload, state, policy, rng, view, spec, None)
        ids = view.domain_of(tier)
        for domain in fitting_domains(workload.pods, state, view, tier):
            placed = place_in(workload, state, policy, rng, view, spec, ids == domain)
            if isinstance(placed, GangPlacement):
                return placed
            last = placed
    tier_name = spec.tier or Tier.LEAF
    detail = f" ({last.message})" if last is not None and last.reason is Reason.NO_DOMAIN_FITS else ""
    return NoFit(
        Reason.NO_DOMAIN_FITS,
        f"No {tier_name} has room for the whole {len(workload.pods)}-pod gang (topology {spec}){detail}.",
    )
