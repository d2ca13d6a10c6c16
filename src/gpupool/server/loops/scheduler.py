"""The scheduling step: snapshot from the store, the core cycle, short writes, then launches.

The scheduler only sequences the loop's parts, each a module of its own:

- arrivals (loops/arrivals.py): which pending work a cycle reads (`Window`: a full pass or the new
  arrivals) and what the core may know of each workload beyond its spec (`Estimates`);
- the decision applier (loops/applier.py): a cycle's decisions written to the store;
- launching (loops/launching.py, over the nodes' workers of loops/launches.py): the pods written
  `launching` handed over, `waiting` pods promoted, launch outcomes recorded;
- time limits (loops/time_limits.py): workloads past their time limit failed.

Order matters for the crash-restart promise: pods are written as `launching` (with their node and
slices) in one transaction *before* they are handed to the nodes' launch workers, and no provider
call happens inside a transaction. The launches run outside the step; a later step records what
came of them (`record_launches`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpupool.core.model import Node, Workload, WorkloadInfo
from gpupool.core.scheduling.backfill import RuntimeEstimator
from gpupool.core.scheduling.cycle import Policies
from gpupool.core.scheduling.keeper import ViewKeeper
from gpupool.server.loops.applier import RECORD_CHUNK, DecisionApplier, chunked
from gpupool.server.loops.arrivals import FULL_RESCAN_S, Estimates, Window
from gpupool.server.loops.fabric_view import FabricKeeper
from gpupool.server.loops.launches import LaunchWorkers
from gpupool.server.loops.launching import PodLauncher
from gpupool.server.loops.snapshot import MAX_PENDING_PER_CYCLE, StoreView, WorkloadCache, load
from gpupool.server.loops.store_audit import StoreAudit
from gpupool.server.loops.time_limits import LIMIT_CHECK_S, TimeLimits
from gpupool.server.runtime import Runtime
from gpupool.server.services import rendezvous
from gpupool.server.serving.headroom import HeadroomBook

__all__ = ["FULL_RESCAN_S", "LIMIT_CHECK_S", "RECORD_CHUNK", "CycleStats", "Scheduler", "chunked"]

log = logging.getLogger("gpupool.scheduler")
AUDIT_S = 60.0
"""How often (at most) a full pass checks the kept view against one built afresh from the store
(`ViewKeeper.cycle(audit=True)`); a difference would be a bug, and the view is then rebuilt. It
cannot see a store that diverged from the cache the snapshot is built from: `StoreAudit` does."""
ARRIVALS_PER_CYCLE = 128
"""A cycle that looks at new arrivals only takes at most this many, first in the core's order;
the rest go to the next cycles. A burst of submissions is then decided in several short cycles,
as if the loop had run during the burst, rather than one long one that holds up the API (which
shares the interpreter with the loop). Full passes read up to MAX_PENDING_PER_CYCLE."""


@dataclass(frozen=True, slots=True)
class CycleStats:
    admitted: int
    pending: int
    seconds: float
    stopped: int = 0
    """Workloads preempted or evicted by the cycle (requeued: the loop runs again at once)."""


class Scheduler:
    """One call of `cycle()` admits what fits now and hands it to the provider."""

    def __init__(self, rt: Runtime, policies: Policies, seed: int = 0) -> None:
        self.rt = rt
        self.policies = policies
        self.headroom = HeadroomBook(rt)
        self.rng = random.Random(seed)
        self.cache = WorkloadCache()
        self.keeper: ViewKeeper = FabricKeeper(rt)
        """The core's view of the pool, kept from cycle to cycle and brought up to date with each
        snapshot, so a cycle costs what changed rather than the size of the pool."""
        self._core_nodes: tuple[Node, ...] | None = None
        """The nodes the core last saw: a change (a device or node turned unhealthy) runs a cycle
        even with nothing pending, so that its work is evicted."""
        self.launches = LaunchWorkers(rt.provider, rt.clock, deadline_s=rt.settings.launch_deadline_s)
        """The nodes' launch workers (loops/launches.py): a slow node holds up only its own launches."""
        rt.launches = self.launches
        # a node that stops or starts refusing launches (its stuck threads) changes what fits
        self.launches.on_stuck_change = rt.capacity_may_have_changed
        self.ports = rendezvous.PortBook()
        """The MASTER_PORT each multi-pod gang holds on its rank-0 node (services/rendezvous.py)."""
        self.window = Window()
        self.estimates = Estimates(rt, self.cache)
        self.launcher = PodLauncher(rt, self.launches)
        self.applier = DecisionApplier(rt, policies, self.cache, self.window, self.estimates, self.launcher,
                                       self.ports)
        self.time_limits = TimeLimits(rt, on_ended=lambda workload_id: self.finished(workload_id, None))
        self.requeued = False
        """A cycle requeued work (preemption, eviction): the next cycle must look at all pending work."""
        self._next_audit_s = float("-inf")
        self.store_audit = StoreAudit(rt.settings.store_audit_interval_s)
        """The cached placements against the store read afresh (loops/store_audit.py)."""

    # ------------------------------------------------------------------ the parts, as the loop sees them

    @property
    def info(self) -> dict[str, WorkloadInfo]:
        """What the core may know of each workload beyond its spec (loops/arrivals.py `Estimates`)."""
        return self.estimates.info

    @property
    def estimator(self) -> RuntimeEstimator:
        return self.estimates.estimator

    @property
    def reservation(self) -> tuple[str, float] | None:
        """(head workload, expected start) as last stored."""
        return self.applier.reservation

    @property
    def on_slide(self) -> Callable[[float], None] | None:
        """Told how far (seconds) the same head's reserved start moved later than last stored."""
        return self.applier.on_slide

    @on_slide.setter
    def on_slide(self, told: Callable[[float], None] | None) -> None:
        self.applier.on_slide = told

    @property
    def waiting(self) -> bool:
        """Whether pods may be waiting for a stopping pod to release their devices."""
        return self.launcher.waiting

    def finished(self, workload_id: str, worked_s: float | None) -> None:
        """A workload ended for good (its run time, when it succeeded, joins the history)."""
        self.estimates.finished(workload_id, worked_s)

    def promote_waiting(self) -> int:
        """Launch the waiting pods whose devices are free (loops/launching.py)."""
        return self.launcher.promote_waiting()

    def record_launches(self) -> int:
        """Record the launch outcomes ready now (loops/launching.py); returns how many."""
        return self.launcher.record_launches()

    def enforce_time_limits(self) -> int:
        """Fail the workloads past their time limit (loops/time_limits.py); returns how many."""
        return self.time_limits.enforce()

    # ------------------------------------------------------------------ the cycle

    def cycle(self, capacity_changed: bool = True) -> CycleStats:
        """Admit what fits now, and carry out the cycle's preemptions, evictions and reservation.

        Like Kueue's best-effort FIFO, work that did not fit is set aside until capacity may have
        changed (a pod ended, a cancel, an uncordon, a quota change, a node change) and only new
        arrivals are examined meanwhile; a full pass also runs every FULL_RESCAN_S.
        """
        start = time.perf_counter()
        now = self.rt.clock()
        exhausted = self.rt.budgets.exhausted_tenants(self.rt)  # every few seconds: spend, warnings
        if not self.estimates.history_loaded:
            self.estimates.load_history()
        # before the snapshot is read: a difference drops the cache, so this cycle reads it afresh
        diverged = self.store_audit.due(now) and self.store_audit.check(self.rt, self.cache)
        if diverged:
            self._next_audit_s = float("-inf")  # and the kept view is checked against it
        window = self.window
        full = window.full_due(now, forced=diverged or capacity_changed or self.requeued)
        self.requeued = False
        window.begin(full, now)
        limit = MAX_PENDING_PER_CYCLE if full else ARRIVALS_PER_CYCLE
        # Under backfill the head's reservation must hold in every cycle, so a cycle of new
        # arrivals looks at the reserved head too (else an arrival could take its devices).
        reservation = self.applier.reservation
        head = frozenset({reservation[0]}) if reservation is not None and not full else frozenset()
        view = load(self.rt, self.cache, since_s=window.since_s(full), skip=window.skip(head), limit=limit,
                    now_s=now, also=head)
        view = _without_launches(view, self.launches.stuck_nodes())
        more = window.seen(view, full=full, limit=limit, now=now)
        if more:
            # More arrivals wait beyond this cycle's share: run again soon, after the loop's rest.
            self.rt.wake.set()
        candidates = window.candidates(view, head)
        nodes_changed = view.snapshot.nodes != self._core_nodes
        # with topology moves on, a full pass runs the cycle even with nothing pending: a spread
        # gang may move into a leaf that work ending has freed
        may_move = full and self.policies.moves is not None and bool(view.snapshot.allocations)
        # a telemetry sample waits to be judged (congested gangs may be due to move)
        sampled = self.rt.fabric is not None and self.rt.fabric.congestion_sample is not None
        if not candidates and not nodes_changed and not may_move and not sampled:
            if reservation is not None and not view.pending:
                self.applier.clear_reservation()
            return CycleStats(0, len(view.pending), time.perf_counter() - start)
        self._core_nodes = view.snapshot.nodes
        self.estimates.note(candidates)
        # what changed since the last cycle, handed over rather than found again by the cycle: the
        # allocations the cache read afresh or dropped, and (a full pass) the kept pending queue
        snapshot = dataclasses.replace(view.snapshot, workload_info=self.estimates.info,
                                       changes=self.cache.changes())
        pending: Sequence[Workload] = candidates
        if full and len(candidates) == len(view.pending):
            pending = self.cache.pending.follow(view.pending)
        # the core enforces the queues' quotas itself (Kueue semantics), and tenants' budgets
        policies = dataclasses.replace(self.policies, quota=view.quota, exhausted_tenants=exhausted,
                                       headroom=self.headroom.current())  # services' (docs/services.md)
        audit = full and now >= self._next_audit_s
        if audit:
            self._next_audit_s = now + AUDIT_S
            drifts = self.keeper.drifts
        undoable = not full and self.policies.preemption
        rng_state = self.rng.getstate() if undoable else None
        result = self.keeper.cycle(snapshot, pending, policies, now, self.rng, audit=audit,
                                   undoable=undoable)
        if audit and self.keeper.drifts != drifts:
            log.error("the scheduler's kept view had drifted from the store (its free capacity differed "
                      "from a view built afresh); it was built afresh")
        if rng_state is not None and result.victim_searches:
            # An arrival looked for victims, but a full pass may decide (and say) otherwise: older
            # work of its queue, set aside since the last one, comes first there, may hold the
            # backfill reservation (no preemption then) or use up the cycle's victim searches.
            # Nothing of this cycle is carried out: a full pass decides instead, from the same
            # random state, on the view built afresh.
            self.keeper.discard()
            self.rng.setstate(rng_state)
            return self.cycle(capacity_changed=True)
        launches, applied = self.applier.record(result, view, more)
        self.launcher.submit(launches)
        if applied.requeued:
            self.requeued = True
        return CycleStats(applied.admitted, len(candidates), time.perf_counter() - start, applied.requeued)


def _without_launches(view: StoreView, stuck: frozenset[str]) -> StoreView:
    """The view with the nodes given no launches (their launch threads stuck) cordoned: no new work
    is placed there, the work running there stays."""
    if not stuck:
        return view
    nodes = tuple(dataclasses.replace(n, cordoned=True) if n.name in stuck and not n.cordoned else n
                  for n in view.snapshot.nodes)
    return dataclasses.replace(view, snapshot=dataclasses.replace(view.snapshot, nodes=nodes))
