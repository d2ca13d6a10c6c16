"""Usage and chargeback from the pod rows: each pod attempt's held slices from `started_s` to
`finished_s` (or now while it runs), aggregated and priced by `core.metering`.

The pods table is the meter: an interval is durable as soon as the pod's start is committed, and
recovery closes the intervals of pods that ended while the server was down, so a crash loses none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Select, insert, or_, select

from gpupool.api.usage import UsageOut, UsageRowOut
from gpupool.core.metering import HeldSlice, PodInterval, UsageKey, UsageRow, aggregate, totals
from gpupool.core.model import Device, Node, Slice
from gpupool.errors import InvalidInput
from gpupool.server.auth import Principal
from gpupool.server.orm import PodRow, RetiredPodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.specs import default_priority_class

UNKNOWN_MODEL = "unknown"
"""The model of a slice on a device the pool no longer lists (its node left)."""
MAX_WINDOW_S = 400 * 86_400.0


def device_map(nodes: Iterable[Node]) -> dict[tuple[str, int], Device]:
    """(node, device index) -> the device, as pods' slices name them."""
    return {(n.name, slot): d for n in nodes for slot, d in enumerate(n.devices)}


Devices = dict[tuple[str, int], Device]


def held(node: str, slices: Sequence[dict[str, int]], devices: Devices,
         models: Sequence[dict[str, Any]] | None = None) -> tuple[HeldSlice, ...]:
    """A pod row's slices with their device's model, memory and simulated mark: as recorded at
    launch (`models`), else as the pool lists the device now (UNKNOWN_MODEL when it is gone)."""
    if models is not None and len(models) == len(slices):
        return tuple(HeldSlice(str(m["model"]), s["compute_milli"], s["memory_mib"],
                               int(m["device_memory_mib"]), bool(m["simulated"]))
                     for s, m in zip(slices, models, strict=True))
    out = []
    for s in slices:
        device = devices.get((node, s["device_index"]))
        if device is None:
            out.append(HeldSlice(UNKNOWN_MODEL, s["compute_milli"], s["memory_mib"]))
        else:
            out.append(HeldSlice(device.model, s["compute_milli"], s["memory_mib"],
                                 max(device.memory_mib, 0), device.simulated))
    return tuple(out)


def slice_models(node: Node | None, slices: Iterable[Slice]) -> list[dict[str, Any]] | None:
    """What a pod row records at launch of each slice's device (None when the node is not listed)."""
    if node is None:
        return None
    devices = node.devices
    out: list[dict[str, Any]] = []
    for s in slices:
        if not 0 <= s.device_index < len(devices):
            return None
        d = devices[s.device_index]
        out.append({"model": d.model, "device_memory_mib": max(d.memory_mib, 0), "simulated": d.simulated})
    return out


def interval_rows() -> Select[Any]:
    """The columns a pod interval is read from, of every pod that started (add the window's WHERE)."""
    return (select(PodRow.id, PodRow.node, PodRow.slices, PodRow.models, PodRow.started_s, PodRow.finished_s,
                   PodRow.rolled_up, WorkloadRow.tenant, WorkloadRow.queue, WorkloadRow.spec)
            .join(WorkloadRow, WorkloadRow.id == PodRow.workload_id)
            .where(PodRow.started_s.is_not(None)))


def retired_rows() -> Select[Any]:
    """The same columns of the pods of deleted tenants (RetiredPodRow; add the same WHERE on its
    columns): their priority class and service as stored, where a pod's are read from its spec."""
    r = RetiredPodRow
    return select(r.id, r.node, r.slices, r.models, r.started_s, r.finished_s, r.rolled_up, r.tenant, r.queue,
                  r.priority_class, r.service)


def retire(session: Any, tenant: str, now: float) -> int:
    """Keep the metered intervals of `tenant`'s pods that started (all ended: the tenant is being
    deleted) as RetiredPodRow rows, in the caller's transaction, before its pod rows are deleted;
    returns how many."""
    rows = session.execute(interval_rows().where(WorkloadRow.tenant == tenant)).all()
    kept = [dict(id=row.id, tenant=row.tenant, queue=row.queue,
                 priority_class=str(row.spec.get("priority_class") or ""), service=_service(row.spec),
                 node=row.node, slices=row.slices, models=row.models, started_s=row.started_s,
                 finished_s=row.finished_s if row.finished_s is not None else now, rolled_up=row.rolled_up,
                 retired_s=now) for row in rows]
    for start in range(0, len(kept), 1000):
        session.execute(insert(RetiredPodRow), kept[start:start + 1000])
    return len(kept)


def _service(spec: dict[str, Any]) -> str:
    return str(spec.get("name") or "") if spec.get("serve_port") else ""


def to_intervals(rt: Runtime, rows: Iterable[Any], *, now: float, default_class: str) -> list[PodInterval]:
    """interval_rows() or retired_rows() results as intervals (a running pod's ends at `now`)."""
    devices = device_map(rt.nodes())
    return [_interval(r, devices, now, default_class) for r in rows]


def overlapping(since_s: float, until_s: float, tenant: str | None) -> tuple[Select[Any], Select[Any]]:
    """interval_rows() and retired_rows() of the pods that overlap [since_s, until_s) (of `tenant`
    when given): the live pods' and the deleted tenants' kept ones."""
    pods = interval_rows().where(PodRow.started_s < until_s,
                                 or_(PodRow.finished_s.is_(None), PodRow.finished_s > since_s))
    retired = retired_rows().where(RetiredPodRow.started_s < until_s, RetiredPodRow.finished_s > since_s)
    if tenant is not None:
        pods = pods.where(WorkloadRow.tenant == tenant)
        retired = retired.where(RetiredPodRow.tenant == tenant)
    return pods, retired


def intervals(rt: Runtime, since_s: float, until_s: float, tenant: str | None) -> list[PodInterval]:
    """Every pod interval that overlaps [since_s, until_s) (of `tenant`'s workloads when given)."""
    default_class = default_priority_class(rt.config.priority_classes) or ""
    query, retired = overlapping(since_s, until_s, tenant)
    with rt.store.read() as session:
        rows = [*session.execute(query).all(), *session.execute(retired).all()]
    return to_intervals(rt, rows, now=rt.clock(), default_class=default_class)


def _interval(row: Any, devices: Devices, now: float, default_class: str) -> PodInterval:
    end = row.finished_s if row.finished_s is not None else max(now, row.started_s)
    spec = getattr(row, "spec", None)  # None: a retired pod's row, its class and service as kept
    chosen, service = ((row.priority_class, row.service) if spec is None
                       else (spec.get("priority_class"), _service(spec)))
    return PodInterval(row.id, row.tenant, row.queue, str(chosen or default_class),
                       row.node, row.started_s, max(end, row.started_s),
                       held(row.node, row.slices, devices, row.models), service=service)


def parse_by(text: str) -> list[UsageKey]:
    """'tenant,model' -> the keys; InvalidInput naming the allowed ones for anything else."""
    keys: list[UsageKey] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            key = UsageKey(part)
        except ValueError:
            allowed = ", ".join(k.value for k in UsageKey)
            raise InvalidInput(f"Cannot group usage by {part!r}; use a comma-separated list of {allowed}.",
                               field="by") from None
        if key not in keys:
            keys.append(key)
    return keys


def window(rt: Runtime, since_s: float | None, until_s: float | None) -> tuple[float, float]:
    """The usage window [since, until) (default: the last 30 days to now), checked."""
    until = rt.clock() if until_s is None else until_s
    since = until - 30 * 86_400.0 if since_s is None else since_s
    if not since < until:
        raise InvalidInput("The usage window is empty: --since must be before --until.", field="since_s")
    if until - since > MAX_WINDOW_S:
        raise InvalidInput("The usage window is longer than 400 days; ask for a shorter one.",
                           field="since_s")
    return since, until


def raw_usage(rt: Runtime, who: Principal, *, tenant: str | None, since_s: float | None,
              until_s: float | None, by: str) -> UsageOut:
    """Usage computed from every pod row in the window (the reference the rollup is tested and
    measured against; `services.usage.usage` answers the API)."""
    scope = who.tenant_for(tenant) if not who.is_admin else tenant
    since, until = window(rt, since_s, until_s)
    keys = parse_by(by)
    book = rt.config.prices.price_book()
    rows = aggregate(intervals(rt, since, until, scope), book, keys, since, until)
    return UsageOut(since_s=since, until_s=until, by=[k.value for k in keys], currency=book.currency,
                    rows=[row_out(r) for r in rows], total=row_out(totals(rows)))


def row_out(row: UsageRow, pods: int | None = None) -> UsageRowOut:
    """The API row of a usage row (`pods`: its distinct pods, when not its `pods` set's size)."""
    return UsageRowOut(**row.keys, simulated=row.simulated, pods=len(row.pods) if pods is None else pods,
                       device_hours=_round(row.device_hours), memory_gib_hours=_round(row.memory_gib_hours),
                       cost=_round(row.cost), dedicated_cost=_round(row.dedicated_cost),
                       saving=_round(row.dedicated_cost - row.cost), priced=row.priced)


def _round(value: float) -> float:
    return 0.0 if not math.isfinite(value) else round(value, 6)
