"""What a cycle knows of each pending workload, computed once per workload: its `Meta` and demand.

A view keeps one `WorkloadCache` across cycles (Kueue's workload info): the ClusterQueue a
workload's queue feeds, its shape (workloads of one shape fit or fail alike), its rank, the least it
charges to quota, and what DRF charges its tenant. An id submitted again with other contents is
computed afresh (entries remember the workload object they were made from).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.core.model import Labels, Workload
from gpupool.core.overcommit import OvercommitConfig, guaranteed_workload
from gpupool.core.priority import PriorityClasses, Rank
from gpupool.core.quota import (
    CPU_MILLI,
    DEVICE_MEMORY_MIB,
    DEVICE_MILLI,
    MEMORY_MIB,
    QuotaConfig,
    Usage,
    cluster_queue_of,
    device_resource,
)
from gpupool.core.scheduling.ordering.base import demand_of

PodShape = tuple[int, int, int, int, int, frozenset[str], int, Labels]
Shape = tuple[PodShape | tuple[str], ...]
"""The pods' shapes, then the gang's own topology constraint (its text) when it names one."""


def shape_of(w: Workload) -> Shape:
    """Two workloads of one shape fit (or fail) exactly alike on the same state."""
    pods: Shape = tuple(
        (p.cpu_milli, p.memory_mib, p.num_devices, p.device_milli, p.device_memory_mib, p.allowed_models,
         p.memory_share_milli, p.node_labels)
        for p in w.pods
    )
    return pods if w.topology is None else (*pods, (str(w.topology),))


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
    kid: int = -1
    """A number for `key`, the same for equal keys on one view (a key hashes slowly: a cycle that
    looks up thousands of waiting workloads' verdicts uses this)."""


@dataclass(slots=True)
class WorkloadCache:
    """The per-workload caches of one view (a view serves one quota and one set of classes)."""

    classes: PriorityClasses
    quota: QuotaConfig
    route: dict[tuple[str, str], str]
    metas: dict[str, Meta] = field(default_factory=dict)
    kids: dict[str, int] = field(default_factory=dict)
    """`metas[id].kid` by workload id, kept with `metas`: a cycle looks up the verdicts of
    thousands of passed-over workloads by it without reading their `Meta` objects."""
    demands: dict[str, tuple[Workload, dict[str, float]]] = field(default_factory=dict)
    cq_cache: dict[tuple[str, str], str | None] = field(default_factory=dict)
    lower_cache: dict[Shape, Usage] = field(default_factory=dict)
    rank_cache: dict[tuple[str, int], tuple[Rank, bool]] = field(default_factory=dict)
    key_ids: dict[tuple[str, Shape, Rank], int] = field(default_factory=dict)
    """`Meta.kid` of each key seen (kept for the view's life: as many as queues x shapes x ranks)."""

    def cluster_queue(self, w: Workload) -> str | None:
        key = (w.tenant, w.queue)
        if key not in self.cq_cache:
            self.cq_cache[key] = cluster_queue_of(self.quota, self.route, w)
        return self.cq_cache[key]

    def meta(self, w: Workload, overcommit: OvercommitConfig | None, models: list[str]) -> Meta:
        """The cached `Meta` of a workload (`models`: the pool's device models, for overcommit)."""
        found = self.metas.get(w.id)
        if found is None or found.source is not w:
            placed = w if overcommit is None else guaranteed_workload(w, overcommit, models)
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
            key = (cq or "", shape, ranked[0])
            kid = self.key_ids.get(key)
            if kid is None:
                kid = self.key_ids[key] = len(self.key_ids)
            found = self.metas[w.id] = Meta(
                cluster_queue=cq,
                placed=placed,
                shape=shape,
                lower=lower,
                rank=ranked[0],
                class_known=ranked[1],
                key=key,
                source=w,
                kid=kid,
            )
            self.kids[w.id] = kid
        return found

    def demand(self, w: Workload) -> dict[str, float]:
        """`demand_of(w)`, computed once per workload (the overcommit-placed copy shares its id)."""
        found = self.demands.get(w.id)
        if found is None or found[0] is not w:
            found = self.demands[w.id] = (w, demand_of(w))
        return found[1]

    def forget_except(self, keep: set[str]) -> None:
        """Trim the caches to the workloads in `keep`."""
        self.metas = {k: v for k, v in self.metas.items() if k in keep}
        self.kids = {k: v for k, v in self.kids.items() if k in keep}
        self.demands = {k: v for k, v in self.demands.items() if k in keep}


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
