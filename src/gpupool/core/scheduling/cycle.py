"""One scheduling cycle: the single function the simulator and the server both call.

Steps, in order:
  1. snapshot  - build the view (free capacity, running workloads, quota usage) from the snapshot;
                 workloads on unhealthy nodes or devices are evicted and requeued as whole gangs.
  2. nominate  - validate each pending workload (queue, priority class, can it ever fit) and
                 order them with the ordering policy (fifo, priority-fifo, drf, las...).
  3. place     - for each in order: check its ClusterQueue's quota, then place the gang
                 all-or-nothing with the placement policy. A shape (pod sizes) that failed to
                 place once in this cycle is not tried again until something is freed. Once
                 every workload not yet reached has a (queue, shape, rank) that already failed
                 every step, or a blocked queue, the rest of the walk (or of its priority band,
                 under a banded ordering) gets those verdicts without being walked.
  4. admit or preempt - admit it (under backfill: only if it does not delay the reserved head;
                 work that would outlast a gang's reservation on the nodes reserved for it
                 inside its leaf is placed elsewhere first);
                 else try to preempt lower-priority work of its ClusterQueue or reclaim quota lent
                 to its cohort; else, under backfill, the first stuck workload gets a reservation
                 (a gang's inside one leaf when that start is not much later:
                 `locality.reserve_in_domain`);
                 under a strict ordering without backfill its ClusterQueue is blocked.
  5. requeue   - every preempted or evicted workload is reported for requeueing, with the
                 progress it resumes from (its last checkpoint) and the work it lost.

Decisions are plain data; nothing here does I/O or reads a clock, and the same inputs (including
the rng's seed) give the same result. `run_cycle` builds the view from a snapshot; `cycle_on` runs
on a view the caller keeps (the replay's, or `keeper.ViewKeeper`'s for the server).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from itertools import compress, filterfalse, repeat
from operator import add, attrgetter, not_
from typing import Any, NamedTuple, Never, cast

import numpy as np

from gpupool.core.model import ClusterSnapshot, PodPlacement, Reason, SliceDefaults, Workload, WorkloadInfo
from gpupool.core.overcommit import OvercommitConfig
from gpupool.core.priority import PriorityClasses
from gpupool.core.quota import QuotaConfig
from gpupool.core.scheduling.backfill import Reservation, kept_reserve, may_backfill
from gpupool.core.scheduling.congestion import MigrateRule
from gpupool.core.scheduling.domains import only
from gpupool.core.scheduling.gang import GangPlacement, hold_gang, place_gang, release_gang
from gpupool.core.scheduling.gang_victims import fewer_nodes
from gpupool.core.scheduling.headroom import Headroom, keeps, refusal
from gpupool.core.scheduling.locality import WaitCap, reserve_in_domain, wait_for_domain
from gpupool.core.scheduling.moves import Move, MoveRule, plan_moves
from gpupool.core.scheduling.ordering.base import OrderingContext, OrderStream, PendingChanges, make_ordering
from gpupool.core.scheduling.packing import packed_gang
from gpupool.core.scheduling.pairing import pair_gang
from gpupool.core.scheduling.pending import PendingQueue
from gpupool.core.scheduling.policies.base import DEFAULT_POLICY, NoFit
from gpupool.core.scheduling.preemption import VictimIndex, lost_work_s, select_victims
from gpupool.core.scheduling.reach import PreemptionRules
from gpupool.core.scheduling.spread import spread_gang
from gpupool.core.scheduling.view import ClusterView, Running
from gpupool.core.scheduling.workloads import Meta, Shape
from gpupool.core.state import ClusterState, clone_state
from gpupool.core.topology_spec import Tier, TopologySpec

steer_backfill = True
"""Work that would outlast a gang's reservation on the nodes the gang is reserved on is placed
elsewhere first, when it fits elsewhere (`_Cycle._steer`)."""

preempt_beside_reservation = True
"""A reservation never holds back work that may preempt: the victim search runs with a reservation
in place, and work of a higher priority class than the head starts where it fits (`_Cycle._above_head`).
False: a reservation turns preemption off for the rest of the cycle, as before (kept to measure the
change: `bench/reservations.py`)."""

beside_reserved = True
"""Work the reservation refuses where the placement policy put it is placed again off the nodes the
head is reserved on, and starts there when it fits (`_Cycle._beside`)."""

incremental_live = True
"""After a preemption, the keys still live are brought back from those settled since (`_revive`)
rather than made afresh from every key of the cycle (the same set; False: made afresh)."""

DEFAULT_TOPOLOGY = TopologySpec(preferred=Tier.LEAF)
NO_INFO = WorkloadInfo()
"""Multi-pod gangs start inside one leaf when one has room, unless the operator says otherwise."""


@dataclass(frozen=True, slots=True)
class Policies:
    """Which plug-ins a cycle uses, by registered name, and the operator's admission settings."""

    placement: str = DEFAULT_POLICY
    placement_options: Mapping[str, Any] = field(default_factory=dict)
    ordering: str = "priority-fifo"
    preemption: bool = False
    backfill: bool = False
    ordering_options: Mapping[str, Any] = field(default_factory=dict)
    quota: QuotaConfig = field(default_factory=QuotaConfig)
    priority_classes: PriorityClasses = field(default_factory=PriorityClasses)
    overcommit: OvercommitConfig | None = None
    max_preemption_attempts: int = 16
    """Victim searches per cycle (each may place the preemptor dozens of times); the rest wait."""
    defaults: SliceDefaults = field(default_factory=SliceDefaults)
    """What a pod holds of the amounts its request leaves at 0 (proportional device memory, the
    node's per-device share of cpu and memory)."""
    exhausted_tenants: frozenset[str] = frozenset()
    """Tenants that spent their budget for this period (computed by the caller from its meter): their
    pending work waits with `Reason.BUDGET_EXHAUSTED` before placement; their running work continues."""
    topology_default: TopologySpec | None = DEFAULT_TOPOLOGY
    """The topology constraint of multi-pod gangs that name none; read only where the view knows a
    fabric (`ClusterView.set_topology`)."""
    max_locality_wait_s: float = 300.0
    """The longest a gang that could start spread waits for a domain of its preferred tier."""
    locality_wait_cap: WaitCap = WaitCap.FIXED
    """FIXED: at most `max_locality_wait_s`; LOSS: a gang whose spread would cost it more may wait up
    to that cost in all; QUEUE: the cost counted for the queue behind it too (`locality`)."""
    max_locality_wait_ceiling_s: float = math.inf
    """Under LOSS and QUEUE, the longest any gang waits in all, whatever its estimates say."""
    preemption_rules: PreemptionRules = field(default_factory=PreemptionRules)
    """How far a preemptor's priority reaches: its queue, its cohort, the pool (`reach`)."""
    moves: MoveRule | None = None
    """Move running gangs spread over several leaves into one, moving single-node work to make room
    (`moves`), before anything is admitted; None: never (the config's topology_moves)."""
    headroom: Headroom | None = None
    """Room kept free from new work outside the services' classes (`headroom`); None: none."""
    pack_classes: frozenset[str] = frozenset()
    """Classes whose workloads go onto nodes already in use before a free one (`packing`)."""
    migrate: MigrateRule | None = None
    """Stop and requeue gangs whose bottleneck link stayed congested (`congestion`), judged on the
    telemetry sample the caller hands the view; None: never (the config's
    fabric.migrate_on_congestion)."""


class EventKind(StrEnum):
    """How a running workload is stopped (`Stop.kind`)."""

    PREEMPT = "preempt"
    EVICT = "evict"
    MIGRATE = "migrate"
    """Checkpoint-requeued off a congested link (`Policies.migrate`, judged on the telemetry sample
    the caller hands the view: `ClusterView.congestion_sample`)."""
    MOVE = "move"
    """Stopped and started again at once elsewhere (`Policies.moves`): a gang into one leaf, or
    single-node work making room for it."""


StopKind = EventKind


@dataclass(frozen=True, slots=True)
class Admit:
    """A pending workload starts now, on these placements (one per pod)."""

    workload_id: str
    placements: tuple[PodPlacement, ...]


@dataclass(frozen=True, slots=True)
class Stop:
    """A running workload stopped and requeued as a whole gang (one record for both), resuming from
    `resume_progress_s` (its last checkpoint) and losing `lost_work_s` of run time since it.

    PREEMPT: by `preemptor_id` (reason preempted or reclaimed); EVICT: its hardware broke (no grace);
    MIGRATE: its bottleneck link stayed congested; MOVE: restarted at once on `placements` (already
    so in the view), into one leaf for gang `gang_id` (itself, or the gang it makes room for)."""

    workload_id: str
    kind: EventKind
    reason: Reason
    message: str
    preemptor_id: str = ""
    grace: bool = True
    """Whether its pods get their priority class's grace between SIGTERM and SIGKILL (False: killed
    at once, as on broken hardware)."""
    resume_progress_s: float = 0.0
    lost_work_s: float = 0.0
    lost_device_s: float = 0.0
    placements: tuple[PodPlacement, ...] = ()
    gang_id: str = ""


class Wait(NamedTuple):
    """A workload left pending this cycle, and why.

    Named tuples rather than dataclasses (`Wait`, `Refuse`): a cycle reports one for every waiting
    workload, thousands at a time.
    """

    workload_id: str
    reason: Reason
    message: str

    @property
    def final(self) -> bool:
        return False


class Refuse(NamedTuple):
    """A workload refused for good (it can never run here, or names no queue or class that exists)."""

    workload_id: str
    reason: Reason
    message: str

    @property
    def final(self) -> bool:
        return True


Rejection = Wait | Refuse
"""A workload not started by this cycle: waiting, or refused for good."""


@dataclass(frozen=True, slots=True)
class Reserve:
    """Under backfill: the head of the queue and when it is expected to start."""

    workload_id: str
    start_s: float
    slid_s: float = field(default=0.0, compare=False)
    """How much later `start_s` is than the start first reserved for this head (in the view's
    cycles since it became the head): a start moves later only as the runs it waits on overrun
    their estimates (`backfill.corrected_end_s`), work that may preempt takes their room, or work
    before the head in the order starts first."""


Decision = Admit | Stop | Wait | Refuse | Reserve
"""Every kind of decision a cycle makes. Each applier (the server's `DecisionApplier._apply`, the
replay's `Replay._apply`) dispatches them with one `match` ending in `unhandled`, so a kind added
here fails the type check there (and raises at run time) rather than being dropped silently."""


def unhandled(decision: Never) -> Never:
    """The last case of an applier's match: mypy proves it unreachable; reached, it raises."""
    raise TypeError(f"No applier case for the decision {decision!r} (of kind {type(decision).__name__}); "
                    "every kind of `Decision` must be applied.")


@dataclass(frozen=True, slots=True)
class CycleResult:
    """The cycle's decisions, one per workload it decided about, in the order it made them: stops
    of broken hardware and congestion first, then topology moves, then the walk's (a preemptor's
    victims stopped before it is admitted; waits and refusals in the order reached or passed
    over), and the reservation, if any, last. A workload moved and then preempted in the same cycle
    has only its preemption.

    The properties below are read-only views by kind (for tests and reports); appliers walk
    `decisions`."""

    decisions: tuple[Decision, ...] = ()
    victim_searches: int = 0
    """How many times the walk searched for victims to preempt (whether or not it found them)."""

    @property
    def admitted(self) -> tuple[Admit, ...]:
        return tuple(d for d in self.decisions if type(d) is Admit)

    @property
    def stopped(self) -> tuple[Stop, ...]:
        """Every stop, moves included."""
        return tuple(d for d in self.decisions if type(d) is Stop)

    @property
    def preempted(self) -> tuple[Stop, ...]:
        """Stops that requeue (preempted, evicted, migrated): everything but moves."""
        return tuple(d for d in self.decisions if type(d) is Stop and d.kind is not EventKind.MOVE)

    @property
    def requeued(self) -> tuple[Stop, ...]:
        """The same records as `preempted`: a stop and its requeue are one."""
        return self.preempted

    @property
    def moved(self) -> tuple[Stop, ...]:
        """Running workloads restarted at once on new nodes (`Policies.moves`), already so in the view."""
        return tuple(d for d in self.decisions if type(d) is Stop and d.kind is EventKind.MOVE)

    @property
    def rejected(self) -> tuple[Rejection, ...]:
        return tuple(d for d in self.decisions if type(d) is Wait or type(d) is Refuse)

    @property
    def reservation(self) -> Reserve | None:
        last = self.decisions[-1] if self.decisions else None
        return last if type(last) is Reserve else None


def run_cycle(
    snapshot: ClusterSnapshot,
    pending: Sequence[Workload],
    policies: Policies,
    now_s: float,
    rng: random.Random,
) -> CycleResult:
    """Decide, for every pending workload, whether it is admitted now and where it runs."""
    view = ClusterView.from_snapshot(snapshot, policies.quota, policies.priority_classes, policies.defaults)
    return cycle_on(view, pending, policies, now_s, rng)


def cycle_on(
    view: ClusterView,
    pending: Sequence[Workload],
    policies: Policies,
    now_s: float,
    rng: random.Random,
) -> CycleResult:
    """Steps 1-5 on a live view; the view is updated with the decisions (see the module docstring)."""
    view.use_defaults(policies.defaults)
    view.topology_default = policies.topology_default
    return _Cycle(view, policies, now_s, rng).run(pending)


BLOCKED_BY_HEAD = "Starting now would delay the reserved head."
WAITING_FOR_HEAD = "An older workload of its queue waits first."

_workload_id = attrgetter("id")
_running_id = attrgetter("workload.id")
_as_wait = partial(tuple.__new__, Wait)
"""A Wait from a plain (id, reason, message) tuple, without the keyword-checking constructor."""


def _wait_of(wid: str, verdict: tuple[Reason, str]) -> Wait:
    return _as_wait((wid, *verdict))


def _budget_wait(w: Workload) -> Wait:
    message = f"Tenant {w.tenant!r} spent its budget for this period; its running work continues."
    return _as_wait((w.id, Reason.BUDGET_EXHAUSTED, message))


def moved_why(move: Move) -> str:
    """Why a workload was moved (`Policies.moves`), naming where it went."""
    where = ", ".join(sorted({p.node for p in move.placements}))
    if move.workload_id == move.gang_id:
        return f"Moved into one leaf ({where}): its pods ran spread over several."
    return f"Moved to {where} to make room for gang {move.gang_id!r} inside one leaf."


class _Cycle:
    """The mutable bookkeeping of one cycle."""

    pass_over = True
    """Pass over the workloads whose verdict is already known (see `run`); False walks every one
    (the same decisions, slower: kept to check that claim)."""
    keep_refusals = True
    """Refuse work the reservation refused a moment ago for its (ClusterQueue, shape) without
    placing it again (`outlast`); False places each one (the same decisions, slower: kept to check
    that claim)."""
    keep_pending = True
    """Count the pending workloads with the view's `PendingBook` (fed by arrivals and departures);
    False looks every one up on every cycle (the same decisions, slower: kept to check that claim)."""
    group_walk = True
    """Take a workload whose (queue, shape, rank) already has this cycle's verdict, or whose queue
    is blocked, inline in the walk: its wait and its key's count, without the calls of a
    consideration or the band's check (`run`); False considers each one (the same decisions in the
    same order, slower: kept to check that claim)."""
    keep_waits = True
    """Reuse the wait a passed-over workload got last while its verdict is the same (the view's
    `PassedWaits`); False builds every one afresh (equal records, slower: kept to check that claim)."""

    def __init__(self, view: ClusterView, policies: Policies, now_s: float, rng: random.Random) -> None:
        self.view = view
        self.policies = policies
        self.now_s = now_s
        self.rng = rng
        self.exhausted = policies.exhausted_tenants
        self.policy = view.placement_policy(policies.placement, policies.placement_options)
        self.ordering = make_ordering(policies.ordering, **dict(policies.ordering_options))
        self.models = tuple(view.state.models)
        self.failed_shapes: dict[Shape, NoFit] = {}
        self.failed_quota: dict[tuple[str, Shape], str] = {}
        self.failed_preempt: set[tuple[str, Shape, tuple[int, int]]] = set()
        self.blocked: set[str] = set()
        self.preemption_attempts = 0
        self.settled: dict[tuple[str, Shape, tuple[int, int]], tuple[Reason, str]] = {}
        self.never: dict[tuple[str, Shape, tuple[int, int]], tuple[Reason, str]] = {}
        """Keys whose workloads can never run here (final rejections; a function of queue and shape)."""
        self.left: dict[tuple[str, Shape, tuple[int, int]], int] = {}
        """How many workloads of each (queue, shape, rank) the walk has not reached yet."""
        self.live: set[tuple[str, Shape, tuple[int, int]]] = set()
        """The keys in `left` still to be reached whose verdict is not settled (nor their queue blocked)."""
        self.unsettled: list[tuple[str, Shape, tuple[int, int]]] = []
        self.zeroed: list[tuple[str, Shape, tuple[int, int]]] = []
        """The keys settled (`_consider`) and those whose band was passed over (`_reject_reached`)
        since `live` was last made whole: the only ones a preemption can change (`_revive`)."""
        self.empty_state: ClusterState | None = None
        self.victims: VictimIndex | None = None
        """The cycle's victim candidates, sorted once (made by the first victim search)."""
        self.reservation: Reservation | None = None
        self.retook = False
        """Work that may preempt took room the reservation counted on this cycle (`_reserve_again`)."""
        self.outlast: set[tuple[str, Shape]] = set()
        """(ClusterQueue, shape) of single placements the reservation just refused for work that
        outlasts its start: work of the same key that outlasts it is refused the same way, without
        being placed, until an admission changes the pool (`_admit`) or a hold is added."""
        self.repeatable = self.keep_refusals and self.policy.is_repeatable()
        self.locality_known: dict[object, Reservation | None] = {}
        """Reservations found for gangs waiting for locality this cycle, by shape (`locality`)."""
        self.backlog = 0
        self.valid: Sequence[Workload] = ()
        """The workloads pending this cycle that passed validation (`_nominate`)."""
        self.valid_ids: list[str] | None = None
        """Their ids in order, when a `PendingQueue` lists them (else None: read from `valid`)."""
        self.held_until: np.ndarray | None = None
        """[node] the earliest expected start of the waiting gangs that hold it this cycle (inf: none);
        under WaitCap LOSS / QUEUE every waiting gang holds the nodes it is reserved on, not only
        the first (which `reservation` guards exactly)."""
        self.decisions: list[Decision] = []
        """Every decision so far, in the order made (`CycleResult`)."""
        self.admitted_ids: set[str] = set()
        """The workloads admitted by this cycle (never victims of its preemptions)."""
        self.preempted_ids: set[str] = set()

    def run(self, pending: Sequence[Workload]) -> CycleResult:
        self._evict_broken()
        self._migrate_congested()
        moved: list[Stop] = []
        if self.policies.moves is not None:
            moved = [self._move(m) for m in plan_moves(self.view, self.policy, self.now_s, self.rng,
                                                        self.policies.moves)]
            self.decisions.extend(moved)
        valid, stream = self._nominate(pending)
        self.backlog = max(0, len(valid) - 1)  # the others pending this cycle (WaitCap.QUEUE)
        self.valid = valid
        banded = self.ordering.banded
        metas = self.view.metas
        exhausted = self.exhausted
        tried: list[str] = []
        """The ids of the workloads reached or passed over so far."""
        # Work whose key already has a verdict (or whose queue is blocked) is taken inline, as
        # `_reached` and `_consider` would (`group_walk`): its verdict, its key's count. Only
        # after a consideration whose checks below passed, within that band: such a workload
        # changes neither `live` nor the band, so those checks would pass again.
        inline = self.group_walk and self.pass_over and not exhausted
        any_band = not banded
        passed: int | None = None
        """The band the checks last passed in (None: the next workload is considered)."""
        settled, blocked, left, decisions = self.settled, self.blocked, self.left, self.decisions
        waiting = (Reason.WAITING_FOR_HEAD, WAITING_FOR_HEAD)
        new = tuple.__new__
        while (w := stream.next_workload()) is not None:
            wid = w.id
            tried.append(wid)
            meta = metas[wid]
            if passed is not None:
                key = meta.key
                if any_band or key[2][0] == passed:
                    verdict = waiting if key[0] in blocked else settled.get(key)
                    if verdict is not None:  # (its key is not in `live`: nothing to discard)
                        left[key] -= 1
                        decisions.append(new(Wait, (wid, *verdict)))
                        continue
                passed = None
            if exhausted and w.tenant in exhausted:
                # not counted in `left`: passed over like a blocked queue's work, before placement
                self.decisions.append(_budget_wait(w))
            else:
                self._reached(meta)
                self._consider(w, meta)
            if not self.pass_over:
                continue
            if not self.live:
                # Every workload still waiting has a (queue, shape, rank) that already failed every
                # step in this cycle, or a blocked queue: the walk would only repeat those verdicts.
                self._reject_rest(valid, tried)
                break
            band = meta.rank[0]
            if banded and not any(k[2][0] == band for k in self.live):
                # The same for the rest of this priority band: pass over it to the next band.
                skipped = stream.skip_band()
                wids = list(map(_workload_id, skipped))  # read once: `_reject_rest` reads them again
                self._reject_reached(skipped, band, wids)
                tried.extend(wids)
            elif inline:
                passed = band
        decisions = self.decisions
        if moved and self.preempted_ids:
            # Work moved at the start of the cycle may be preempted by its walk (a move has just
            # restarted it, so it loses the least): it is reported stopped once, as preempted from
            # where it ran, never also as moved to a placement it no longer holds.
            dropped = {id(m) for m in moved if m.workload_id in self.preempted_ids}
            decisions = [d for d in decisions if id(d) not in dropped]
        if self.reservation is not None:
            head_id, start_s = self.reservation.head.id, self.reservation.start_s
            slid_s = self.view.note_reserved(head_id, start_s, self.retook)
            decisions.append(Reserve(head_id, start_s, slid_s))
        return CycleResult(tuple(decisions), self.preemption_attempts)

    # ------------------------------------------------------------ step 1: broken hardware

    def _evict_broken(self) -> None:
        # In workload-id order: the view's own order follows how its running records were built
        # (admissions as they came, or a snapshot after a rebuild), and a list of stops must not.
        for run in sorted(self.view.to_evict, key=_running_id):
            resume, lost = lost_work_s(run, self.now_s)
            self.decisions.append(Stop(
                run.workload.id, EventKind.EVICT, Reason.EVICTED_UNHEALTHY,
                "A node or device it ran on became unhealthy; the whole gang is requeued.",
                grace=False, resume_progress_s=resume, lost_work_s=lost,
                lost_device_s=lost * run.device_count,
            ))
        self.view.to_evict.clear()

    def _migrate_congested(self) -> None:
        """Gangs whose bottleneck link stayed congested (`Policies.migrate`) are stopped and
        requeued, to be placed again away from it (judged once per telemetry sample)."""
        view = self.view
        sample = view.congestion_sample
        if sample is None:
            return
        view.congestion_sample = None
        rule = self.policies.migrate
        if rule is None:
            view.congested_since.clear()
            return
        view.materialize()  # the running records of allocations taken from a snapshot (once per sample)
        info = view.info
        movable = {w for w in view.running if (info.get(w) or NO_INFO).congestion_moves < rule.max_moves_each}
        due = rule.judge(sample, movable, view.congested_since)
        for wid in due:
            before = info.get(wid) or NO_INFO
            info[wid] = dataclasses.replace(before, congestion_moves=before.congestion_moves + 1)
            run = view.remove(wid)  # its devices and quota given back: placed again from pending
            resume, lost = lost_work_s(run, self.now_s)
            self.decisions.append(Stop(
                wid, EventKind.MIGRATE, Reason.CONGESTION_MOVED, rule.why(),
                resume_progress_s=resume, lost_work_s=lost, lost_device_s=lost * run.device_count,
            ))

    def _move(self, move: Move) -> Stop:
        run = self.view.running.get(move.workload_id)
        devices = run.device_count if run is not None else 0
        return Stop(move.workload_id, EventKind.MOVE, Reason.MOVED_FOR_LOCALITY, moved_why(move),
                    resume_progress_s=move.resume_progress_s, lost_work_s=move.lost_work_s,
                    lost_device_s=move.lost_work_s * devices, placements=move.placements,
                    gang_id=move.gang_id)

    # ------------------------------------------------------------ step 2: nominate

    def _nominate(self, pending: Sequence[Workload]) -> tuple[list[Workload], OrderStream]:
        view = self.view
        book = view.pending_book
        arrivals = book.update(pending, self._meta) if self.keep_pending else None
        waits = view.passed_waits
        if arrivals is None:
            waits.clear()  # no departures known: the records start afresh
        elif book.departed:
            waits.forget(book.departed)
        changes = None
        if arrivals is None:
            valid = self._validate(pending)
            view.tell_policy(valid)
        else:
            if book.invalid:
                invalid = book.invalid
                self._refuse([w for w in pending if id(w) in invalid])
                valid = [w for w in pending if id(w) not in invalid]
                arrivals = [w for w in arrivals if id(w) not in invalid]
            else:
                valid = list(pending)
                if isinstance(pending, PendingQueue):
                    self.valid_ids = pending.ids()
            self.left = dict(book.counts)
            # the policy has been told of every workload listed before (unless it starts afresh)
            view.tell_policy(valid if view.policies.prepared < 0 else arrivals)
            changes = PendingChanges(book.serial, arrivals, book.departed)
        if self.ordering.needs_usage:
            view.materialize()
        ctx = OrderingContext(
            now_s=self.now_s,
            rank=lambda w: view.metas[w.id].rank,
            capacity=view.capacity(),
            tenant_usage=view.tenant_usage,
            tenant_weights=self.policies.quota.tenant_weights,
            info=view.info,
            demand=view.demand,
            memo=view.ordering_memo,
            changes=changes,
        )
        if self.exhausted:
            self._discount_exhausted(valid)
        else:
            self.live = set(self.left)
        return valid, self.ordering.stream(valid, ctx)

    def _discount_exhausted(self, valid: Sequence[Workload]) -> None:
        """Keys count only the work that may be placed: an exhausted tenant's work waits whatever its
        key's verdict, so a key left with none of the other tenants' work is not live."""
        exhausted, metas, left = self.exhausted, self.view.metas, self.left
        for w in valid:
            if w.tenant in exhausted:
                left[metas[w.id].key] -= 1
        self.live = {k for k, n in left.items() if n}

    def _meta(self, w: Workload) -> Meta:
        return self.view.meta(w, self.policies.overcommit)

    def _refuse(self, invalid: Sequence[Workload]) -> None:
        """Final rejections of workloads of an unknown priority class or queue."""
        view = self.view
        for w in invalid:
            meta = self._meta(w)
            if not meta.class_known:
                names = ", ".join(c.name for c in view.classes.classes)
                self._reject(w, Reason.UNKNOWN_PRIORITY_CLASS, f"Use one of: {names}.", final=True)
            else:
                self._reject(
                    w,
                    Reason.UNKNOWN_QUEUE,
                    f"Queue {w.queue!r} of tenant {w.tenant!r} feeds no ClusterQueue; create it first.",
                    final=True,
                )

    def _validate(self, pending: Sequence[Workload]) -> list[Workload]:
        """The plain definition of what `PendingBook` keeps: every workload's meta looked up, the
        valid ones counted per key, the others refused."""
        view = self.view
        overcommit = self.policies.overcommit
        valid: list[Workload] = []
        metas = view.metas
        left = self.left
        for w in pending:
            meta = metas.get(w.id)
            if meta is None or meta.source is not w:
                meta = view.meta(w, overcommit)
            if meta.class_known and meta.cluster_queue is not None:
                valid.append(w)
                key = meta.key
                left[key] = left.get(key, 0) + 1
            elif not meta.class_known:
                names = ", ".join(c.name for c in view.classes.classes)
                self._reject(w, Reason.UNKNOWN_PRIORITY_CLASS, f"Use one of: {names}.", final=True)
            elif meta.cluster_queue is None:
                self._reject(
                    w,
                    Reason.UNKNOWN_QUEUE,
                    f"Queue {w.queue!r} of tenant {w.tenant!r} feeds no ClusterQueue; create it first.",
                    final=True,
                )
        return valid

    # ------------------------------------------------------------ steps 3-4: place, admit or preempt

    def _consider(self, original: Workload, meta: Meta) -> None:
        view = self.view
        cq = meta.cluster_queue or ""
        if cq in self.blocked:
            self._reject(original, Reason.WAITING_FOR_HEAD, WAITING_FOR_HEAD)
            return
        w = meta.placed
        shape = meta.shape
        key = meta.key
        settled = self.settled.get(key)
        if settled is not None:  # the same shape, queue and rank already failed every step
            self.decisions.append(Wait(original.id, settled[0], settled[1]))
            return
        never = self._never_fits(w, shape, cq)
        if never is not None:
            self._reject(original, never[0], never[1], final=True)
            self.never[key] = never
            self.live.discard(key)
            return
        above = self._above_head(meta)
        if self.outlast and not above and (cq, shape) in self.outlast and self._outlasts(w):
            self._reject(original, Reason.BACKFILL_BLOCKED, BLOCKED_BY_HEAD)
            return
        outcome = self._try_place(w, shape, cq)
        if isinstance(outcome, GangPlacement):
            # before backfill's check, which holds an admitted candidate in the reservation's shadow
            multi = view.topology is not None and len(w.pods) > 1
            if multi and self._waits_for_locality(original, w, outcome):
                return
            if self.reservation is not None:
                outcome = self._steer(w, outcome, cq)
            held = self.held_until is not None
            if held and not self._clear_of_holds(outcome, view.remaining_estimate_s(w)):
                release_gang(outcome, view.state)
                self._reject(original, Reason.BACKFILL_BLOCKED,
                             "Starting now would take nodes a gang waiting for its leaf holds.")
                return
            if above:  # it could preempt its way in: the reservation does not hold it back
                self._admit_above(w, outcome, cq)
                return
            if self.reservation is not None and not may_backfill(
                outcome, view.remaining_estimate_s(w), self.reservation, self.now_s, self.policy, self.rng
            ):
                release_gang(outcome, view.state)
                beside = self._beside(w, outcome, cq)
                if beside is not None:
                    self._admit(w, beside, cq)
                    return
                self._reject(original, Reason.BACKFILL_BLOCKED, BLOCKED_BY_HEAD)
                if self.repeatable and not multi and not held:
                    # placed again on the same pool, its key's work lands the same way (the
                    # policy is repeatable) and the shadow did not change (refused)
                    self.outlast.add((cq, shape))
                return
            self._admit(w, outcome, cq)
            return
        reason, message = outcome
        # the services' headroom is not won by preempting (a victim's room would go to batch)
        why_not = "" if reason is Reason.SERVING_HEADROOM else self._try_preempt(w, shape, cq)
        if why_not is None:
            return
        if why_not:
            message = f"{message.rstrip('.')}; {why_not}."
        self._stuck(w, cq, reason)
        self._reject(original, reason, message)
        self.settled[key] = (reason, message)
        self.live.discard(key)
        self.unsettled.append(key)

    def _waits_for_locality(self, original: Workload, w: Workload, gang: GangPlacement) -> bool:
        """Wait or spread (`locality`): True when the gang waits for a domain of its preferred tier
        (its place given back, the domain reserved when no other reservation holds this cycle)."""
        view = self.view
        waiting = wait_for_domain(w, gang, view, self.policies.max_locality_wait_s, self.policy,
                                  self.now_s, self.rng, self.locality_known,
                                  cap=self.policies.locality_wait_cap, backlog=self.backlog,
                                  ceiling_s=self.policies.max_locality_wait_ceiling_s)
        if waiting is None:
            view.locality_waits.pop(w.id, None)
            view.locality_caps.pop(w.id, None)
            return False
        view.locality_waits.setdefault(w.id, self.now_s)
        view.locality_caps[w.id] = waiting.cap_s
        if self.reservation is None:
            self.reservation = waiting.reservation
        elif self.policies.locality_wait_cap is not WaitCap.FIXED and waiting.reservation.nodes is not None:
            if self.held_until is None:
                self.held_until = np.full(len(view.state.nodes), math.inf)
            held = waiting.reservation.nodes
            self.held_until[held] = np.minimum(self.held_until[held], waiting.reservation.start_s)
            self.outlast.clear()  # the holds are checked first: refusals may now read otherwise
        spec = waiting.reservation.head.topology
        tier = str(spec.required) if spec is not None and spec.required is not None else "domain"
        self._reject(original, Reason.WAITING_FOR_LOCALITY,
                     waiting.message(tier))
        return True

    def _outlasts(self, w: Workload) -> bool:
        """Whether the workload is expected to run past the reservation's start (or has no estimate)."""
        assert self.reservation is not None
        estimate_s = self.view.remaining_estimate_s(w)
        return estimate_s is None or self.now_s + estimate_s > self.reservation.start_s

    def _steer(self, w: Workload, gang: GangPlacement, cq: str) -> GangPlacement:
        """The placement of work that outlasts a gang's reservation on the nodes the gang is
        reserved on, moved off them when it fits elsewhere (`steer_backfill`): the gang keeps its
        leaf instead of being placed again, wider, around the newcomer. Else the placement as it was."""
        reservation = self.reservation
        assert reservation is not None
        keep = reservation.fits_on
        if (
            not steer_backfill
            or keep is None
            or (reservation.narrow is None and reservation.domain is None)
            or not any(keep[record.node] for _, record in gang.allocs)
            or not self._outlasts(w)
        ):
            return gang
        view = self.view
        state = view.state
        release_gang(gang, state)
        with only(state, ~keep):
            other = place_gang(w, state, self.policy, self.rng)
        if isinstance(other, GangPlacement):
            if view.quota.fits(cq, view.usage_of(other.allocs)) is None:
                return other
            release_gang(other, state)
        hold_gang(gang, state)  # nowhere else: hold the first placement again
        return gang

    def _clear_of_holds(self, gang: GangPlacement, estimate_s: float | None) -> bool:
        """Whether a placement leaves the nodes held by waiting gangs (`held_until`) alone, or ends
        before the earliest of them is expected to start there."""
        assert self.held_until is not None
        until = min(float(self.held_until[record.node]) for _, record in gang.allocs)
        return until == math.inf or (estimate_s is not None and self.now_s + estimate_s <= until)

    def _try_place(self, w: Workload, shape: Shape, cq: str) -> GangPlacement | tuple[Reason, str]:
        view = self.view
        quota_msg = self.failed_quota.get((cq, shape))
        if quota_msg is None and view.quota.queues:
            quota_msg = view.quota.fits(cq, view.metas[w.id].lower)
        if quota_msg is not None:
            self.failed_quota[(cq, shape)] = quota_msg
            return Reason.QUOTA_EXCEEDED, quota_msg
        nofit = self.failed_shapes.get(shape)
        if nofit is not None:
            return nofit.reason, nofit.message
        spread = pair_gang(w, view, self.policy, self.rng) if w.pair_key else None
        if spread is None and w.priority_class in self.policies.pack_classes:
            spread = packed_gang(w, view, self.policy, self.rng, self.policies.pack_classes)
        elif spread is None and w.spread_key:
            spread = spread_gang(w, view, self.policy, self.rng)
        gang = spread if spread is not None else place_gang(w, view.state, self.policy, self.rng)
        if isinstance(gang, NoFit):
            self.failed_shapes[shape] = gang
            return gang.reason, gang.message
        quota_msg = view.quota.fits(cq, view.usage_of(gang.allocs))
        if quota_msg is not None:
            release_gang(gang, view.state)
            return Reason.QUOTA_EXCEEDED, quota_msg
        headroom = self.policies.headroom
        if headroom is not None and headroom.applies_to(w.priority_class) and not keeps(headroom, view.state):
            release_gang(gang, view.state)
            return Reason.SERVING_HEADROOM, refusal(headroom)
        return gang

    def _try_preempt(self, w: Workload, shape: Shape, cq: str) -> str | None:
        """Preempt so `w` is admitted: None when it was; else why preemption did not help ('' when
        there is nothing to say: not tried, or no lower-priority work runs). A reservation does not
        stop it (work that may preempt is never held back by backfill): the head is reserved again
        on the pool the preemption leaves (`_reserve_again`)."""
        if not self.policies.preemption or (self.reservation is not None and not preempt_beside_reservation):
            return ""
        view = self.view
        key = (cq, shape, view.metas[w.id].rank)
        if key in self.failed_preempt or self.preemption_attempts >= self.policies.max_preemption_attempts:
            return ""
        self.preemption_attempts += 1
        admitted_now = self.admitted_ids
        if self.victims is None:
            self.victims = VictimIndex(view, self.now_s)
        rules = self.policies.preemption_rules
        chosen = select_victims(w, cq, view, self.policy, self.rng, self.now_s, admitted_now, self.victims,
                                rules)
        if chosen is None:
            self.failed_preempt.add(key)
            index = self.victims
            return index.why_none(w, cq, rules, admitted_now)
        if len(w.pods) > 1:  # a gang: victims where it lands on the fewest nodes
            found, reclaim = self.victims.search_order(w, cq, admitted_now, True, None, rules)
            chosen = fewer_nodes(chosen, w, cq, view, self.policy, self.rng, found, self.victims.cost,
                                 frozenset(reclaim))
        headroom = self.policies.headroom
        if headroom is not None and headroom.applies_to(w.priority_class) and not keeps(headroom, view.state):
            # the victims' devices and the free room together: the room is not won by preempting either
            release_gang(chosen.gang, view.state)
            for run in reversed(chosen.victims):
                view.attach(run)
            self.failed_preempt.add(key)
            return refusal(headroom).rstrip(".")
        for run in chosen.victims:
            self._record_preemption(run, w, run.workload.id in chosen.reclaimed)
        self._admit(w, chosen.gang, cq)
        # capacity was freed: shapes that failed before may fit now
        self.failed_shapes.clear()
        self.failed_quota.clear()
        self.failed_preempt.clear()
        self.settled.clear()
        if incremental_live:
            self._revive()
        else:
            blocked, never = self.blocked, self.never
            self.live = {k for k, n in self.left.items() if n and k[0] not in blocked and k not in never}
        self._reserve_again()
        return None

    def _revive(self) -> None:
        """`live` made whole after a preemption (the settled verdicts were cleared): every key left
        to reach, of a queue not blocked, that can ever fit. Only the keys settled since it was last
        made whole come back, and only those whose band was passed over leave (their work is no
        longer left to reach); every other key in `left` is in `live` exactly when it would be made
        afresh (one whose work was all reached, whose queue was blocked or that never fits left it
        for good)."""
        live, left, blocked, never = self.live, self.left, self.blocked, self.never
        if self.zeroed:
            live.difference_update(self.zeroed)
            self.zeroed.clear()
        live.update([k for k in self.unsettled if left[k] and k[0] not in blocked and k not in never])
        self.unsettled.clear()

    def _above_head(self, meta: Meta) -> bool:
        """Whether the workload's priority class ranks above the reserved head's: it could preempt
        the head were the head running, so the head's reservation never holds it back (with
        preemption on)."""
        reservation = self.reservation
        if reservation is None or not self.policies.preemption or not preempt_beside_reservation:
            return False
        head = self.view.metas.get(reservation.head.id)
        return head is not None and meta.rank[0] > head.rank[0]

    def _admit_above(self, w: Workload, gang: GangPlacement, cq: str) -> None:
        """Admit work of a higher class than the reserved head: where it was placed when that does
        not delay the head, else off the head's reserved nodes when it fits there, else where it
        was placed, the head then reserved again (`_reserve_again`)."""
        reservation = self.reservation
        assert reservation is not None
        view = self.view
        if may_backfill(gang, view.remaining_estimate_s(w), reservation, self.now_s, self.policy, self.rng):
            self._admit(w, gang, cq)
            return
        release_gang(gang, view.state)
        beside = self._beside(w, gang, cq)
        if beside is not None:
            self._admit(w, beside, cq)
            return
        hold_gang(gang, view.state)  # nowhere else: take the room the head counted on
        self._admit(w, gang, cq)
        self._reserve_again()

    def _reserve_again(self) -> None:
        """Work that may preempt took room the reservation counted on: the head is reserved again
        on the pool as it now is (its start may move later; the shadow it kept is stale)."""
        reservation = self.reservation
        if reservation is None:
            return
        head = reservation.head
        self.reservation = None
        self.retook = True
        self.outlast.clear()
        if reservation.domain is not None:  # a gang waiting for its leaf: the walk reserves anew
            return
        self._reserve_for(head)

    def _beside(self, w: Workload, refused: GangPlacement, cq: str) -> GangPlacement | None:
        """Work the reservation refused where the policy placed it, placed again off the nodes the
        head is reserved on (`Reservation.fits_on`): there it leaves the head's placement whole, so
        small work starts at once beside the reserved nodes. None: it fits nowhere else (or the
        reservation names no nodes), the state as it was."""
        reservation = self.reservation
        assert reservation is not None
        keep = reservation.fits_on
        if not beside_reserved or keep is None or not keep.any() or keep.all():
            return None
        if not any(keep[record.node] for _, record in refused.allocs):
            return None  # it was off them already: the refusal stands
        view = self.view
        state = view.state
        with only(state, ~keep):
            other = place_gang(w, state, self.policy, self.rng)
        if isinstance(other, NoFit):
            return None
        if view.quota.fits(cq, view.usage_of(other.allocs)) is not None or not may_backfill(
            other, view.remaining_estimate_s(w), reservation, self.now_s, self.policy, self.rng
        ):
            release_gang(other, state)
            return None
        return other

    def _record_preemption(self, run: Running, preemptor: Workload, reclaimed: bool) -> None:
        view = self.view
        resume, lost = lost_work_s(run, self.now_s)
        view.forget(run)
        reason = Reason.RECLAIMED if reclaimed else Reason.PREEMPTED
        why = (
            f"Its ClusterQueue borrowed quota that {preemptor.id!r}'s queue reclaims."
            if reclaimed
            else f"Preempted by higher-priority workload {preemptor.id!r}."
        )
        self.preempted_ids.add(run.workload.id)
        self.decisions.append(Stop(
            run.workload.id, EventKind.PREEMPT, reason, why, preemptor_id=preemptor.id,
            resume_progress_s=resume, lost_work_s=lost, lost_device_s=lost * run.device_count,
        ))

    def _stuck(self, w: Workload, cq: str, reason: Reason) -> None:
        """The workload cannot start: maybe reserve for it (backfill) or block its queue (strict)."""
        if self.policies.backfill and reason != Reason.QUOTA_EXCEEDED:
            if self.reservation is None:
                self._reserve_for(w)
                if self.reservation is None and self.ordering.strict:
                    self._block(cq)  # no reservation possible: strict order still holds
            return
        if self.ordering.strict:
            self._block(cq)

    def _reserve_for(self, w: Workload) -> None:
        self.reservation = kept_reserve(w, self.view, self.now_s, self.policy, self.rng)
        if self.reservation is not None and len(w.pods) > 1:
            self.reservation = reserve_in_domain(
                w, self.reservation, self.view, self.policies.max_locality_wait_s, self.policy,
                self.now_s, self.rng, cap=self.policies.locality_wait_cap, backlog=self.backlog,
                ceiling_s=self.policies.max_locality_wait_ceiling_s, pending=self.valid)

    def _block(self, cq: str) -> None:
        self.blocked.add(cq)
        self.live = {k for k in self.live if k[0] != cq}

    def _admit(self, w: Workload, gang: GangPlacement, cq: str) -> None:
        self.outlast.clear()
        self.view.admit(w, gang, cq, self.now_s)
        self.admitted_ids.add(w.id)
        self.decisions.append(Admit(w.id, gang.placements(self.view.state)))

    def _reached(self, meta: Meta) -> None:
        key = meta.key
        n = self.left[key] - 1  # a key hashes slowly: once to read, once to write
        self.left[key] = n
        if not n:
            self.live.discard(key)

    def _reject_rest(self, valid: Sequence[Workload], tried: Iterable[str]) -> None:
        """The verdicts of the workloads the walk did not reach (listed in `valid`'s order; `tried`:
        the ids of those it reached or passed over)."""
        seen = set(tried)
        if not self.exhausted:  # only the ids are read (a queue lists them: no workload is touched)
            listed = self.valid_ids if self.valid_ids is not None else map(_workload_id, valid)
            self._reject_reached((), wids=list(filterfalse(seen.__contains__, listed)))
            return
        ids = list(map(_workload_id, valid))
        unseen = list(map(not_, map(seen.__contains__, ids)))
        self._reject_reached(list(compress(valid, unseen)), wids=list(compress(ids, unseen)))

    def _reject_reached(
        self, passed: Sequence[Workload], band: int | None = None, wids: list[str] | None = None
    ) -> None:
        """The verdicts of workloads passed over (not yet reached): each repeats its key's or queue's.

        `band`: they are the rest of that priority band, so no key of the band is left to reach.
        `wids`: their ids, when the caller has them (then `passed` is read only under budgets).
        """
        metas = self.view.metas
        left = self.left
        kids = self.view.workloads.key_ids
        kid_of = self.view.workloads.kids
        verdicts: dict[int, tuple[Reason, str]] = {}
        refused: set[int] = set()
        """Keys whose workloads are refused for good (`never`); the others wait."""
        waiting = (Reason.WAITING_FOR_HEAD, WAITING_FOR_HEAD)
        for key in left:
            if key[0] in self.blocked:
                verdicts[kids[key]] = waiting
            elif key in self.settled:
                verdicts[kids[key]] = self.settled[key]
            elif key in self.never:
                kid = kids[key]
                verdicts[kid] = self.never[key]
                refused.add(kid)
            if band is not None and key[2][0] == band:
                left[key] = 0
                self.zeroed.append(key)
        exhausted = self.exhausted
        if exhausted:
            new = tuple.__new__
            self.decisions.extend(
                _budget_wait(w) if w.tenant in exhausted
                else cast(Rejection, new(Refuse if kid in refused else Wait, (w.id, *verdicts[kid])))
                for w in passed for kid in (metas[w.id].kid,))
            return
        # In C, one map after another: a queue of thousands is passed over on every cycle.
        if wids is None:
            wids = list(map(_workload_id, passed))
        if refused:
            kind = {kid: Refuse if kid in refused else Wait for kid in verdicts}
            passed_kids = list(map(kid_of.__getitem__, wids))
            # (Wait or Refuse per key; typed as Wait: both are tuples of the same three fields)
            kinds: Iterable[type[Wait]] = cast(Iterable[type[Wait]], map(kind.__getitem__, passed_kids))
            found = map(verdicts.__getitem__, passed_kids)
        elif self.keep_waits:
            # a wait whose verdict is the one its workload got last is that record again
            waits = self.view.passed_waits
            intern = waits.intern
            verdicts = {kid: intern(v) for kid, v in verdicts.items()}
            self.decisions.extend(waits.records_by_key(wids, kid_of, verdicts, _wait_of))
            return
        else:
            kinds = repeat(Wait)
            found = map(verdicts.__getitem__, map(kid_of.__getitem__, wids))
        self.decisions.extend(map(tuple.__new__, kinds, map(add, zip(wids), found)))

    def _reject(self, w: Workload, reason: Reason, message: str, final: bool = False) -> None:
        self.decisions.append(Refuse(w.id, reason, message) if final else Wait(w.id, reason, message))

    def _never_fits(self, w: Workload, shape: Shape, cq: str) -> tuple[Reason, str] | None:
        """Why the workload can never run here (checked on the pool empty and whole: every node
        schedulable and every device healthy, since a cordoned or failed one comes back; cached per
        shape)."""
        view = self.view
        if view.quota.queues:
            quota_msg = view.quota.ever_fits(cq, view.metas[w.id].lower)
            if quota_msg is not None:
                return Reason.QUOTA_EXCEEDED, quota_msg
        cached = shape in view.never_fits_cache
        policy = (view.policy_for_empty() or self.policy) if len(w.pods) > 1 and not cached else None
        if not cached and (policy is None or policy.topology is None):
            # One pod fits an empty pool exactly when some node could hold it there (every policy
            # places a pod that fits somewhere). Without a fabric a gang is placed pod by pod, so it
            # fits when each of its pods fits on as many nodes of the empty pool as the gang has
            # pods: each finds a node none of the others took. Only the rest need a trial placement,
            # which costs a policy such as fgd milliseconds for each distinct shape (a tenant's
            # thousands of gangs of slightly different shapes made a pass take seconds).
            if self.empty_state is None:
                self.empty_state = clone_state(view.state, empty=True, whole=True)
            fits = self.empty_state.node_fits
            if all(int(np.count_nonzero(fits(pod))) >= len(w.pods) for pod in w.pods):
                view.never_fits_cache[shape] = None
        if shape not in view.never_fits_cache:
            if policy is None:  # (a pod that fits no node of the empty pool: the trial words why)
                policy = view.policy_for_empty() or self.policy
            if self.empty_state is None:  # one empty pool per cycle, given back after each trial
                self.empty_state = clone_state(view.state, empty=True, whole=True)
            empty = self.empty_state
            with view.topology.as_built() if view.topology is not None else nullcontext():
                result = place_gang(w, empty, policy, random.Random(0))
            if not isinstance(result, NoFit):
                release_gang(result, empty)
            view.never_fits_cache[shape] = (
                f"The workload can never fit this pool: {result.message}"
                if isinstance(result, NoFit)
                else None
            )
        message = view.never_fits_cache[shape]
        return (Reason.NEVER_FITS, message) if message is not None else None
