"""The admission-side view of a pool: free capacity, running workloads, quota usage and health.

A cycle reads and updates one `ClusterView`. `run_cycle` builds a fresh view from a snapshot; a
simulator may keep one view alive across cycles and tell it what finished (`remove`) and what
broke (`mark_unhealthy`), which saves rebuilding it on every event. Either way the same cycle code
runs on it.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from gpupool.core.model import (
    Allocation,
    ClusterSnapshot,
    Node,
    PodPlacement,
    PodRequest,
    SliceDefaults,
    Workload,
    WorkloadInfo,
)
from gpupool.core.overcommit import OvercommitConfig, guaranteed_workload
from gpupool.core.priority import PriorityClasses, Rank
from gpupool.core.quota import (
    CPU_MILLI,
    DEVICE_MEMORY_MIB,
    DEVICE_MILLI,
    MEMORY_MIB,
    QuotaConfig,
    QuotaTracker,
    Usage,
    cluster_queue_of,
    device_resource,
)
from gpupool.core.scheduling.gang import GangPlacement
from gpupool.core.scheduling.ordering.base import demand_of
from gpupool.core.scheduling.policies.base import PlacementPolicy, make_policy
from gpupool.core.state import UNBOUNDED_MIB, ClusterState, PodAlloc
from gpupool.core.units import MILLI
from gpupool.errors import OverAllocation

MAX_PREPARE_PODS = 512
"""At most this many pods (an even sample of those seen) go to the placement policy's `prepare`."""

Shape = tuple[tuple[int, int, int, int, int, frozenset[str], int], ...]
Allocs = tuple[tuple[PodRequest, PodAlloc], ...]


def shape_of(w: Workload) -> Shape:
    """Two workloads of one shape fit (or fail) exactly alike on the same state."""
    return tuple(
        (p.cpu_milli, p.memory_mib, p.num_devices, p.device_milli, p.device_memory_mib, p.allowed_models,
         p.memory_share_milli)
        for p in w.pods
    )


@dataclass(frozen=True, slots=True)
class Meta:
    """What a cycle needs about a pending workload, computed once per workload id."""

    cluster_queue: str | None
    placed: Workload
    shape: Shape
    lower: Usage
    rank: Rank
    class_known: bool
    key: tuple[str, Shape, Rank] = ("", (), (0, 0))
    """(queue, shape, rank): workloads with the same key fare alike within a cycle."""
    source: Workload | None = None
    """The workload it was computed from (an id submitted again with other contents is new)."""


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
class ClusterView:
    """Mutable admission state of a pool (see the module docstring)."""

    state: ClusterState
    quota: QuotaTracker
    classes: PriorityClasses
    route: dict[tuple[str, str], str]
    running: dict[str, Running] = field(default_factory=dict)
    by_queue: dict[str, dict[str, Running]] = field(default_factory=dict)
    """`running`, by ClusterQueue (victim searches look at one queue and its cohort)."""
    info: dict[str, WorkloadInfo] = field(default_factory=dict)
    tenant_usage: dict[str, dict[str, float]] = field(default_factory=dict)
    to_evict: list[Running] = field(default_factory=list)
    never_fits_cache: dict[Shape, str | None] = field(default_factory=dict)
    metas: dict[str, Meta] = field(default_factory=dict)
    model_grid: list[list[str]] | None = None
    lazy: dict[str, Allocation] = field(default_factory=dict)
    """Allocations whose capacity is taken but whose running records are not built yet (by id)."""
    cq_cache: dict[tuple[str, str], str | None] = field(default_factory=dict)
    lower_cache: dict[Shape, Usage] = field(default_factory=dict)
    rank_cache: dict[tuple[str, int], tuple[Rank, bool]] = field(default_factory=dict)
    demands: dict[str, tuple[Workload, dict[str, float]]] = field(default_factory=dict)
    policy: PlacementPolicy | None = None
    """The placement policy the cycles on this view use, kept across cycles (see `placement_policy`)."""
    empty_policy: PlacementPolicy | None = None
    """A twin of `policy` for trials on an empty pool, so they do not reset `policy`'s caches."""
    policy_key: tuple[str, str] = ("", "")
    policy_sample: list[PodRequest] = field(default_factory=list)
    empty_prepared: bool = False
    policy_pods: list[PodRequest] = field(default_factory=list)
    policy_seen: set[str] = field(default_factory=set)
    policy_prepared: int = -1
    ordering_memo: dict[str, Any] = field(default_factory=dict)
    """The ordering policies' caches kept across cycles (`OrderingContext.memo`)."""
    capacity_cache: dict[str, float] | None = None
    """`capacity()`; the capacity arrays change only in `mark_unhealthy` and `mark_healthy`."""

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
            _allocate_placements(state, snapshot.allocations)
            view.lazy = {a.workload.id: a for a in snapshot.allocations}
            return view
        records: list[PodAlloc] = []
        for alloc in snapshot.allocations:
            allocs = _allocs(state, alloc)
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
            allocs = _allocs(self.state, alloc)
            self._register(self._running(alloc.workload, allocs, alloc.start_time_s, ""))

    def forget_workloads_except(self, keep: set[str]) -> None:
        """Trim the per-workload caches to `keep` (a long-running caller's live workloads); the
        placement policy's sample of pods is collected again from the running and `keep`'s
        pending work on the next cycle."""
        self.metas = {k: v for k, v in self.metas.items() if k in keep}
        self.demands = {k: v for k, v in self.demands.items() if k in keep}
        self.policy_pods = []
        self.policy_seen = set()
        self.policy_prepared = -1

    def add_allocation(self, alloc: Allocation) -> bool:
        """Take an allocation the view does not hold yet, as `from_snapshot` would (checked); one on
        broken hardware awaits eviction instead (False)."""
        allocs = _allocs(self.state, alloc)
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

    # ---------------------------------------------------------------- placement policy

    def placement_policy(self, name: str, options: Mapping[str, Any]) -> PlacementPolicy:
        """The view's placement policy instance: made once, reused by every cycle on the view."""
        key = (name, repr(sorted(options.items())))
        if self.policy is None or self.policy_key != key:
            self.policy = make_policy(name, **dict(options))
            self.empty_policy = make_policy(name, **dict(options))
            self.policy_key = key
            self.policy_pods = []
            self.policy_seen = set()
            self.policy_prepared = -1
        return self.policy

    def policy_for_empty(self) -> PlacementPolicy | None:
        """`empty_policy`, prepared (on first use) with the same pods as `policy`."""
        if self.empty_policy is not None and not self.empty_prepared:
            self.empty_policy.prepare(self.state, self.policy_sample)
            self.empty_prepared = True
        return self.empty_policy

    def tell_policy(self, pending: Sequence[Workload]) -> None:
        """Give the policy the pods of the running and pending workloads it has not seen yet.

        The policy's `prepare` runs on the first cycle and again whenever the pods seen have grown
        by a quarter since, on an even sample of at most `MAX_PREPARE_PODS` of them (so estimating
        the workload's shape mix costs O(1) per arrival and a bounded time per cycle).
        """
        policy = self.policy
        if policy is None:
            return
        seen = self.policy_seen
        pods = self.policy_pods
        if self.policy_prepared < 0:  # what already runs (a requeued one may count twice)
            pods.extend(chain.from_iterable(map(_pods, map(_workload, self.lazy.values()))))
            pods.extend(chain.from_iterable(run.workload.pods for run in self.running.values()))
        for w in pending:
            if w.id not in seen:
                seen.add(w.id)
                pods.extend(w.pods)
        if len(pods) != self.policy_prepared and (
            self.policy_prepared < 0 or len(pods) * 4 >= self.policy_prepared * 5
        ):
            stride = -(-len(pods) // MAX_PREPARE_PODS)  # an even sample keeps the shape mix
            self.policy_sample = pods[::stride] if stride > 1 else list(pods)
            policy.prepare(self.state, self.policy_sample)
            self.empty_prepared = False
            self.policy_prepared = len(pods)

    # ---------------------------------------------------------------- lookups

    def cluster_queue(self, w: Workload) -> str | None:
        key = (w.tenant, w.queue)
        if key not in self.cq_cache:
            self.cq_cache[key] = cluster_queue_of(self.quota.config, self.route, w)
        return self.cq_cache[key]

    def meta(self, w: Workload, overcommit: OvercommitConfig | None) -> Meta:
        """The cached `Meta` of a workload (a view serves one set of policies)."""
        found = self.metas.get(w.id)
        if found is None or found.source is not w:
            placed = w if overcommit is None else guaranteed_workload(w, overcommit, self.state.models)
            shape = shape_of(placed)
            lower = self.lower_cache.get(shape)  # a function of the shape alone (read-only)
            if lower is None:
                lower = self.lower_cache[shape] = lower_bound_usage(placed)
            klass = (w.priority_class, w.priority)
            ranked = self.rank_cache.get(klass)
            if ranked is None:
                known = self.classes.get(w.priority_class) is not None
                ranked = self.rank_cache[klass] = (self.classes.rank(w), known)
            cq = self.cluster_queue(w)
            found = self.metas[w.id] = Meta(
                cluster_queue=cq,
                placed=placed,
                shape=shape,
                lower=lower,
                rank=ranked[0],
                class_known=ranked[1],
                key=(cq or "", shape, ranked[0]),
                source=w,
            )
        return found

    def estimate_s(self, w: Workload) -> float | None:
        """Total runtime estimate: the user's, else the caller's history-based one."""
        if w.runtime_estimate_s is not None:
            return w.runtime_estimate_s
        info = self.info.get(w.id)
        return info.runtime_estimate_s if info else None

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
        alloc = self.lazy.pop(workload_id, None)
        if alloc is not None:
            run = self._running(alloc.workload, _allocs(self.state, alloc), alloc.start_time_s, "")
            for _, record in reversed(run.allocs):
                self.state.release(record)
            return run
        run = self.running.pop(workload_id)
        del self.by_queue[run.cluster_queue][workload_id]
        for _, record in reversed(run.allocs):
            self.state.release(record)
        self.quota.remove(run.cluster_queue, run.usage)
        self._tenant_add(run.workload, -1.0)
        return run

    def forget(self, run: Running) -> None:
        """Drop a detached (already released) workload from the books: it was preempted."""
        del self.running[run.workload.id]
        del self.by_queue[run.cluster_queue][run.workload.id]
        self._tenant_add(run.workload, -1.0)

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
        self.never_fits_cache.clear()
        self.capacity_cache = None

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
        self.running[run.workload.id] = run
        queue = self.by_queue.get(run.cluster_queue)
        if queue is None:
            queue = self.by_queue[run.cluster_queue] = {}
        queue[run.workload.id] = run
        self.quota.add(run.cluster_queue, run.usage)
        self._tenant_add(run.workload, 1.0)

    def demand(self, w: Workload) -> dict[str, float]:
        """`demand_of(w)`, computed once per workload (the overcommit-placed copy shares its id)."""
        found = self.demands.get(w.id)
        if found is None or found[0] is not w:
            found = self.demands[w.id] = (w, demand_of(w))
        return found[1]

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


def _allocs(state: ClusterState, alloc: Allocation) -> Allocs:
    """The records of an allocation's placements, each with its pod."""
    pods = {p.name: p for p in alloc.workload.pods}
    return tuple((pods[pl.pod], _record(state, pods[pl.pod], pl)) for pl in alloc.placements)


def _record(state: ClusterState, pod: PodRequest, placement: PodPlacement) -> PodAlloc:
    return state.record_of(pod, placement)


def clone_state(state: ClusterState, *, empty: bool = False) -> ClusterState:
    """An independent copy of a state's capacity arrays (empty: nothing allocated)."""
    new = copy.copy(state)
    new.cpu_cap = state.cpu_cap.copy()
    new.mem_cap = state.mem_cap.copy()
    new.dev_milli_cap = state.dev_milli_cap.copy()
    new.dev_mem_cap = state.dev_mem_cap.copy()
    new.schedulable = state.schedulable.copy()
    src = new if empty else state
    new.cpu_free = (src.cpu_cap if empty else src.cpu_free).copy()
    new.mem_free = (src.mem_cap if empty else src.mem_free).copy()
    new.dev_milli_free = (src.dev_milli_cap if empty else src.dev_milli_free).copy()
    new.dev_mem_free = (src.dev_mem_cap if empty else src.dev_mem_free).copy()
    new.node_version = state.node_version.copy()
    new.node_pod_kinds = (
        [{} for _ in state.node_pod_kinds] if empty else [dict(k) for k in state.node_pod_kinds]
    )
    return new


def _allocate_placements(state: ClusterState, allocations: Sequence[Allocation]) -> None:
    """Take the capacity of recorded placements in bulk, then check nothing is over-allocated."""
    placements, pods = _pods_placed(allocations)
    if not placements:
        state.check_invariants()
        return
    nodes = list(map(state.node_index.__getitem__, map(_node_name, placements)))
    slices = list(map(_slices, placements))
    counts = list(map(len, slices))
    # What the placements recorded (the effective amounts), else the pods' requests.
    cpu = np.fromiter(map(_cpu, placements), np.int64, len(pods))
    mem = np.fromiter(map(_mem, placements), np.int64, len(pods))
    np.add.at(state.cpu_free, nodes, -np.maximum(cpu, np.fromiter(map(_cpu, pods), np.int64, len(pods))))
    np.add.at(state.mem_free, nodes, -np.maximum(mem, np.fromiter(map(_mem, pods), np.int64, len(pods))))
    flat = list(chain.from_iterable(slices))
    if flat:
        where = (np.repeat(np.asarray(nodes, dtype=np.int64), counts), list(map(_slot, flat)))
        np.add.at(state.dev_milli_free, where, -np.fromiter(map(_milli, flat), np.int64, len(flat)))
        np.add.at(state.dev_mem_free, where, -np.fromiter(map(_slice_mem, flat), np.int64, len(flat)))
    np.add.at(state.node_version, nodes, 1)
    kinds = [
        "cpu" if not k else "share" if k == 1 and sl[0].compute_milli < MILLI else f"{k}-dev"
        for sl, k in zip(slices, counts, strict=True)
    ]
    node_kinds = state.node_pod_kinds
    for (n, kind), count in Counter(zip(nodes, kinds, strict=True)).items():
        held = node_kinds[n]
        held[kind] = held.get(kind, 0) + count
    state.check_invariants()


def _pods_placed(allocations: Sequence[Allocation]) -> tuple[list[PodPlacement], list[PodRequest]]:
    """Every placement of the allocations with its pod (bulk path for one-pod workloads)."""
    groups = list(map(_placements, allocations))
    gangs = list(map(_pods, map(_workload, allocations)))
    if set(map(len, groups)) <= {1} and set(map(len, gangs)) <= {1}:
        placements = [g[0] for g in groups]
        pods = [g[0] for g in gangs]
        if list(map(_pod_name, placements)) == list(map(_name, pods)):
            return placements, pods
    placements = []
    pods = []
    for apl, wpods in zip(groups, gangs, strict=True):
        by_name = {p.name: p for p in wpods}
        placements.extend(apl)
        pods.extend([by_name[pl.pod] for pl in apl])
    return placements, pods


_placements = attrgetter("placements")
_workload = attrgetter("workload")
_pods = attrgetter("pods")
_pod_name = attrgetter("pod")
_name = attrgetter("name")
_node_name = attrgetter("node")
_slices = attrgetter("slices")
_cpu = attrgetter("cpu_milli")
_mem = attrgetter("memory_mib")
_slot = attrgetter("device_index")
_milli = attrgetter("compute_milli")
_slice_mem = attrgetter("memory_mib")


def allocate_many(state: ClusterState, records: Sequence[PodAlloc]) -> None:
    """Apply many records at once (vectorised), then check that nothing is over-allocated."""
    if not records:
        return
    _add_many(state, records, -1)
    state.check_invariants()
    np.add.at(state.node_version, [r.node for r in records], 1)
    for r in records:
        kinds = state.node_pod_kinds[r.node]
        kind = state.pod_kind(r)
        kinds[kind] = kinds.get(kind, 0) + 1


SMALL_BATCH = 16
"""Up to this many records are applied one by one: `np.add.at` costs more than the loop on few."""


def _add_many(state: ClusterState, records: Sequence[PodAlloc], sign: int) -> None:
    if len(records) <= SMALL_BATCH:
        cpu_free, mem_free = state.cpu_free, state.mem_free
        milli_free, dev_mem_free = state.dev_milli_free, state.dev_mem_free
        for r in records:
            n = r.node
            cpu_free[n] += sign * r.cpu_milli
            mem_free[n] += sign * r.memory_mib
            for d, milli, mem in zip(r.devices, r.device_milli, r.device_memory_mib, strict=True):
                milli_free[n, d] += sign * milli
                dev_mem_free[n, d] += sign * mem
        return
    nodes = [r.node for r in records]
    np.add.at(state.cpu_free, nodes, [sign * r.cpu_milli for r in records])
    np.add.at(state.mem_free, nodes, [sign * r.memory_mib for r in records])
    dev_nodes = [r.node for r in records for _ in r.devices]
    if dev_nodes:
        slots = [d for r in records for d in r.devices]
        np.add.at(
            state.dev_milli_free, (dev_nodes, slots), [sign * m for r in records for m in r.device_milli]
        )
        np.add.at(
            state.dev_mem_free, (dev_nodes, slots), [sign * m for r in records for m in r.device_memory_mib]
        )


def release_many(state: ClusterState, records: Sequence[PodAlloc]) -> None:
    """Give back many records at once (vectorised; unchecked: only for states built from them)."""
    if not records:
        return
    _add_many(state, records, 1)
    if len(records) <= SMALL_BATCH:
        for r in records:
            state.node_version[r.node] += 1
    else:
        np.add.at(state.node_version, [r.node for r in records], 1)
    for r in records:
        kinds = state.node_pod_kinds[r.node]
        kind = state.pod_kind(r)
        count = kinds.get(kind, 0) - 1
        if count > 0:
            kinds[kind] = count
        else:
            kinds.pop(kind, None)


def lower_bound_usage(w: Workload) -> Usage:
    """What a workload charges at least, wherever it lands (checked before trying to place it)."""
    cpu = mem = milli = dev_mem = 0
    per_model: Usage = {}
    for p in w.pods:
        cpu += p.cpu_milli
        mem += p.memory_mib
        n = p.num_devices
        pod_milli = n * p.device_milli
        milli += pod_milli
        dev_mem += p.device_memory_mib * n
        if n and len(p.allowed_models) == 1:
            key = device_resource(next(iter(p.allowed_models)))
            per_model[key] = per_model.get(key, 0) + pod_milli
    usage: Usage = {CPU_MILLI: cpu, MEMORY_MIB: mem, DEVICE_MILLI: milli, DEVICE_MEMORY_MIB: dev_mem}
    usage.update(per_model)
    return usage
