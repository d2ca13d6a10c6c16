"""The queues' quotas as the core sees them, what each queue holds now, and the file's queues.

Each stored queue is one ClusterQueue named `tenant/queue`, fed by that tenant's LocalQueue of
the same name. A queue with a quota (milli-devices) caps `device_milli` at that nominal, with its
borrowing and lending limits; one without is not limited (it lends nothing). Queues naming the
same cohort lend each other their unused quota (core/quota.py holds the rules).

A tenant's fair-share weight (DRF ordering weighs tenants, not queues) is the largest weight its
queues set other than the default 1, else 1: one queue of weight 2 gives its tenant 2, and a
tenant whose queues are all at 0.5 gets 0.5, whatever its default queue says.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from gpupool.config import QueueConfig
from gpupool.core.quota import (
    DEVICE_MILLI,
    ClusterQueue,
    LocalQueue,
    QuotaConfig,
    QuotaTracker,
    ResourceQuota,
    devices_milli,
)
from gpupool.core.units import MILLI
from gpupool.errors import InvalidInput
from gpupool.server.auth import Principal
from gpupool.server.orm import PodRow, QueueRow, TenantRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import audit
from gpupool.server.states import ACTIVE_POD_STATES

DEFAULT_WEIGHT = 1.0
DEFAULT_QUEUE = "default"
CONFIG_ACTOR = Principal(token_id="", tenant=None, remote="configuration")
"""Who the audit log names for changes the configuration file makes at start-up."""


def queue_name(tenant: str, queue: str) -> str:
    return f"{tenant}/{queue}"


@dataclass(frozen=True, slots=True)
class QueueQuota:
    """One queue's quota settings, in milli-devices (None: no quota / no limit)."""

    tenant: str
    name: str
    quota_milli: int | None = None
    cohort: str = ""
    borrowing_limit_milli: int | None = None
    lending_limit_milli: int | None = None
    weight: float = DEFAULT_WEIGHT

    @property
    def key(self) -> str:
        return queue_name(self.tenant, self.name)

    def check(self) -> None:
        """InvalidInput (one sentence) unless the core can take these settings."""
        if self.quota_milli is None and (self.borrowing_limit_milli is not None
                                         or self.lending_limit_milli is not None):
            raise InvalidInput(
                f"Queue {self.key} has no quota, so a borrowing or lending limit means nothing; give it "
                "a quota (--quota G) or clear the limits (none).", queue=self.key)
        if (self.quota_milli is not None and self.lending_limit_milli is not None
                and self.lending_limit_milli > self.quota_milli):
            raise InvalidInput(
                f"Queue {self.key}'s lending limit ({self.lending_limit_milli / MILLI:g}) cannot exceed "
                f"its quota ({self.quota_milli / MILLI:g}); lower the lending limit or raise the quota.",
                queue=self.key)
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise InvalidInput(f"Queue {self.key}'s weight must be a number above 0 (got {self.weight:g}).",
                               queue=self.key)


def row_quota(row: QueueRow) -> QueueQuota:
    return QueueQuota(tenant=row.tenant, name=row.name, quota_milli=row.quota_device_milli,
                      cohort=row.cohort or "", borrowing_limit_milli=row.borrowing_limit_milli,
                      lending_limit_milli=row.lending_limit_milli, weight=row.weight)


def set_row(row: QueueRow, quota: QueueQuota) -> None:
    row.quota_device_milli = quota.quota_milli
    row.cohort = quota.cohort
    row.borrowing_limit_milli = quota.borrowing_limit_milli
    row.lending_limit_milli = quota.lending_limit_milli
    row.weight = quota.weight


def describe(quota: QueueQuota) -> str:
    """The settings as the audit log records them (devices)."""
    def devices(milli: int | None) -> str:
        return "none" if milli is None else f"{milli / MILLI:g}"

    return (f"quota={devices(quota.quota_milli)} cohort={quota.cohort or 'none'} "
            f"borrowing_limit={devices(quota.borrowing_limit_milli)} "
            f"lending_limit={devices(quota.lending_limit_milli)} weight={quota.weight:g}")


# ------------------------------------------------------------------ the core's QuotaConfig

_QUEUE_COLUMNS = (QueueRow.tenant, QueueRow.name, QueueRow.quota_device_milli, QueueRow.cohort,
                  QueueRow.borrowing_limit_milli, QueueRow.lending_limit_milli, QueueRow.weight)


_READ_QUEUES = select(*_QUEUE_COLUMNS)  # built once: every cycle reads it


def read_queues(conn: Connection) -> list[QueueQuota]:
    rows = conn.execute(_READ_QUEUES)
    return [QueueQuota(tenant, name, quota, cohort or "", borrowing, lending, float(weight))
            for tenant, name, quota, cohort, borrowing, lending, weight in rows]


def read_quota(conn: Connection) -> QuotaConfig:
    """The quota configuration of every stored queue (one read)."""
    return quota_config(read_queues(conn))


def quota_config(queues: Iterable[QueueQuota]) -> QuotaConfig:
    """Each queue is its own ClusterQueue (in its cohort); a queue with a quota caps its devices."""
    ordered = sorted(queues, key=lambda q: (q.tenant, q.name))
    cluster_queues = []
    for q in ordered:
        quotas = {} if q.quota_milli is None else {DEVICE_MILLI: ResourceQuota(
            nominal=q.quota_milli, borrowing_limit=q.borrowing_limit_milli,
            lending_limit=q.lending_limit_milli)}
        cluster_queues.append(ClusterQueue(name=q.key, quotas=quotas, cohort=q.cohort))
    local_queues = tuple(LocalQueue(tenant=q.tenant, name=q.name, cluster_queue=q.key) for q in ordered)
    return QuotaConfig(cluster_queues=tuple(cluster_queues), local_queues=local_queues,
                       tenant_weights=tenant_weights(ordered))


def tenant_weights(queues: Iterable[QueueQuota]) -> dict[str, float]:
    """Per tenant, the largest weight its queues set other than the default (see the module docstring);
    tenants whose queues all keep the default are left out (the core gives them 1)."""
    weights: dict[str, float] = {}
    for q in queues:
        if q.weight != DEFAULT_WEIGHT:
            weights[q.tenant] = max(weights.get(q.tenant, 0.0), q.weight)
    return weights


# ------------------------------------------------------------------ what each queue holds now


@dataclass(frozen=True, slots=True)
class QueueUse:
    """What a queue's running work holds (milli-devices): in all, beyond its quota, and what others
    hold of its unused lendable quota."""

    used_milli: int = 0
    borrowed_milli: int = 0
    lent_milli: int = 0


def read_use(conn: Connection, config: QuotaConfig) -> dict[str, QueueUse]:
    """Per ClusterQueue (`tenant/queue`), from the pods that hold slices in the scheduler's view."""
    held: dict[tuple[str, str], int] = {}
    rows = conn.execute(
        select(WorkloadRow.tenant, WorkloadRow.queue, PodRow.slices)
        .join(WorkloadRow, WorkloadRow.id == PodRow.workload_id)
        .where(PodRow.status.in_(ACTIVE_POD_STATES)))
    for tenant, queue, slices in rows:
        key = (tenant, queue)
        held[key] = held.get(key, 0) + sum(int(s["compute_milli"]) for s in slices or ())
    return queue_use(config, held)


def queue_use(config: QuotaConfig, held: Mapping[tuple[str, str], int]) -> dict[str, QueueUse]:
    """`held` milli-devices per (tenant, queue), charged as admission charges them (QuotaTracker).

    borrowed = use beyond the nominal quota. The core does not say which member lent what, so a
    cohort's borrowed total is split over its members in proportion to their unused lendable quota
    (min(lending limit, nominal - used)); the sum lent equals the sum borrowed whenever the cohort
    is within its limits."""
    tracker = QuotaTracker(config)
    route = config.route()
    for key, milli in sorted(held.items()):
        target = route.get(key)
        if target is not None and milli:
            tracker.add(target, {DEVICE_MILLI: milli})
    used = {name: tracker.usage[name].get(DEVICE_MILLI, 0) for name in tracker.queues}
    borrowed: dict[str, int] = {}
    spare: dict[str, int] = {}
    for name, cq in tracker.queues.items():
        q = cq.quotas.get(DEVICE_MILLI)
        borrowed[name] = 0 if q is None else max(0, used[name] - q.nominal)
        spare[name] = 0 if q is None or not cq.cohort else min(q.lendable, max(0, q.nominal - used[name]))
    lent: dict[str, int] = {}
    cohorts = sorted({cq.cohort for cq in tracker.queues.values() if cq.cohort})
    for cohort in cohorts:
        members = sorted(n for n, cq in tracker.queues.items() if cq.cohort == cohort)
        lent.update(_split(sum(borrowed[m] for m in members), {m: spare[m] for m in members}))
    return {name: QueueUse(used[name], borrowed[name], lent.get(name, 0)) for name in tracker.queues}


def _split(total: int, room: Mapping[str, int]) -> dict[str, int]:
    """`total` (at most the sum of `room`) over the names in proportion to their room, in integers
    (largest remainders first, then by name), never above a name's room."""
    capacity = sum(room.values())
    total = min(total, capacity)
    if total <= 0:
        return {}
    shares = {n: total * r // capacity for n, r in room.items()}
    left = total - sum(shares.values())
    by_remainder = sorted(room, key=lambda n: (-(total * room[n] % capacity), n))
    for n in by_remainder[:left]:
        shares[n] += 1
    return shares


# ------------------------------------------------------------------ the configuration file's queues


def from_config(q: QueueConfig) -> QueueQuota:
    """A configuration queue as stored settings (its names were checked with the file: PoolConfig)."""
    quota = QueueQuota(
        tenant=q.tenant, name=q.name,
        quota_milli=None if q.quota is None else devices_milli(q.quota), cohort=q.cohort,
        borrowing_limit_milli=None if q.borrowing_limit is None else devices_milli(q.borrowing_limit),
        lending_limit_milli=None if q.lending_limit is None else devices_milli(q.lending_limit),
        weight=q.weight)
    try:
        quota.check()
    except InvalidInput as exc:
        raise InvalidInput(f"In the configuration: {exc.message}", **exc.details) from None
    return quota


def apply_config_queues(rt: Runtime) -> list[str]:
    """Make the store hold the configuration's queues (`PoolConfig.queues`), at server start.

    The file is the truth for the queues it names: a missing tenant is created (with its `default`
    queue, as `gpupool tenant create` makes it), a missing queue is created, and an existing one
    takes the file's quota, cohort, limits and weight. Queues the file does not name are left as
    they are (`gpupool queue set` manages those). Each change is audited as made by the
    configuration. Returns the `tenant/queue` names created or changed; raises InvalidInput before
    writing anything when the file names a queue the store cannot hold.
    """
    wanted = [from_config(q) for q in rt.config.queues]
    if not wanted:
        return []
    now = rt.clock()
    changed: list[str] = []
    with rt.store.write() as session:
        for quota in wanted:
            if _apply_one(session, quota, now):
                changed.append(quota.key)
    if changed:
        rt.capacity_may_have_changed()
    return changed


def _apply_one(session: Session, quota: QueueQuota, now: float) -> bool:
    if session.get(TenantRow, quota.tenant) is None:
        session.add(TenantRow(name=quota.tenant, created_s=now))
        session.flush()
        audit.record(session, CONFIG_ACTOR, "tenant.create", quota.tenant, now, "from the configuration")
        if quota.name != DEFAULT_QUEUE:
            session.add(QueueRow(tenant=quota.tenant, name=DEFAULT_QUEUE, created_s=now))
    row = session.get(QueueRow, (quota.tenant, quota.name))
    if row is None:
        row = QueueRow(tenant=quota.tenant, name=quota.name, created_s=now)
        set_row(row, quota)
        session.add(row)
        audit.record(session, CONFIG_ACTOR, "queue.create", quota.key, now, describe(quota))
        return True
    if row_quota(row) == quota:
        return False
    set_row(row, quota)
    audit.record(session, CONFIG_ACTOR, "queue.update", quota.key, now, describe(quota))
    return True
