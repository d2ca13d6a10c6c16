"""The pool's history, kept in the store for the dashboard's charts (table `history`).

Once a minute the sampler (loops/history.py) records what the pool holds: devices allocated and
the capacity (milli-GPUs), the demand of pending work, each tenant's allocation, and each device's
allocation with its measured utilisation and memory where the provider measures them (NVML; a
simulated device never is, and says so). Each hour is rolled up into hourly rows when it ends;
minute rows are deleted after a day, and every row older than the retention (30 days by default).

Every write is idempotent: rows are keyed by (series, step, bucket start, key) and inserted with
"insert or ignore". A minute is claimed by its capacity row in the transaction that writes the rest,
so two servers sampling the same minute, or a restart within it, record it once and never mix two
samples; a roll-up another server already made is left as it is.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import delete, func, select

from gpupool.api.history import DeviceHistory, HistoryOut, HistorySeries
from gpupool.core.metering import DAY_S
from gpupool.core.model import WorkloadStatus
from gpupool.core.units import MILLI
from gpupool.errors import Forbidden, InvalidInput
from gpupool.server.auth import Principal
from gpupool.server.db import insert_ignoring
from gpupool.server.orm import HistoryRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.tenants import made_s

MINUTE_S = 60
HOUR_S = 3600
MINUTES_KEPT_S = DAY_S
"""Minute rows are kept this long (their hours are rolled up as each ends)."""
DEFAULT_KEEP_DAYS = 30.0
Metric = Literal["tenants", "allocation", "pending", "devices"]
Range = Literal["1h", "24h", "7d"]
RANGES: dict[str, tuple[float, int, int]] = {"1h": (HOUR_S, MINUTE_S, MINUTE_S),
                                             "24h": (DAY_S, 5 * MINUTE_S, MINUTE_S),
                                             "7d": (7 * DAY_S, HOUR_S, HOUR_S)}
"""A chart's range -> (its span, the width of one drawn point, the rows it reads: minutes, which
are kept a day, or hours). Each device's means read hours beyond one hour (DEVICE_STEPS)."""
MEAN_OF_MEASURED = frozenset({"svc_latency_p50_ms", "svc_latency_p99_ms", "svc_latency_mean_ms"})
"""Series whose hour is the mean of the minutes that have a row (a service's latency: an idle minute
measured none, it was not 0 ms); every other series counts a missing minute as 0."""
DEVICE_STEPS = {"1h": MINUTE_S, "24h": HOUR_S, "7d": HOUR_S}
_TABLE = HistoryRow.__table__


@dataclass(frozen=True, slots=True)
class Point:
    series: str
    key: str
    value: float
    busy_pct: float | None = None
    memory_mib: float | None = None


def minute_of(now: float) -> float:
    return float(int(now // MINUTE_S) * MINUTE_S)


def sample(rt: Runtime, extra: list[Point] | None = None) -> list[Point]:
    """What the pool holds now, as points to record (the capacity row first: it claims the minute);
    `extra`: more of this minute's points (each service's, serving/history.py)."""
    nodes = rt.nodes()
    with rt.store.read() as session:
        conn = session.connection()
        held = rt.held.read(conn)
        pending = conn.execute(select(func.coalesce(func.sum(WorkloadRow.device_milli), 0)).where(
            WorkloadRow.status == WorkloadStatus.PENDING.value, WorkloadRow.held == "")).scalar_one()
    readings = rt.provider.device_readings()
    by_device = held.milli_by_device
    points = [Point("capacity", "", float(sum(len(n.devices) for n in nodes) * MILLI)),
              Point("allocated", "", float(sum(by_device.values()))),
              Point("pending", "", float(pending))]
    points += [Point("tenant", tenant, float(milli))
               for tenant, milli in sorted(held.milli_by_tenant.items())]
    for node in nodes:
        for device in node.devices:
            reading = readings.get((node.name, device.index))
            points.append(Point("device", f"{node.name}/{device.index}",
                                float(by_device.get((node.name, device.index), 0)),
                                None if reading is None else reading.busy_pct,
                                None if reading is None else reading.memory_used_mib))
    return points + (extra or [])


def record(rt: Runtime, minute_s: float, points: list[Point]) -> int:
    """Write `points` as the minute starting at `minute_s`, unless that minute is recorded already
    (by this server before a restart, or by another): then nothing. Returns the rows written."""
    rows = [{"series": p.series, "step_s": MINUTE_S, "at_s": minute_s, "key": p.key, "value": p.value,
             "busy_pct": p.busy_pct, "memory_mib": p.memory_mib} for p in points]
    if not rows:
        return 0
    with rt.store.write() as session:
        conn = session.connection()
        claimed = conn.execute(insert_ignoring(conn, _TABLE).returning(_TABLE.c.at_s), rows[0]).first()
        if claimed is None:  # the minute's capacity row exists: it was recorded, all of it
            return 0
        if len(rows) > 1:
            conn.execute(insert_ignoring(conn, _TABLE), rows[1:])
    return len(rows)


DELETE_SLICE_S = 10 * MINUTE_S
"""Minute rows past the day are deleted ten minutes a transaction: the store's write lock is never
held long (8,000 device rows a minute at 1,000 nodes)."""


def roll_up(rt: Runtime, now: float) -> int:
    """Give every hour that has ended its hourly rows (one per series and key), then delete the
    minute rows older than a day; returns the hours rolled up. An hour is rolled up as soon as it
    ends, while its minutes are still kept: a read over a day or a week of each device's means then
    reads hours, not minutes. A key's hourly value is its mean over the minutes sampled in that hour
    (a tenant with no row in a minute held nothing then); utilisation and memory are the mean over
    the minutes they were measured.

    An hour is read and averaged outside any write transaction, its rows inserted in a short one (a
    roll-up another server made first is kept), and the old minutes deleted ten at a time. Stopped
    half-way, the next call finds what is left to do."""
    this_hour = float(int(now // HOUR_S) * HOUR_S)
    with rt.store.read() as session:
        conn = session.connection()
        sampled = set(conn.execute(select(HistoryRow.at_s).where(
            HistoryRow.series == "capacity", HistoryRow.step_s == MINUTE_S,
            HistoryRow.at_s < this_hour)).scalars())
        hours = {float(int(t // HOUR_S) * HOUR_S) for t in sampled}
        done = set(conn.execute(select(HistoryRow.at_s).where(
            HistoryRow.series == "capacity", HistoryRow.step_s == HOUR_S,
            HistoryRow.at_s.in_(sorted(hours)))).scalars()) if hours else set()
    rolled = 0
    for hour in sorted(hours - done):
        _roll_hour(rt, hour)
        rolled += 1
    cutoff = float(int((now - MINUTES_KEPT_S) // HOUR_S) * HOUR_S)
    old = sorted(t for t in sampled if t < cutoff)
    i = 0
    while i < len(old):  # slices that hold sampled minutes only: a month-long gap costs no transactions
        start = old[i]
        end = min(cutoff, start + DELETE_SLICE_S)
        with rt.store.write() as session:
            session.connection().execute(delete(HistoryRow).where(
                HistoryRow.step_s == MINUTE_S, HistoryRow.at_s >= start, HistoryRow.at_s < end))
        i = bisect_left(old, end)
    return rolled


def _roll_hour(rt: Runtime, hour: float) -> None:
    with rt.store.read() as session:
        found = session.connection().execute(select(
            HistoryRow.series, HistoryRow.key, HistoryRow.value, HistoryRow.busy_pct, HistoryRow.memory_mib,
        ).where(HistoryRow.step_s == MINUTE_S, HistoryRow.at_s >= hour,
                HistoryRow.at_s < hour + HOUR_S)).all()
    minutes = sum(1 for r in found if r.series == "capacity") or 1
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0.0, 0, 0])
    for r in found:
        acc = sums[(r.series, r.key)]
        acc[0] += r.value
        acc[5] += 1
        if r.busy_pct is not None:
            acc[1] += r.busy_pct
            acc[2] += 1
        if r.memory_mib is not None:
            acc[3] += r.memory_mib
            acc[4] += 1
    rows = [{"series": series, "step_s": HOUR_S, "at_s": hour, "key": key,
             "value": acc[0] / (acc[5] if series in MEAN_OF_MEASURED else minutes),
             "busy_pct": acc[1] / acc[2] if acc[2] else None,
             "memory_mib": acc[3] / acc[4] if acc[4] else None}
            for (series, key), acc in sums.items()]
    if rows:
        with rt.store.write() as session:
            conn = session.connection()
            conn.execute(insert_ignoring(conn, _TABLE), rows)


def expire(rt: Runtime, now: float, keep_days: float) -> int:
    """Delete every row older than `keep_days`; the rows deleted."""
    with rt.store.write() as session:
        return int(session.connection().execute(
            delete(HistoryRow).where(HistoryRow.at_s < now - keep_days * DAY_S)).rowcount or 0)


def query(rt: Runtime, who: Principal, metric: str, range_: str, now: float) -> HistoryOut:
    """The series of `metric` over `range_`, one point per RANGES width (the mean of the rows in it).

    A tenant reads only its own usage (metric `tenants`, its own series); the pool-wide metrics are
    the admin's."""
    if range_ not in RANGES:
        raise InvalidInput(f"Unknown range {range_!r}; use one of {', '.join(RANGES)}.", field="range")
    if metric not in ("tenants", "allocation", "pending", "devices"):
        raise InvalidInput(f"Unknown metric {metric!r}; use tenants, allocation, pending or devices.",
                           field="metric")
    if metric != "tenants" and not who.is_admin:
        raise Forbidden(f"The {metric} history covers the whole pool: it is the admin's; a tenant's token "
                        "reads its own usage with metric=tenants.")
    span, width, step = RANGES[range_]
    since = now - span
    series_names = {"tenants": ("capacity", "tenant"), "allocation": ("capacity", "allocated"),
                    "pending": ("capacity", "pending"), "devices": ("capacity", "device")}[metric]
    if metric == "devices":  # means in the store's own aggregate: a minute of 1,000 nodes is 8,000 rows
        return HistoryOut(metric=metric, range=range_, step_s=width, since_s=since, now_s=now, series=[],
                          devices=_devices(rt, since, DEVICE_STEPS[range_]))
    where = [HistoryRow.at_s >= since, HistoryRow.series.in_(series_names), HistoryRow.step_s == step]
    with rt.store.read() as session:
        if metric == "tenants" and not who.is_admin:
            # its own series since it was made: a deleted tenant's of the same name is another's
            made = made_s(session, who.tenant or "")
            where.append((HistoryRow.series == "capacity")
                         | ((HistoryRow.key == (who.tenant or "")) & (HistoryRow.at_s >= made)))
        found = session.execute(select(HistoryRow.series, HistoryRow.key, HistoryRow.at_s, HistoryRow.value)
                                .where(*where).order_by(HistoryRow.at_s)).all()
    times = sorted({r.at_s for r in found if r.series == "capacity"})
    out = HistoryOut(metric=metric, range=range_, step_s=width, since_s=since, now_s=now,
                     series=[], devices=[])
    values: dict[tuple[str, str], dict[float, float]] = defaultdict(dict)
    for r in found:
        values[(r.series, r.key)][r.at_s] = r.value / MILLI
    wanted = [("capacity", "", "capacity")] if metric != "tenants" else []
    keys = sorted(k for s, k in values if s == series_names[1])
    wanted += [(series_names[1], key, key if metric == "tenants" else series_names[1]) for key in keys]
    if metric != "tenants" and not keys:
        wanted.append((series_names[1], "", series_names[1]))
    for series, key, name in wanted:
        by_time = values.get((series, key), {})
        out.series.append(HistorySeries(name=name, values=bucket_means(times, by_time, width)))
    return out


def bucket_means(times: list[float], by_time: dict[float, float], width: int) -> list[tuple[float, float]]:
    """The mean per bucket of `width` seconds over the sampled times (a key missing at a sampled time
    held nothing then: 0)."""
    sums: dict[float, list[float]] = {}
    for t in times:
        start = float(int(t // width) * width)
        acc = sums.setdefault(start, [0.0, 0.0])
        acc[0] += by_time.get(t, 0.0)
        acc[1] += 1
    return [(start, round(acc[0] / acc[1], 6)) for start, acc in sorted(sums.items())]


def _devices(rt: Runtime, since: float, step: int) -> list[DeviceHistory]:
    """Each device's means since `since` over the rows `step` long: allocated share, and utilisation
    and memory where measured (AVG leaves out the minutes a device was not measured)."""
    with rt.store.read() as session:
        found = session.execute(
            select(HistoryRow.key, func.avg(HistoryRow.value), func.avg(HistoryRow.busy_pct),
                   func.avg(HistoryRow.memory_mib))
            .where(HistoryRow.series == "device", HistoryRow.step_s == step, HistoryRow.at_s >= since)
            .group_by(HistoryRow.key)).all()
    simulated = {f"{n.name}/{d.index}": d.simulated for n in rt.nodes() for d in n.devices}
    out = []
    for key, allocated, busy, memory in sorted(found, key=lambda r: _device_order(r[0])):
        node, _, index = key.rpartition("/")
        out.append(DeviceHistory(
            node=node, index=int(index), simulated=simulated.get(key, False),
            allocated=round(float(allocated) / MILLI, 6),
            busy_pct=None if busy is None else round(float(busy), 3),
            memory_used_mib=None if memory is None else round(float(memory), 1)))
    return out


def _device_order(key: str) -> tuple[str, int]:
    node, _, index = key.rpartition("/")
    return node, int(index)
