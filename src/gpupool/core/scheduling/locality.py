"""Wait or spread: whether a gang that could start now spread over the fabric waits for a domain of its own.

API: `wait_for_domain(workload, gang, view, max_wait_s, policy, now_s, rng, cap=WaitCap.FIXED,
backlog=0, ceiling_s=inf) -> Locality | None`; `reserve_in_domain(workload, wide, view, ...,
pending=()) -> Reservation` for a gang that fits nowhere now.

A gang whose constraint prefers a tier (preferred=leaf by default) and that the policy could only
place wider (its pods over several leaves, or spine groups) waits only while
  - the expected loss from spreading (its estimated remaining run time x the extra slowdown of the
    spread placement over the same nodes' own links, from the policy's `comm_cost.CommModel` scaled
    to the job's own communication ratio when `TopologyContext.comm_ratio` knows it, else the
    policy's one assumption: a light job spreads where a heavy one waits) exceeds
  - the expected wait for a domain of the preferred tier (the earliest estimated end of running
    work after which the gang fits one, found as backfill finds a reservation: `backfill.reserve`
    with the gang asking required=<tier>; when only runs already past their estimates would free
    one, backfill counts them as ending now, but how long they still run is unknown, so the wait is
    taken at its worst, the rest of `max_wait_s`: the gang waits then only if spreading would cost
    more than waiting out the whole cap), and
  - it has waited less than its cap in all, counting the expected wait. `WaitCap` sets the cap:
    FIXED: `max_wait_s` (Slurm's max_switch_wait);
    LOSS: the larger of `max_wait_s` and the loss itself: a gang that would lose two hours spread
      may wait up to two hours for its domain, never longer than spreading would have cost it (on a
      saturated pool a fixed few minutes is noise beside the queue);
    QUEUE: as LOSS, with the loss counted for the queue too: the GPU-seconds a spread gang burns
      in communication are capacity every queued job waits for, about loss x (its GPUs / the
      pool's) seconds each, so the loss weighed is loss x (1 + backlog x its GPUs / the pool's GPUs),
      `backlog` the other pending workloads of the cycle. With an empty queue it is LOSS; on a
      backed-up pool gangs wait far longer.
    Under LOSS and QUEUE the cap is at most `ceiling_s` (the operator's bound on what estimates a
    tenant states can buy), never below `max_wait_s`.
    Where only overdue runs would free a domain, the worst case counted is the rest of the cap but
    at most `max_wait_s` at a time, so under LOSS or QUEUE such a gang waits while it expects to
    lose more than `max_wait_s` spread.
While it waits, the returned reservation holds that domain: the cycle lets other work start only
if it ends before the reservation, lands outside the domain, or leaves the gang room
(`backfill.may_backfill`). Only the cycle's first reservation is guarded so; under LOSS and QUEUE
every later waiting gang holds the nodes it is reserved on (`Reservation.nodes`): work that lands
on one of them starts only if it is expected to end before that gang's start (`cycle.held_until`).
On None the gang stays placed (the state still holds it); on a `Locality` the state no longer
holds it.

A gang that fits nowhere now (backfill's head) faces the same choice later: backfill reserves it at
its earliest start, which may be spread. `reserve_in_domain` reserves it inside one domain of its
preferred tier instead when that start is later by less than the loss from spreading and by no more
than the cap above divided by 1 + `queue_shrink` (4) x (the compute the cycle's other pending work
asks for / the pool's): on a backed-up pool every second the head's reservation holds back is a
second the queue waits too, so the busier the pool, the less later a domain of its own may be
(with a weaker shrink, or none, such reservations cost more than they saved in busy months:
docs/experiments/network-aware.md).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from gpupool.core.model import Workload
from gpupool.core.scheduling.backfill import Reservation, fabric_spec, kept_reserve, nodes_mask, reserve
from gpupool.core.scheduling.comm_cost import CommModel
from gpupool.core.scheduling.domains import narrowest_tier
from gpupool.core.scheduling.gang import GangPlacement, hold_gang, place_gang, release_gang
from gpupool.core.scheduling.policies.base import NoFit, PlacementPolicy
from gpupool.core.scheduling.topology import UNKNOWN_RUN_S, FabricView
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.scheduling.workloads import shape_of
from gpupool.core.topology_spec import Tier, TopologySpec


class WaitCap(StrEnum):
    """How long a gang may wait for its domain in all (the module docstring; config topology_wait_cap)."""

    FIXED = "fixed"
    LOSS = "loss"
    QUEUE = "queue"


@dataclass(frozen=True, slots=True)
class Locality:
    """The decision to wait: the reservation of the domain, the expected wait and the loss avoided."""

    reservation: Reservation
    wait_s: float
    loss_s: float
    cap_s: float
    """The longest it waits in all (`max_wait_s`, or under LOSS / QUEUE the larger of it and the loss)."""
    overdue: bool = False
    """The domain frees only when runs past their estimates end (`wait_s` is then the worst case)."""

    def message(self, tier: str) -> str:
        when = (f"may take up to {self.wait_s:.0f} s (it waits on work past its estimated end)"
                if self.overdue else f"is expected in {self.wait_s:.0f} s")
        return (
            f"It could start now spread over the fabric, but a {tier} of its own {when}, less than "
            f"the {self.loss_s:.0f} s spreading would cost; it waits (at most {self.cap_s:.0f} s in all)."
        )


def wait_for_domain(
    workload: Workload, gang: GangPlacement, view: ClusterView, max_wait_s: float,
    policy: PlacementPolicy, now_s: float, rng: random.Random,
    known: dict[object, Reservation | None] | None = None, cap: WaitCap = WaitCap.FIXED, backlog: int = 0,
    ceiling_s: float = math.inf,
) -> Locality | None:
    """See the module docstring. `known`: the reservations of gangs that wait in this cycle, by
    shape (a later gang of the same shape reads its expected wait there instead of searching again;
    the cycle then already holds a reservation, so the copy's shadow state is never used)."""
    fabric = fabric_spec(workload, view, policy)
    if fabric is None:
        return None
    topology, spec = fabric
    if spec.preferred is None:
        return None
    context = policy.topology
    assert context is not None
    nodes = sorted(set(gang.nodes))
    tier = narrowest_tier(topology, nodes)
    if tier is not None and tier.depth <= spec.preferred.depth:
        return None
    waited = now_s - view.locality_waits.get(workload.id, now_s)
    if waited >= max_wait_s and cap is WaitCap.FIXED:
        return None
    loss_s, cap_s = _loss_and_cap(workload, nodes, view, topology, policy, max_wait_s, cap, backlog,
                                  ceiling_s)
    if not loss_s > 0 or waited >= cap_s:
        return None
    release_gang(gang, view.state)
    head = dataclasses.replace(workload, topology=TopologySpec(required=spec.preferred))
    key = (shape_of(head), spec.preferred)
    if known is not None and key in known:
        found = known[key]
        found = None if found is None else dataclasses.replace(found, head=head)
    else:
        found = reserve(head, view, now_s, policy, rng, correct=False)
        if found is not None:
            found = _with_domain(found, head, topology, spec.preferred, policy, rng)
    wait_s = found.start_s - now_s if found is not None else math.inf
    overdue = wait_s <= 0  # it does not fit one now: only runs past their estimates would free it
    if overdue:
        wait_s = min(cap_s - waited, max_wait_s)
    if found is not None and wait_s < loss_s and waited + wait_s <= cap_s:
        if known is not None:  # kept only once it holds the cycle's reservation: never read stale
            known.setdefault(key, found)
        return Locality(found, wait_s, loss_s, cap_s, overdue)
    hold_gang(gang, view.state)  # start spread after all: hold the gang again
    return None


def job_comm(workload: Workload, topology: FabricView, policy: PlacementPolicy) -> CommModel:
    """The policy's communication model (its options', else the default) for this job's ratio, as
    the bound `TopologyContext` knows it (else the model's one assumption)."""
    context = policy.topology
    assert context is not None
    assumed = getattr(policy, "comm", None)
    assumed = assumed if isinstance(assumed, CommModel) else CommModel()
    return assumed.for_job(context.comm_ratio(workload), topology)


def _loss_and_cap(
    workload: Workload, nodes: list[int], view: ClusterView, topology: FabricView, policy: PlacementPolicy,
    max_wait_s: float, cap: WaitCap, backlog: int, ceiling_s: float,
) -> tuple[float, float]:
    """The expected loss from running the gang spread over `nodes` rather than packed, and how long
    it may wait in all to avoid it (the module docstring)."""
    comm = job_comm(workload, topology, policy)
    estimate = view.remaining_estimate_s(workload)
    run_s = UNKNOWN_RUN_S if estimate is None else estimate
    spread = comm.slowdown(len(nodes), topology.share_gbps(nodes), topology.max_hops(nodes))
    loss_s = run_s * (spread - comm.packed_slowdown(topology, nodes))
    if cap is WaitCap.QUEUE and backlog > 0:
        loss_s *= 1.0 + backlog * workload.total_device_milli / max(1, view.state.total_device_milli)
    cap_s = max_wait_s if cap is WaitCap.FIXED else max(max_wait_s, min(loss_s, ceiling_s))
    return loss_s, cap_s


leaf_reservations = True
"""A gang that fits nowhere now may be reserved inside one domain of its preferred tier
(`reserve_in_domain`); off, backfill reserves it at its earliest start wherever that is."""

queue_shrink = 4.0
"""How fast the wait a stuck gang may take for a domain of its own shrinks with the queue behind
it: its cap is divided by 1 + queue_shrink x (the compute the cycle's other pending work asks for /
the pool's compute). 0 (the cap as `wait_for_domain`'s) and 1 measured worse than none of these
reservations on a saturated two-month replay, 4 better (docs/experiments/network-aware.md)."""


bound_leaf_search = True
"""Search a stuck gang's reservation inside one leaf only as far as a start it would take
(`reserve_in_domain`); False searches on to its first start there wherever that lies (the same
reservations, slower: kept to check that claim)."""


def reserve_in_domain(
    workload: Workload, wide: Reservation, view: ClusterView, max_wait_s: float, policy: PlacementPolicy,
    now_s: float, rng: random.Random, cap: WaitCap = WaitCap.FIXED, backlog: int = 0,
    ceiling_s: float = math.inf, pending: Sequence[Workload] = (),
) -> Reservation:
    """Wait or spread for a gang that fits nowhere now (backfill's head): its reservation inside
    one domain of its preferred tier instead of `wide` (the earliest, spread over the fabric) when
    the later start is expected to cost it less than spreading would, and no more than its cap
    shrunk by the queue (`pending`: the cycle's pending workloads, this one among them; summed only
    here, past the checks that most cycles stop at)."""
    fabric = fabric_spec(workload, view, policy)
    if not leaf_reservations or fabric is None or wide.fits_on is None or wide.narrow is not None:
        return wide
    topology, spec = fabric
    if spec.preferred is None:
        return wide
    nodes = np.flatnonzero(wide.fits_on).tolist()
    tier = narrowest_tier(topology, nodes)
    if tier is not None and tier.depth <= spec.preferred.depth:
        return wide
    loss_s, cap_s = _loss_and_cap(workload, nodes, view, topology, policy, max_wait_s, cap, backlog,
                                  ceiling_s)
    if not loss_s > 0 or not cap_s > 0:
        return wide
    queued_milli = sum(w.total_device_milli for w in pending) - workload.total_device_milli
    cap_s /= 1.0 + queue_shrink * queued_milli / max(1, view.state.total_device_milli)
    head = dataclasses.replace(workload, topology=TopologySpec(required=spec.preferred))
    kept = view.kept_leaf_reservation
    if kept is not None and kept.head == head:
        head = kept.head  # the same object again, so the kept reservation may match
    # it fits nowhere before the wide start, so in no leaf either
    # a later start is of use only by less than the loss and no more than the cap: the search
    # stops at the first end time past that instead of placing the gang there
    found = kept_reserve(head, view, now_s, policy, rng, slot="kept_leaf_reservation",
                         not_before_s=wide.start_s, wanted=(loss_s, cap_s) if bound_leaf_search else None)
    if found is None:
        return wide
    delay_s = found.start_s - wide.start_s
    if not (delay_s < loss_s and delay_s <= cap_s):
        return wide
    return _with_domain(found, head, topology, spec.preferred, policy, rng)


def _with_domain(
    found: Reservation, head: Workload, topology: FabricView, tier: Tier, policy: PlacementPolicy,
    rng: random.Random,
) -> Reservation:
    """The reservation with the domain the head fits in at its start (so backfill may use the rest)."""
    placed = place_gang(head, found.shadow, policy, rng)
    if isinstance(placed, NoFit):
        return found
    release_gang(placed, found.shadow)
    ids = topology.domain_of(tier)
    on = list(placed.nodes)
    domain = np.isin(ids, np.unique(ids[on]))
    return dataclasses.replace(found, domain=domain, nodes=nodes_mask(placed, found.shadow))
