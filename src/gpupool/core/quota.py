"""Quotas with Kueue's semantics: Tenant -> LocalQueue -> ClusterQueue -> Cohort.

A ClusterQueue holds, per resource, a nominal quota, an optional borrowing limit (how far above
nominal it may go by borrowing from its cohort) and an optional lending limit (how much of its
unused nominal quota the cohort may borrow). Resources are `cpu_milli`, `memory_mib`,
`device_memory_mib`, `device_milli` (devices of any model, 1000 per device) and
`device_milli/<MODEL>` (devices of one model). A resource a ClusterQueue names no quota for is not
limited for it. Admission never takes a ClusterQueue past `nominal + borrowing_limit`, and the
cohort never lends more than its members' lendable quota:

    guaranteed(q, r) = nominal(q, r) - lending_limit(q, r)        (lending_limit None: all of it)
    borrowed(q, r)   = max(0, usage(q, r) - guaranteed(q, r))
    sum over q in cohort of borrowed(q, r) <= sum over q of lendable(q, r)

which is the check Kueue applies. With no ClusterQueues configured nothing is limited and every
workload falls in one implicit queue named "".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpupool.core.model import Workload
from gpupool.core.units import MILLI
from gpupool.errors import InvalidInput

CPU_MILLI = "cpu_milli"
MEMORY_MIB = "memory_mib"
DEVICE_MEMORY_MIB = "device_memory_mib"
DEVICE_MILLI = "device_milli"

Usage = dict[str, int]


def device_resource(model: str) -> str:
    """The quota resource for devices of one model (in milli-devices)."""
    return f"{DEVICE_MILLI}/{model}"


def devices_milli(count: float) -> int:
    """Whole devices -> milli-devices (quotas are configured in devices, tracked in milli)."""
    return round(count * MILLI)


@dataclass(frozen=True, slots=True)
class ResourceQuota:
    """Nominal quota of one resource with optional borrowing and lending limits (None: no limit)."""

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    def __post_init__(self) -> None:
        if self.nominal < 0 or (self.borrowing_limit or 0) < 0 or (self.lending_limit or 0) < 0:
            raise InvalidInput("A quota's nominal, borrowing and lending limits must be >= 0.")
        if self.lending_limit is not None and self.lending_limit > self.nominal:
            raise InvalidInput(
                f"A lending limit ({self.lending_limit}) cannot exceed the nominal quota ({self.nominal})."
            )

    @property
    def lendable(self) -> int:
        return self.nominal if self.lending_limit is None else self.lending_limit

    @property
    def guaranteed(self) -> int:
        return self.nominal - self.lendable


@dataclass(frozen=True, slots=True)
class ClusterQueue:
    """A quota holder; ClusterQueues naming the same cohort lend to and borrow from each other."""

    name: str
    quotas: Mapping[str, ResourceQuota] = field(default_factory=dict)
    cohort: str = ""


@dataclass(frozen=True, slots=True)
class LocalQueue:
    """A tenant's named queue; it feeds one ClusterQueue."""

    tenant: str
    name: str
    cluster_queue: str


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    """All ClusterQueues and LocalQueues, plus fair-share weights per tenant (default 1)."""

    cluster_queues: tuple[ClusterQueue, ...] = ()
    local_queues: tuple[LocalQueue, ...] = ()
    default_cluster_queue: str = ""
    tenant_weights: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = {cq.name for cq in self.cluster_queues}
        if len(names) != len(self.cluster_queues):
            raise InvalidInput("ClusterQueue names must be unique.")
        for lq in self.local_queues:
            if lq.cluster_queue not in names:
                raise InvalidInput(
                    f"LocalQueue {lq.tenant}/{lq.name} feeds unknown ClusterQueue {lq.cluster_queue!r}."
                )
        if self.default_cluster_queue and self.default_cluster_queue not in names:
            raise InvalidInput(f"Unknown default ClusterQueue {self.default_cluster_queue!r}.")

    @property
    def enabled(self) -> bool:
        return bool(self.cluster_queues)

    def route(self) -> dict[tuple[str, str], str]:
        return {(lq.tenant, lq.name): lq.cluster_queue for lq in self.local_queues}

    def weight(self, tenant: str) -> float:
        return self.tenant_weights.get(tenant, 1.0)

    @classmethod
    def per_tenant(
        cls,
        nominal: Mapping[str, Mapping[str, int]],
        *,
        cohort: str = "pool",
        borrowing_limit: int | None = None,
        lending_limit: int | None = None,
    ) -> QuotaConfig:
        """One ClusterQueue per tenant (named after it) in one cohort; every queue of a tenant feeds it."""
        queues = tuple(
            ClusterQueue(
                name=tenant,
                cohort=cohort,
                quotas={
                    r: ResourceQuota(amount, borrowing_limit, lending_limit)
                    for r, amount in sorted(res.items())
                },
            )
            for tenant, res in sorted(nominal.items())
        )
        return cls(cluster_queues=queues, local_queues=(), default_cluster_queue="")


def cluster_queue_of(config: QuotaConfig, route: Mapping[tuple[str, str], str], w: Workload) -> str | None:
    """The ClusterQueue a workload's LocalQueue feeds; None when it has none (unknown queue)."""
    if not config.enabled:
        return ""
    found = route.get((w.tenant, w.queue))
    if found is not None:
        return found
    if any(cq.name == w.tenant for cq in config.cluster_queues):
        return w.tenant  # per-tenant configurations: a tenant's queues all feed its ClusterQueue
    return config.default_cluster_queue or None


class QuotaTracker:
    """Usage of every ClusterQueue and the borrowed totals of every cohort, updated incrementally."""

    def __init__(self, config: QuotaConfig) -> None:
        self.config = config
        self.queues: dict[str, ClusterQueue] = {cq.name: cq for cq in config.cluster_queues}
        self.usage: dict[str, Usage] = {name: {} for name in self.queues}
        self.borrowed: dict[str, Usage] = {}
        self.lendable: dict[str, Usage] = {}
        for cq in config.cluster_queues:
            if cq.cohort:
                pool = self.lendable.setdefault(cq.cohort, {})
                self.borrowed.setdefault(cq.cohort, {})
                for r, q in cq.quotas.items():
                    pool[r] = pool.get(r, 0) + q.lendable

    def cohort_members(self, cq: str) -> list[str]:
        cohort = self.queues[cq].cohort if cq in self.queues else ""
        if not cohort:
            return [cq]
        return [name for name, q in self.queues.items() if q.cohort == cohort]

    def fits(self, cq: str, demand: Mapping[str, int]) -> str | None:
        """None when `demand` fits the ClusterQueue's quota now, else a sentence saying why not."""
        queue = self.queues.get(cq)
        if queue is None:
            return None
        used = self.usage[cq]
        for r, amount in demand.items():
            q = queue.quotas.get(r)
            if q is None or amount <= 0:
                continue
            old = used.get(r, 0)
            new = old + amount
            if q.borrowing_limit is not None and new > q.nominal + q.borrowing_limit:
                return (
                    f"ClusterQueue {cq!r} would use {new} {r}, above its nominal {q.nominal} "
                    f"plus borrowing limit {q.borrowing_limit}."
                )
            if not queue.cohort:
                if new > q.nominal:
                    return f"ClusterQueue {cq!r} would use {new} {r}, above its nominal quota {q.nominal}."
                continue
            g = q.guaranteed
            extra = max(0, new - g) - max(0, old - g)
            total = self.borrowed[queue.cohort].get(r, 0) + extra
            # extra == 0: within its guaranteed quota, which is never lent, so it fits even when the
            # cohort is overdrawn (a lowered quota leaves running work above what may be lent)
            if extra > 0 and total > self.lendable[queue.cohort].get(r, 0):
                return (
                    f"Cohort {queue.cohort!r} has no {r} left to lend to ClusterQueue {cq!r} "
                    f"(it would need {total}, it holds {self.lendable[queue.cohort].get(r, 0)})."
                )
        return None

    def ever_fits(self, cq: str, demand: Mapping[str, int]) -> str | None:
        """None when `demand` could fit on an idle pool, else why it never can."""
        queue = self.queues.get(cq)
        if queue is None:
            return None
        for r, amount in demand.items():
            q = queue.quotas.get(r)
            if q is None:
                continue
            ceiling = (
                q.guaranteed + self.lendable.get(queue.cohort, {}).get(r, 0) if queue.cohort else q.nominal
            )
            if q.borrowing_limit is not None:
                ceiling = min(ceiling, q.nominal + q.borrowing_limit)
            if amount > ceiling:
                return (
                    f"The workload asks for {amount} {r}, more than ClusterQueue {cq!r} "
                    f"can ever hold ({ceiling})."
                )
        return None

    def within_nominal(self, cq: str, demand: Mapping[str, int]) -> bool:
        """Whether usage plus `demand` stays within nominal quota (a queue reclaiming what it lent)."""
        queue = self.queues.get(cq)
        if queue is None:
            return False
        used = self.usage[cq]
        return all(
            used.get(r, 0) + a <= q.nominal
            for r, a in demand.items()
            if (q := queue.quotas.get(r)) is not None
        )

    def is_borrowing(self, cq: str) -> bool:
        queue = self.queues.get(cq)
        if queue is None:
            return False
        used = self.usage[cq]
        return any(used.get(r, 0) > q.nominal for r, q in queue.quotas.items())

    def add(self, cq: str, demand: Mapping[str, int]) -> None:
        self._change(cq, demand, 1)

    def remove(self, cq: str, demand: Mapping[str, int]) -> None:
        self._change(cq, demand, -1)

    def _change(self, cq: str, demand: Mapping[str, int], sign: int) -> None:
        queue = self.queues.get(cq)
        if queue is None:
            return
        used = self.usage[cq]
        for r, amount in demand.items():
            old = used.get(r, 0)
            new = old + sign * amount
            used[r] = new
            q = queue.quotas.get(r)
            if queue.cohort and q is not None:
                g = q.guaranteed
                pool = self.borrowed[queue.cohort]
                pool[r] = pool.get(r, 0) + max(0, new - g) - max(0, old - g)

    def check_invariants(self) -> None:
        """Raise InvalidInput if any limit is exceeded (used by tests and the simulator's checks)."""
        for name, queue in self.queues.items():
            for r, q in queue.quotas.items():
                used = self.usage[name].get(r, 0)
                if q.borrowing_limit is not None and used > q.nominal + q.borrowing_limit:
                    raise InvalidInput(f"ClusterQueue {name!r} exceeds its borrowing limit on {r}.")
                if not queue.cohort and used > q.nominal:
                    raise InvalidInput(f"ClusterQueue {name!r} exceeds its nominal quota on {r}.")
        for cohort, pool in self.borrowed.items():
            for r, amount in pool.items():
                if amount > self.lendable[cohort].get(r, 0):
                    raise InvalidInput(f"Cohort {cohort!r} lends more {r} than its members allow.")


def add_usage(total: Usage, more: Mapping[str, int]) -> None:
    for r, a in more.items():
        total[r] = total.get(r, 0) + a


def sum_usage(items: Iterable[Mapping[str, int]]) -> Usage:
    total: Usage = {}
    for item in items:
        add_usage(total, item)
    return total
