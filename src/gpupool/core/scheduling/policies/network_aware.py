"""network-aware: gangs placed by fragmentation plus communication cost, both in GPU-seconds.

Single pods (and every pod when no fabric is bound, as in `sim fill` without --fabric) are placed
as `pods` says: `auto` (the default) places them as `best-fit` while every pod seen asks whole
devices, and as `fgd-strand` once a pod asking part of a device is seen (FGD's fragmentation measure
is made for fractional shapes; on whole-device work in a saturated pool best-fit's tight packing
gets gangs their nodes sooner: docs/benchmarks.md, "Network-aware placement"); `best-fit` and
`fgd-strand` fix the choice. With `fullest_leaf` and a fabric bound, best-fit's ties (nodes it
scores alike, such as every wholly free node) go to the leaf with the least free share, as Slurm's
topology/tree picks the leaf switch with the fewest free nodes, so small work fills leaves already
in use and leaves that are whole stay whole for the next gang. A multi-pod gang, when the view
knows a fabric, is placed whole (`place_gang`):

1. candidates: for each tier its constraint allows (required / preferred: narrowest first; none:
   leaf, spine and anywhere together), the `max_candidates` fullest domains that could hold it
   (Kueue BestFit, Slurm topology/block); in a spine group or anywhere, also the fewest of its
   leaves that hold it (most free first) and the best-connected ones (most uplink bandwidth per
   gang first); inside each, pods go where single pods would go (`pods`). Nodes whose HCA links are
   all down are left out, and a candidate that needs a dead link pool (a leaf or spine group cut
   off) is never taken: failed links are never used.
2. cost of a candidate, in GPU-seconds:
     frag   = FGD's fragmentation growth of the nodes it touches (devices) x its run time;
     comm   = GPUs x run time x T_net / T_comp (`comm_cost.CommModel`: ring all-reduce on its
              bottleneck bandwidth, shared with the gangs already on those links; penalised links,
              see `FabricView`'s hysteresis, count at a fraction of their bandwidth), scaled to the
              job's own communication ratio when the bound `TopologyContext.comm_ratio` knows it
              (`CommModel.for_job`), else the options' one assumption for every gang;
     others = the slowdown it adds to the gangs already sharing its link pools (their ratios are
              not known here: the options' assumption).
   The run time is the scheduler's estimate of what is left (user's or history's, via the bound
   `TopologyContext`), else `UNKNOWN_RUN_S`: never the job's real duration.
3. the cheapest candidate of the narrowest tier that has one wins (ties: the fuller domain); with
   no constraint, the cheapest overall.

A gang that fits nowhere by a quick count (free devices, and room for its commonest pod shape, on
the nodes with a working HCA link) gets the plain placement's NoFit without a candidate tried: on
a backed-up pool most gangs asked in a cycle are such, and every trial would fail. When no node is
cut off, the count covers the whole pool, so neither is the plain placement run: the refusal has
its reason, worded from the count (`_counted_nofit`).

Options: `pods`, `fullest_leaf` (above; off by default), `message_mb`, `step_compute_s` (the
CommModel: the assumption for a job whose ratio is unknown), `cross_leaf_efficiency`,
`cross_spine_efficiency` (the share of bandwidth a flow crossing leaves or spine groups gets),
`max_candidates`, and fgd-strand's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from gpupool.core.model import PodRequest, Reason, Workload
from gpupool.core.scheduling.comm_cost import CommModel
from gpupool.core.scheduling.policies._common import cap_device_milli, choose_devices, free_device_milli
from gpupool.core.scheduling.policies.base import Choice, NoFit, fits_or_nofit, register_policy
from gpupool.core.scheduling.policies.best_fit import BestFit
from gpupool.core.scheduling.policies.fgd_strand import FgdStrand
from gpupool.core.scheduling.topology import ACCESS, LEAF_UP, UNKNOWN_RUN_S, FabricView
from gpupool.core.state import BoolArray, ClusterState, PodAlloc
from gpupool.core.topology_spec import UNCONSTRAINED, Tier, TopologySpec

if TYPE_CHECKING:  # imported when first used: the gang module imports this package
    from gpupool.core.scheduling.domains import Room
    from gpupool.core.scheduling.gang import GangPlacement


POD_PLACEMENTS = ("auto", "best-fit", "fgd-strand")
"""How network-aware places single pods and the pods of a gang inside a candidate domain."""


@register_policy
class NetworkAware(FgdStrand):
    name = "network-aware"
    summary = "Gangs by fragmentation plus communication cost on the fabric; pods as best-fit or fgd-strand."

    def __init__(
        self, *, message_mb: float = 1000.0, step_compute_s: float = 1.0, max_candidates: int = 3,
        cross_leaf_efficiency: float = 0.6, cross_spine_efficiency: float = 0.5, pods: str = "auto",
        fullest_leaf: bool = False, **strand_options: object,
    ) -> None:
        super().__init__(**strand_options)  # type: ignore[arg-type]
        if pods not in POD_PLACEMENTS:
            raise ValueError(f"pods= is one of {', '.join(POD_PLACEMENTS)}, got {pods!r}")
        if not isinstance(fullest_leaf, bool):
            raise ValueError(f"fullest_leaf= is true or false, got {fullest_leaf!r}")
        self.pods = pods
        self.fullest_leaf = fullest_leaf
        self._best_fit = BestFit()
        self._fractional = False
        """A pod asking part of a device has been seen (prepare, observe or place): `auto` uses fgd-strand."""
        self.comm = CommModel(message_mb=message_mb, step_compute_s=step_compute_s,
                              cross_leaf_efficiency=cross_leaf_efficiency,
                              cross_spine_efficiency=cross_spine_efficiency)
        self.max_candidates = max(1, max_candidates)

    def prepare(self, state: ClusterState, pods: Sequence[PodRequest]) -> None:
        super().prepare(state, pods)
        self._fractional = any(p.is_fractional for p in pods)

    def observe(self, pod: PodRequest) -> None:
        super().observe(pod)
        self._fractional = self._fractional or pod.is_fractional

    def _by_best_fit(self) -> bool:
        return self.pods == "best-fit" or (self.pods == "auto" and not self._fractional)

    def place(self, pod: PodRequest, state: ClusterState, rng: random.Random) -> Choice | NoFit:
        self._fractional = self._fractional or pod.is_fractional
        if self._by_best_fit():
            context = self.topology
            if self.fullest_leaf and context is not None and context.view.fabric_known:
                return self._best_fit_fullest_leaf(pod, state, rng, context.view)
            return self._best_fit.place(pod, state, rng)
        return super().place(pod, state, rng)

    def _best_fit_fullest_leaf(
        self, pod: PodRequest, state: ClusterState, rng: random.Random, view: FabricView,
    ) -> Choice | NoFit:
        """best-fit's node, its ties broken by the leaf with the least free share (then node order)."""
        feasible = fits_or_nofit(pod, state)
        if isinstance(feasible, NoFit):
            return feasible
        scores = self._best_fit.scores(pod, state, feasible)
        fits = np.flatnonzero(feasible)
        top = fits[scores[fits] == scores[fits].max()]
        if len(top) > 1:
            n = len(view.leaf_names)
            free_milli = np.where(state.schedulable, free_device_milli(state), 0)
            free = np.bincount(view.leaf_id, weights=free_milli, minlength=n)
            cap = np.bincount(view.leaf_id, weights=cap_device_milli(state), minlength=n)
            share = np.divide(free, cap, out=np.zeros(n), where=cap > 0)[view.leaf_id[top]]
            top = top[share == share.min()]
        return choose_devices(pod, state, int(top[0]), self._best_fit.device_choice, rng)

    def counts_failed_calls(self) -> bool:
        return not self._by_best_fit() and super().counts_failed_calls()

    def is_repeatable(self) -> bool:
        return self._best_fit.is_repeatable() if self._by_best_fit() else super().is_repeatable()

    def mode(self) -> object:
        return self._by_best_fit()  # (`auto` turns to fgd-strand once it places a share of a device)

    def place_gang(
        self, workload: Workload, state: ClusterState, rng: random.Random
    ) -> GangPlacement | NoFit:
        context = self.topology
        if context is None or len(workload.pods) < 2 or not context.view.fabric_known:
            return super().place_gang(workload, state, rng)
        from gpupool.core.scheduling.domains import place_in, room_for, tiers_to_try
        from gpupool.core.scheduling.gang import GangPlacement, hold_gang, release_gang
        spec = context.spec_for(workload)
        view = context.view
        wired = view.avail[ACCESS] > 0
        # first, as ever: it may fix the shape mix; its fragments are brought up to date only where
        # a candidate is tried (a cache by node version: when they are computed changes nothing)
        model = self._model_for(state, workload.pods[0], refresh=False)
        room = room_for(workload.pods, state, wired)  # every candidate lies inside `wired`
        if not room.anywhere() and self.is_repeatable() and not self.counts_failed_calls():
            # no candidate can hold it: trying each would fail, drawing nothing and keeping nothing
            counted = _counted_nofit(workload, state, wired, room, spec)
            return counted if counted is not None else self._no_candidate(workload, state, rng, spec)
        model.refresh()
        estimate = context.estimate_s(workload)
        run_s = UNKNOWN_RUN_S if estimate is None else max(estimate, 1.0)
        gpus = workload.total_device_milli / 1000
        comm = self.comm.for_job(context.comm_ratio(workload), view)
        before = model.frag.copy()
        best: tuple[float, tuple[tuple[PodRequest, PodAlloc], ...]] | None = None
        for tier in tiers_to_try(spec) if spec is not None else [Tier.LEAF, Tier.SPINE, None]:
            for mask in self._candidates(workload, state, view, tier, wired, room):
                placed = place_in(workload, state, self, rng, view, spec or UNCONSTRAINED, mask)
                if isinstance(placed, NoFit):
                    continue
                cost = self._cost(placed, state, view, before, gpus, run_s, comm)
                release_gang(placed, state)
                if cost < math.inf and (best is None or cost < best[0]):
                    best = (cost, placed.allocs)
            if best is not None and spec is not None:
                break  # the narrowest tier that holds the gang
        if best is None:
            return self._no_candidate(workload, state, rng, spec)
        chosen = GangPlacement(workload, best[1])
        hold_gang(chosen, state)
        return chosen

    def _candidates(
        self, workload: Workload, state: ClusterState, view: FabricView, tier: Tier | None,
        wired: BoolArray, room: Room,
    ) -> Iterator[BoolArray]:
        """The areas to try for a tier; `room`: `room_for` the gang inside `wired`, on the state as
        it is (each trial placement in an area is released before the next area is made)."""
        from gpupool.core.scheduling.domains import fitting_domains

        if tier is None:
            areas = [wired]
        else:
            ids = view.domain_of(tier)
            domains = fitting_domains(workload.pods, state, view, tier, room=room)[: self.max_candidates]
            areas = [wired & (ids == d) for d in domains]
        for area in areas:
            yield area
            if tier is Tier.LEAF:
                continue
            seen = {area.tobytes()}
            for best_connected in (False, True):  # which of its leaves to span
                leaves = self._leaves_for(workload, view, area, room, best_connected)
                if leaves is not None and leaves.tobytes() not in seen:
                    seen.add(leaves.tobytes())
                    yield leaves

    @staticmethod
    def _leaves_for(
        workload: Workload, view: FabricView, area: BoolArray, room: Room, best_connected: bool,
    ) -> BoolArray | None:
        """Leaf domains (with working uplinks) that together could hold the gang, taken by most free
        devices first (the fewest leaves), or by most uplink bandwidth per gang first (`best_connected`)."""
        ids = view.leaf_id
        n = len(view.leaf_names)
        sel = area & room.usable  # `area` lies inside the nodes `room` counted
        free = np.bincount(ids[sel], weights=room.free[sel], minlength=n)
        share = view.avail[LEAF_UP] / (view.flows[LEAF_UP] + 1)
        free = np.where(share > 0, free, 0.0)
        keys = (np.arange(n), -free, -share) if best_connected else (np.arange(n), -free)
        order = np.lexsort(keys)
        order = order[free[order] > 0]
        covered = np.cumsum(free[order])
        need = workload.total_device_milli
        if not covered.size or covered[-1] < need:
            return None
        take = order[: int(np.searchsorted(covered, need)) + 1]
        return np.asarray(area & np.isin(ids, take))

    def _cost(
        self, placed: GangPlacement, state: ClusterState, view: FabricView, before: np.ndarray,
        gpus: float, run_s: float, comm: CommModel,
    ) -> float:
        nodes = sorted(set(placed.nodes))
        model = self._model_for(state, placed.allocs[0][0])
        model.refresh()
        growth = float((model.frag[nodes] - before[nodes]).sum()) if len(before) == len(model.frag) else 0.0
        frag = max(growth, 0.0) / 1000 * run_s
        own = comm.loss_gpu_s(view, nodes, gpus, run_s)
        return frag + own + self.comm.others_gpu_s(view, nodes)

    def _no_candidate(
        self, workload: Workload, state: ClusterState, rng: random.Random, spec: TopologySpec | None
    ) -> NoFit:
        """Why no candidate was found: what the plain placement says, or that only dead links would do."""
        from gpupool.core.scheduling.gang import release_gang

        plain = super().place_gang(workload, state, rng)
        if isinstance(plain, NoFit):
            return plain
        release_gang(plain, state)
        return NoFit(
            Reason.NO_DOMAIN_FITS,
            f"The {len(workload.pods)}-pod gang fits now only where a failed link would cut it apart"
            + (f" (topology {spec})" if spec is not None else "") + "; it waits for room or a repair.",
        )


def _counted_nofit(
    workload: Workload, state: ClusterState, wired: BoolArray, room: Room, spec: TopologySpec | None,
) -> NoFit | None:
    """The plain placement's NoFit for a gang the quick count says fits nowhere, without placing it:
    None when it cannot be told so (a node cut off from the fabric, or slices to place).

    With every schedulable node wired, `room` counts the whole pool the plain placement would try,
    and the count is a necessary condition, so that placement fails too, with the reason its path
    gives: a required tier tries no domain (none passes the same count) and says so in its own
    words; otherwise (preferred, or no tier) it ends placing pod by pod on the whole pool, a gang
    left incomplete, here worded from the count instead of from the pod where it stopped."""
    if not wired[state.schedulable].all() or (spec is not None and spec.slice_size is not None):
        return None
    n = len(workload.pods)
    if spec is not None and spec.required is not None:
        return NoFit(Reason.NO_DOMAIN_FITS,
                     f"No {spec.tier or Tier.LEAF} has room for the whole {n}-pod gang (topology {spec}).")
    free, demand = int(room.free.sum()), room.demand
    if free < demand:
        short = f"{free / 1000:g} devices are free of the {demand / 1000:g} it asks"
    else:
        first = workload.pods[0]
        short = (f"nodes have room for {int(room.fit.sum())} of its {room.need} pods of "
                 f"{first.total_device_milli / 1000:g} devices")
    return NoFit(Reason.GANG_INCOMPLETE,
                 f"The {n}-pod gang does not fit now: {short}; none of the gang was placed.")
