"""The admission-side view of a pool: free capacity, running workloads, quota usage and health.

A cycle reads and updates one `ClusterView`. `run_cycle` builds a fresh view from a snapshot; a
simulator may keep one view alive across cycles and tell it what finished (`remove`) and what
broke (`mark_unhealthy`), which saves rebuilding it on every event. Either way the same cycle code
runs on it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from gpupool.core.model import Allocation, ClusterSnapshot, Node, SliceDefaults, Workload, WorkloadInfo
from gpupool.core.overcommit import OvercommitConfig
from gpupool.core.priority import PriorityClasses, Rank
from gpupool.core.quota import (
    CPU_MILLI,
    DEVICE_MEMORY_MIB,
    DEVICE_MILLI,
    MEMORY_MIB,
    QuotaConfig,
    QuotaTracker,
    Usage,
    device_resource,
)
from gpupool.core.scheduling.congestion import CongestionSample
from gpupool.core.scheduling.gang import GangPlacement
from gpupool.core.scheduling.pending import PassedWaits, PendingBook
from gpupool.core.scheduling.policies.base import PlacementPolicy
from gpupool.core.scheduling.policy_cache import MAX_PREPARE_PODS, PolicyCache
from gpupool.core.scheduling.topology import UNKNOWN_RUN_S
from gpupool.core.scheduling.workloads import Meta, Shape, WorkloadCache, lower_bound_usage, shape_of
from gpupool.core.state import (
    UNBOUNDED_MIB,
    Allocs,
    ClusterState,
    PodAlloc,
    allocate_many,
    allocate_placements,
    allocs_of,
    clone_state,
    release_many,
)
from gpupool.errors import OverAllocation

if TYPE_CHECKING:
    from gpupool.core.scheduling.backfill import ExpectedEnds, KeptReservation, KeptSearch
    from gpupool.core.scheduling.topology import FabricView, TopologyContext
    from gpupool.core.topology_spec import TopologySpec

__all__ = [  # the names callers import from here; their homes are the modules above
    "MAX_PREPARE_PODS",
    "Allocs",
    "ClusterView",
    "Meta",
    "Running",
    "Shape",
    "clone_state",
    "lower_bound_usage",
    "release_many",
    "shape_of",
]

_workload = attrgetter("workload")

@dataclass(slots=True)
class Running:
    """A workload holding resources: what it holds, since when, and what it is charged."""

    workload: Workload
    allocs: Allocs
    start_time_s: float
    cluster_queue: str
    usage: Usage
    rank: Rank
    preemptible: bool = True
    progress_s: float = 0.0
    estimate_s: float | None = None
    device_count: float = 0.0

    def expected_end_s(self, now_s: float) -> float:
        """When it should finish by its estimate (inf when unknown; never before now)."""
        if self.estimate_s is None:
            return math.inf
        return max(now_s, self.planned_end_s)

    held_milli: int = -1
    planned_end_s: float = field(init=False, default=math.inf)
    """When it should finish by its estimate, however late that is (inf when unknown)."""

    def __post_init__(self) -> None:
        if self.estimate_s is not None:
            self.planned_end_s = self.start_time_s + max(0.0, self.estimate_s - self.progress_s)

    @property
    def device_milli(self) -> int:
        """Compute held on all its devices (milli), computed once."""
        if self.held_milli < 0:
            self.held_milli = sum(sum(a.device_milli) for _, a in self.allocs)
        return self.held_milli


@dataclass(slots=True)
class VictimGroup:
    """The preemptible running workloads of one (ClusterQueue, rank) and the compute they hold,
    kept as they come and go, so a cycle's victim search does not group the queue's work again."""

    runs: dict[str, Running] = field(default_factory=dict)
    milli: int = 0
    order: list[str] | None = None
    """Their ids, sorted; None until first read (sorted then, and kept so as work comes and goes)."""
    columns: tuple[list[float], list[float], list[float], list[float]] = field(
        default_factory=lambda: ([], [], [], []))
    """What their lost work is computed from, in `order`'s order (kept with it): start time, devices,
    checkpoint interval (0: none) and progress of each, so a cycle computes the group's lost work
    in one vectorised step (`preemption.lost_device_s_columns`) without reading thousands of runs."""

    rows: list[Running] = field(default_factory=list)
    """The runs in `order`'s order (kept with it), so a cycle copies the list instead of looking up
    thousands of ids (`by_id`)."""

    def by_id(self) -> list[Running]:
        """The runs in the order of their ids (a new list)."""
        if self.order is None:
            self.order = sorted(self.runs)
            runs = self.rows = list(map(self.runs.__getitem__, self.order))
            self.columns = ([r.start_time_s for r in runs], [r.device_count for r in runs],
                            [r.workload.checkpoint_interval_s or 0.0 for r in runs],
                            [r.progress_s for r in runs])
        return self.rows.copy()

    def add(self, run: Running) -> None:
        wid = run.workload.id
        self.runs[wid] = run
        self.milli += run.device_milli
        if self.order is not None:
            at = bisect.bisect_left(self.order, wid)
            self.order.insert(at, wid)
            self.rows.insert(at, run)
            starts, counts, intervals, progress = self.columns
            starts.insert(at, run.start_time_s)
            counts.insert(at, run.device_count)
            intervals.insert(at, run.workload.checkpoint_interval_s or 0.0)
            progress.insert(at, run.progress_s)

    def drop(self, run: Running) -> None:
        wid = run.workload.id
        del self.runs[wid]
        self.milli -= run.device_milli
        if self.order is not None:
            at = bisect.bisect_left(self.order, wid)
            del self.order[at]
            del self.rows[at]
            for column in self.columns:
                del column[at]


class ReleaseListener(Protocol):
    """Told of what may give capacity back (`ClusterView.listener`)."""

    def released(self, run: Running) -> None:
        """`run` gave back what it held for good (it ended, was preempted, evicted or moved)."""

    def changed(self) -> None:
        """A node's capacity may have grown (repaired), or the slice defaults changed."""


@dataclass(slots=True)
class ClusterView:
    """Mutable admission state of a pool (see the module docstring)."""

    state: ClusterState
    quota: QuotaTracker
    classes: PriorityClasses
    route: dict[tuple[str, str], str]
    running: dict[str, Running] = field(default_factory=dict)
    by_queue: dict[str, dict[str, Running]] = field(default_factory=dict)
    """`running`, by ClusterQueue (victim searches look at one queue and its cohort)."""
    victim_groups: dict[str, dict[Rank, VictimGroup]] = field(default_factory=dict)
    """The preemptible part of `running`, by ClusterQueue and rank (`preemption.VictimIndex`)."""
    info: dict[str, WorkloadInfo] = field(default_factory=dict)
    tenant_usage: dict[str, dict[str, float]] = field(default_factory=dict)
    to_evict: list[Running] = field(default_factory=list)
    never_fits_cache: dict[Shape, str | None] = field(default_factory=dict)
    model_grid: list[list[str]] | None = None
    lazy: dict[str, Allocation] = field(default_factory=dict)
    """Allocations whose capacity is taken but whose running records are not built yet (by id)."""
    workloads: WorkloadCache = field(init=False)
    """The per-workload caches (`Meta`, demand, ClusterQueue)."""
    policies: PolicyCache = field(default_factory=PolicyCache)
    """The placement policy kept across cycles, and the orderings' memo."""
    capacity_cache: dict[str, float] | None = None
    """`capacity()`; the capacity arrays change only in `mark_unhealthy` and `mark_healthy`."""
    running_version: int = 0
    """Bumped whenever the running set or the capacity changes (a workload registered, removed or
    forgotten, hardware broken or repaired): a key for what was computed from them."""
    ends: list[tuple[float, str]] = field(default_factory=list)
    """(planned end, id) of the running workloads with an estimate, sorted (kept as they come and go)."""
    end_milli: list[int] = field(default_factory=list)
    corrected_ends: dict[str, tuple[Running, float, float]] = field(default_factory=dict)
    """By id, overdue runs' (run, when computed, corrected end) (`backfill._corrected_kept`)."""
    """The compute each of them holds, aligned with `ends`."""
    expected_ends: ExpectedEnds | None = None
    """`ends` with the overdue runs' ends corrected, kept by the reservation (`backfill.ExpectedEnds`)."""
    end_log: list[tuple[int, Running]] | None = None
    """(1, run) registered or (-1, run) dropped, for every run with an estimate since `expected_ends`
    last read them (None: it is not kept)."""
    pending_book: PendingBook = field(default_factory=PendingBook)
    """The last cycle's pending workloads, counted by (queue, shape, rank) (`cycle._nominate`)."""
    passed_waits: PassedWaits = field(default_factory=PassedWaits)
    """The waits last reported for workloads a cycle passed over, reused while unchanged
    (`cycle._Cycle._reject_reached`)."""
    kept_reservation: KeptReservation | None = None
    """The last backfill reservation with what it was computed from (`backfill.kept_reserve`)."""
    reserved_head: tuple[str, float, float] | None = None
    """(head id, its first reserved start, its latest) of the reservation the last cycle that made
    one reported (`note_reserved`)."""
    reservation_slides: int = 0
    """How often a head's reserved start moved later from one cycle to the next."""
    reservation_slid_s: float = 0.0
    """How far in all (seconds) those starts moved later."""
    preempt_slides: int = 0
    """Of `reservation_slides`, those in cycles where work that may preempt took room the head counted
    on (`cycle._Cycle._reserve_again`); the others follow the corrections of overrunning estimates."""
    preempt_slid_s: float = 0.0
    kept_leaf_reservation: KeptReservation | None = None
    """The last reservation of a stuck gang inside one domain of its preferred tier, kept likewise
    (`locality.reserve_in_domain`)."""
    reserve_hints: dict[str, tuple[str, float]] = field(default_factory=dict)
    """(head id, reserved start) of the last reservation made afresh, by the slot that keeps it:
    where the next search for the same head looks first (`backfill.search_hints`)."""
    kept_searches: dict[str, KeptSearch] = field(default_factory=dict)
    """By the same slots, what the last reservation search left for the next (`backfill.KeptSearch`)."""
    topology: FabricView | None = None
    """The fabric the nodes sit in (`set_topology`); None: no fabric known, placement as before."""
    topology_default: TopologySpec | None = None
    """The pool's topology constraint for multi-pod gangs that name none (the cycle sets it)."""
    locality_waits: dict[str, float] = field(default_factory=dict)
    """Gangs waiting for a domain of their preferred tier: since when (the cycle's wait-or-spread)."""
    locality_caps: dict[str, float] = field(default_factory=dict)
    """... and the longest each waits in all (`locality.Locality.cap_s`)."""
    moves_tried: dict[str, float] = field(default_factory=dict)
    """Running gang -> when `moves.plan_moves` last looked at moving it."""
    congestion_sample: CongestionSample | None = None
    """The latest telemetry sample not yet judged: the next cycle judges it (`Policies.migrate`)."""
    congested_since: dict[str, float] = field(default_factory=dict)
    """Running gang -> the sample that first saw its bottleneck hot, without a break since."""
    comm_ratio: Callable[[Workload], float | None] | None = None
    """The scheduler's estimate of a job's communication ratio (`TopologyContext.comm_ratio`; the
    replay binds each job's estimate); None: the context's default."""
    listener: ReleaseListener | None = None
    """Told of every built run given back for good (`remove`, `forget`), every repair and every change
    of the slice defaults: the victim searches' verdicts kept from one cycle to the next
    (`preemption.KeptVerdicts`)."""

    def __post_init__(self) -> None:
        self.workloads = WorkloadCache(self.classes, self.quota.config, self.route)

    @property
    def metas(self) -> dict[str, Meta]:
        return self.workloads.metas

    @property
    def policy(self) -> PlacementPolicy | None:
        return self.policies.policy

    @property
    def ordering_memo(self) -> dict[str, Any]:
        return self.policies.ordering_memo

    # ---------------------------------------------------------------- construction

    @classmethod
    def empty(
        cls,
        nodes: Sequence[Node],
        quota: QuotaConfig | None = None,
        classes: PriorityClasses | None = None,
        defaults: SliceDefaults | None = None,
    ) -> ClusterView:
        quota = quota or QuotaConfig()
        return cls(
            state=ClusterState(nodes, defaults),
            quota=QuotaTracker(quota),
            classes=classes or PriorityClasses(),
            route=quota.route(),
        )

    @classmethod
    def from_snapshot(
        cls,
        snapshot: ClusterSnapshot,
        quota: QuotaConfig | None = None,
        classes: PriorityClasses | None = None,
        defaults: SliceDefaults | None = None,
    ) -> ClusterView:
        """A view holding every allocation of the snapshot; those on broken hardware await eviction."""
        view = cls.empty(snapshot.nodes, quota, classes, defaults)
        view.info = dict(snapshot.workload_info)
        state = view.state
        broken = {
            (int(n), int(d))
            for n, d in zip(*np.nonzero(state.dev_valid & (state.dev_milli_cap == 0)), strict=True)
        }
        down = {i for i, node in enumerate(state.nodes) if not node.healthy}
        if not broken and not down and not view.quota.config.enabled:
            # Fast path: take the capacity in bulk; running records are built only when a step
            # needs them (preemption, backfill, fair share), see `materialize`.
            allocate_placements(state, snapshot.allocations)
            view.lazy = {a.workload.id: a for a in snapshot.allocations}
            return view
        records: list[PodAlloc] = []
        for alloc in snapshot.allocations:
            allocs = allocs_of(state, alloc)
            cq = view.cluster_queue(alloc.workload) or ""
            run = view._running(alloc.workload, allocs, alloc.start_time_s, cq)
            if (broken or down) and any(
                a.node in down or any((a.node, d) in broken for d in a.devices) for _, a in allocs
            ):
                view.to_evict.append(run)
                continue
            records.extend(a for _, a in allocs)
            view._register(run)
        allocate_many(state, records)
        return view

    def materialize(self) -> None:
        """Build the running records of a snapshot taken in bulk (their capacity is already taken)."""
        if not self.lazy:
            return
        lazy, self.lazy = self.lazy, {}
        for alloc in lazy.values():
            allocs = allocs_of(self.state, alloc)
            self._register(self._running(alloc.workload, allocs, alloc.start_time_s, ""))

    def forget_workloads_except(self, keep: set[str]) -> None:
        """Trim the per-workload caches to `keep` (a long-running caller's live workloads); the
        placement policy's sample of pods is collected again from the running and `keep`'s
        pending work on the next cycle."""
        self.workloads.forget_except(keep)
        self.policies.forget()
        self.locality_waits = {k: v for k, v in self.locality_waits.items() if k in keep}
        self.locality_caps = {k: v for k, v in self.locality_caps.items() if k in keep}

    def add_allocation(self, alloc: Allocation) -> bool:
        """Take an allocation the view does not hold yet, as `from_snapshot` would (checked); one on
        broken hardware awaits eviction instead (False)."""
        allocs = allocs_of(self.state, alloc)
        cq = self.cluster_queue(alloc.workload) or ""
        run = self._running(alloc.workload, allocs, alloc.start_time_s, cq)
        if self.on_broken_hardware(allocs):
            self.to_evict.append(run)
            return False
        statement = self.state.statement()  # all of its pods or none
        try:
            for _, record in allocs:
                statement.allocate(record)
        except OverAllocation:
            statement.discard()
            raise
        statement.commit()
        self._register(run)
        return True

    def use_defaults(self, defaults: SliceDefaults) -> None:
        """Place with these slice defaults from now on (what runs keeps what it holds)."""
        if defaults == self.state.defaults:
            return
        self.state.set_defaults(defaults)  # the policies' caches see the change (state.defaults)
        self.never_fits_cache.clear()
        if self.listener is not None:
            self.listener.changed()

    # ---------------------------------------------------------------- placement policy

    def placement_policy(self, name: str, options: Mapping[str, Any]) -> PlacementPolicy:
        """The view's placement policy instance: made once, reused by every cycle on the view, bound
        to the view's fabric (`PlacementPolicy.bind_topology`)."""
        policy = self.policies.placement_policy(name, options)
        context = self.topology_context()
        if policy.topology != context:
            policy.bind_topology(context)
            if self.policies.empty_policy is not None:
                self.policies.empty_policy.bind_topology(context)
        return policy

    def topology_context(self) -> TopologyContext | None:
        if self.topology is None:
            return None
        from gpupool.core.scheduling.topology import TopologyContext

        if self.comm_ratio is None:
            return TopologyContext(self.topology, self.topology_default, self.remaining_estimate_s)
        return TopologyContext(self.topology, self.topology_default, self.remaining_estimate_s,
                               self.comm_ratio)

    def set_topology(self, topology: FabricView | None) -> None:
        """Place by this fabric from now on (None: none known); the gangs running now are put on its
        links. The caller updates its link state (`FabricView.set_link`, `apply_loads`) in place."""
        self.topology = topology
        if topology is None:
            return
        for alloc in self.lazy.values():
            allocs = allocs_of(self.state, alloc)
            est = self.remaining_estimate_s(alloc.workload)
            gpus = self.demand(alloc.workload)["device_milli"] / 1000
            topology.add_gang(alloc.workload.id, (a.node for _, a in allocs),
                              gpus * (UNKNOWN_RUN_S if est is None else est))
        for run in self.running.values():
            self._on_fabric(run)

    def _on_fabric(self, run: Running) -> None:
        if self.topology is not None and len(run.allocs) > 1:
            left = run.planned_end_s - run.start_time_s if run.estimate_s is not None else UNKNOWN_RUN_S
            self.topology.add_gang(run.workload.id, (a.node for _, a in run.allocs), run.device_count * left)

    def policy_for_empty(self) -> PlacementPolicy | None:
        """A twin of the placement policy for trials on an empty pool, prepared with the same pods."""
        return self.policies.for_empty(self.state)

    def tell_policy(self, pending: Sequence[Workload]) -> None:
        """Give the placement policy the pods of the running and pending work (`PolicyCache.tell`)."""
        running = chain(map(_workload, self.lazy.values()), (run.workload for run in self.running.values()))
        self.policies.tell(self.state, pending, running)

    # ---------------------------------------------------------------- lookups

    def cluster_queue(self, w: Workload) -> str | None:
        return self.workloads.cluster_queue(w)

    def meta(self, w: Workload, overcommit: OvercommitConfig | None) -> Meta:
        """The cached `Meta` of a workload (a view serves one set of policies)."""
        return self.workloads.meta(w, overcommit, self.state.models)

    def estimate_s(self, w: Workload) -> float | None:
        """Total runtime estimate: the user's, else the caller's history-based one."""
        if w.runtime_estimate_s is not None:
            return w.runtime_estimate_s
        info = self.info.get(w.id)
        return info.runtime_estimate_s if info else None

    def note_reserved(self, head_id: str, start_s: float, preempted: bool = False) -> float:
        """A cycle reserved `start_s` for the head: count a slide when the same head's start moved
        later than the last cycle said (`preempted`: in a cycle where work that may preempt took
        room it counted on); return how much later it is than its first reserved start."""
        last = self.reserved_head
        if last is None or last[0] != head_id:
            self.reserved_head = (head_id, start_s, start_s)
            return 0.0
        _, first, before = last
        if start_s > before:
            self.reservation_slides += 1
            self.reservation_slid_s += start_s - before
            if preempted:
                self.preempt_slides += 1
                self.preempt_slid_s += start_s - before
        self.reserved_head = (head_id, first, start_s)
        return max(0.0, start_s - first)

    def remaining_estimate_s(self, w: Workload) -> float | None:
        est = self.estimate_s(w)
        if est is None:
            return None
        info = self.info.get(w.id)
        return max(0.0, est - (info.progress_s if info else 0.0))

    def usage_of(self, allocs: Allocs) -> Usage:
        """What placed pods charge to quota: host resources and device slices per model."""
        if self.model_grid is None:
            self.model_grid = [
                [device_resource(self.state.models[m]) if m >= 0 else "" for m in row]
                for row in self.state.dev_model.tolist()
            ]
        grid = self.model_grid
        usage: Usage = {}
        for _, a in allocs:
            usage[CPU_MILLI] = usage.get(CPU_MILLI, 0) + a.cpu_milli
            usage[MEMORY_MIB] = usage.get(MEMORY_MIB, 0) + a.memory_mib
            for d, milli, mem in zip(a.devices, a.device_milli, a.device_memory_mib, strict=True):
                key = grid[a.node][d]
                usage[key] = usage.get(key, 0) + milli
                usage[DEVICE_MILLI] = usage.get(DEVICE_MILLI, 0) + milli
                if mem != UNBOUNDED_MIB:
                    usage[DEVICE_MEMORY_MIB] = usage.get(DEVICE_MEMORY_MIB, 0) + mem
        return usage

    def on_broken_hardware(self, allocs: Allocs) -> bool:
        state = self.state
        for _, a in allocs:
            if not state.schedulable[a.node] and not state.nodes[a.node].healthy:
                return True
            if any(state.dev_milli_cap[a.node, d] == 0 for d in a.devices):
                return True
        return False

    # ---------------------------------------------------------------- changes

    def admit(self, w: Workload, gang: GangPlacement, cluster_queue: str, now_s: float) -> Running:
        """Record a placed gang (its resources are already taken in `state`)."""
        run = self._running(w, gang.allocs, now_s, cluster_queue)
        self._register(run)
        return run

    def remove(self, workload_id: str) -> Running:
        """A running workload ends (finished, cancelled, preempted): give back all it holds.

        One whose record is not built yet (see `lazy`) is given back without building the others'.
        """
        self.running_version += 1
        if self.topology is not None:
            self.topology.remove_gang(workload_id)
        alloc = self.lazy.pop(workload_id, None)
        if alloc is not None:
            run = self._running(alloc.workload, allocs_of(self.state, alloc), alloc.start_time_s, "")
            for _, record in reversed(run.allocs):
                self.state.release(record)
            return run  # (not told to `listener`: taken after the last `materialize`, no search saw it)
        run = self.running.pop(workload_id)
        del self.by_queue[run.cluster_queue][workload_id]
        self._drop_end(run)
        self._drop_victim(run)
        for _, record in reversed(run.allocs):
            self.state.release(record)
        self.quota.remove(run.cluster_queue, run.usage)
        self._tenant_add(run.workload, -1.0)
        if self.listener is not None:
            self.listener.released(run)
        return run

    def forget(self, run: Running) -> None:
        """Drop a detached (already released) workload from the books: it was preempted."""
        self.running_version += 1
        if self.topology is not None:
            self.topology.remove_gang(run.workload.id)
        del self.running[run.workload.id]
        del self.by_queue[run.cluster_queue][run.workload.id]
        self._drop_end(run)
        self._drop_victim(run)
        self._tenant_add(run.workload, -1.0)
        if self.listener is not None:
            self.listener.released(run)

    def detach(self, run: Running) -> None:
        """Tentatively free a running workload (victim search); `attach` undoes it exactly."""
        for _, record in reversed(run.allocs):
            self.state.release(record)
        self.quota.remove(run.cluster_queue, run.usage)

    def attach(self, run: Running) -> None:
        for _, record in run.allocs:
            self.state.allocate(record)
        self.quota.add(run.cluster_queue, run.usage)

    def mark_unhealthy(self, node: str, device_index: int | None = None) -> list[Running]:
        """A node (or one device) broke: its workloads are queued for eviction by the next cycle."""
        self.materialize()
        i = self.state.node_index[node]
        hit = [
            run
            for run in self.running.values()
            if any(a.node == i and (device_index is None or device_index in a.devices) for _, a in run.allocs)
        ]
        for run in hit:
            self.remove(run.workload.id)
            self.to_evict.append(run)
        state = self.state
        slots = range(state.dev_valid.shape[1]) if device_index is None else [device_index]
        if device_index is None:
            state.schedulable[i] = False
        for d in slots:
            state.dev_milli_cap[i, d] = state.dev_milli_free[i, d] = 0
            state.dev_mem_cap[i, d] = state.dev_mem_free[i, d] = 0
        state.node_version[i] += 1
        self.running_version += 1
        self.never_fits_cache.clear()
        self.capacity_cache = None
        return hit

    def mark_healthy(self, node: str) -> None:
        """A repaired node (all of its devices) takes work again."""
        i = self.state.node_index[node]
        fresh = ClusterState([self.state.nodes[i]])
        state = self.state
        state.schedulable[i] = True
        width = fresh.dev_valid.shape[1]
        used_milli = state.dev_milli_cap[i, :width] - state.dev_milli_free[i, :width]
        used_mem = state.dev_mem_cap[i, :width] - state.dev_mem_free[i, :width]
        state.dev_milli_cap[i, :width] = np.maximum(fresh.dev_milli_cap[0], state.dev_milli_cap[i, :width])
        state.dev_mem_cap[i, :width] = np.maximum(fresh.dev_mem_cap[0], state.dev_mem_cap[i, :width])
        state.dev_milli_free[i, :width] = state.dev_milli_cap[i, :width] - used_milli
        state.dev_mem_free[i, :width] = state.dev_mem_cap[i, :width] - used_mem
        state.node_version[i] += 1
        self.running_version += 1
        self.never_fits_cache.clear()
        self.capacity_cache = None
        if self.listener is not None:
            self.listener.changed()

    # ---------------------------------------------------------------- internals

    def _running(self, w: Workload, allocs: Allocs, start_s: float, cq: str) -> Running:
        info = self.info.get(w.id)
        return Running(
            workload=w,
            allocs=allocs,
            start_time_s=start_s,
            cluster_queue=cq,
            usage=self.usage_of(allocs),
            rank=self.classes.rank(w),
            preemptible=self.classes.preemptible(w),
            progress_s=info.progress_s if info else 0.0,
            estimate_s=self.estimate_s(w),
            device_count=self.demand(w)["device_milli"] / 1000,
        )

    def _register(self, run: Running) -> None:
        self.running_version += 1
        self.running[run.workload.id] = run
        if self.topology is not None:
            self._on_fabric(run)
        queue = self.by_queue.get(run.cluster_queue)
        if queue is None:
            queue = self.by_queue[run.cluster_queue] = {}
        queue[run.workload.id] = run
        if run.preemptible:
            ranks = self.victim_groups.get(run.cluster_queue)
            if ranks is None:
                ranks = self.victim_groups[run.cluster_queue] = {}
            group = ranks.get(run.rank)
            if group is None:
                group = ranks[run.rank] = VictimGroup()
            group.add(run)
        if run.planned_end_s != math.inf:
            at = bisect.bisect_right(self.ends, (run.planned_end_s, run.workload.id))
            self.ends.insert(at, (run.planned_end_s, run.workload.id))
            self.end_milli.insert(at, run.device_milli)
            if self.end_log is not None:
                self._log_end(1, run)
        self.quota.add(run.cluster_queue, run.usage)
        self._tenant_add(run.workload, 1.0)

    def _drop_victim(self, run: Running) -> None:
        if run.preemptible:
            ranks = self.victim_groups[run.cluster_queue]
            group = ranks[run.rank]
            group.drop(run)
            if not group.runs:
                del ranks[run.rank]

    def _drop_end(self, run: Running) -> None:
        if run.planned_end_s != math.inf:
            at = bisect.bisect_left(self.ends, (run.planned_end_s, run.workload.id))
            del self.ends[at]
            del self.end_milli[at]
            if self.end_log is not None:
                self._log_end(-1, run)

    def _log_end(self, sign: int, run: Running) -> None:
        log = self.end_log
        assert log is not None
        log.append((sign, run))
        if len(log) > len(self.ends) + 1024:  # more came and went than run: built afresh when read
            self.end_log = self.expected_ends = None

    def demand(self, w: Workload) -> dict[str, float]:
        """`demand_of(w)`, computed once per workload (the overcommit-placed copy shares its id)."""
        return self.workloads.demand(w)

    def _tenant_add(self, w: Workload, sign: float) -> None:
        mine = self.tenant_usage.setdefault(w.tenant, {})
        for r, a in self.demand(w).items():
            mine[r] = mine.get(r, 0.0) + sign * a

    def capacity(self) -> Mapping[str, float]:
        """The pool's total of each share resource (kept until a node or device changes health)."""
        if self.capacity_cache is None:
            self.capacity_cache = self._capacity()
        return self.capacity_cache

    def _capacity(self) -> dict[str, float]:
        state = self.state
        return {
            DEVICE_MILLI: float(state.dev_milli_cap.sum()),
            CPU_MILLI: float(state.cpu_cap.sum()),
            MEMORY_MIB: float(state.mem_cap.sum()),
        }
