"""Metering, pure: intervals of held slices -> usage (slice-seconds) -> cost under a versioned price book.

The server derives the intervals from its pod rows (`started_s` .. `finished_s`, or now while a pod
runs) and the replay from its own allocations; both aggregate them here, so a bill and a replay's
cost are computed by the same arithmetic.

A slice's price is the device-hour price of its model times the slice's *share* of the device
(`dominant`: the larger of its compute and memory shares, what it denies other tenants; or
`weighted`: compute_weight x compute share + (1 - compute_weight) x memory share), times the
priority class's multiplier and the time-of-day tier's. Its `dedicated` price is the same with a
share of 1: the whole device the work would have needed on its own.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

DAY_S = 86_400.0
HOUR_S = 3_600.0
MILLI = 1000


class UsageKey(StrEnum):
    """What usage rows may be grouped by."""

    TENANT = "tenant"
    QUEUE = "queue"
    MODEL = "model"
    PRIORITY_CLASS = "priority_class"
    NODE = "node"
    DAY = "day"
    SERVICE = "service"
    """The inference service a pod was a replica of ('' for other work); metered from the pods."""


class SliceShare(StrEnum):
    DOMINANT = "dominant"
    WEIGHTED = "weighted"


def price_key(model: str) -> str:
    """Case- and punctuation-insensitive model key ('A100 80GB' and 'a100-80gb' are one model)."""
    return re.sub(r"[^a-z0-9]", "", model.lower())


@dataclass(frozen=True, slots=True)
class HeldSlice:
    """A share of one device held by a pod; `device_memory_mib` 0 when the device's memory is unknown."""

    model: str
    compute_milli: int
    memory_mib: int
    device_memory_mib: int = 0
    simulated: bool = False


@dataclass(frozen=True, slots=True)
class PodInterval:
    """One pod attempt's held slices from `start_s` to `end_s` (each attempt is its own interval)."""

    pod_id: str
    tenant: str
    queue: str
    priority_class: str
    node: str
    start_s: float
    end_s: float
    slices: tuple[HeldSlice, ...]
    service: str = ""
    """The inference service it is a replica of ('' for other work)."""


@dataclass(frozen=True, slots=True)
class Tier:
    """A time-of-day window (seconds after midnight UTC; `end_s` <= `start_s` wraps past midnight)."""

    start_s: float
    end_s: float
    multiplier: float


@dataclass(frozen=True, slots=True)
class PriceVersion:
    """The prices in force from `effective_from_s` until the next version's."""

    effective_from_s: float
    device_prices: Mapping[str, float]
    """price_key(model) -> price per whole-device hour."""
    fallback_price: float | None = None
    """For a model with no price; None: such usage costs 0 and its row says `priced: false`."""
    class_multipliers: Mapping[str, float] = field(default_factory=dict)
    tiers: tuple[Tier, ...] = ()
    share: SliceShare = SliceShare.DOMINANT
    compute_weight: float = 0.5

    def device_price(self, model: str) -> float | None:
        price = self.device_prices.get(price_key(model))
        return self.fallback_price if price is None else price

    def slice_share(self, held: HeldSlice) -> float:
        compute = held.compute_milli / MILLI
        if held.device_memory_mib <= 0:
            return compute
        memory = held.memory_mib / held.device_memory_mib
        if self.share is SliceShare.DOMINANT:
            return max(compute, memory)
        return self.compute_weight * compute + (1.0 - self.compute_weight) * memory

    def tier_seconds(self, start_s: float, end_s: float) -> float:
        """The seconds of [start_s, end_s) weighted by the tier multipliers (1 outside every tier)."""
        total = end_s - start_s
        for tier in self.tiers:
            total += (tier.multiplier - 1.0) * _daily_overlap(start_s, end_s, tier)
        return total


def _daily_overlap(start_s: float, end_s: float, tier: Tier) -> float:
    windows = ([(tier.start_s, tier.end_s)] if tier.end_s > tier.start_s
               else [(tier.start_s, DAY_S), (0.0, tier.end_s)])
    overlap = 0.0
    for day in range(math.floor(start_s / DAY_S), math.floor(end_s / DAY_S) + 1):
        base = day * DAY_S
        for lo, hi in windows:
            overlap += max(0.0, min(end_s, base + hi) - max(start_s, base + lo))
    return overlap


@dataclass(frozen=True, slots=True)
class PriceBook:
    """Price versions, oldest first; before the first one's date the first one applies."""

    versions: tuple[PriceVersion, ...]
    currency: str = "USD"

    def __post_init__(self) -> None:
        if not self.versions:
            raise ValueError("a price book needs at least one version")

    def pieces(self, start_s: float, end_s: float) -> Iterator[tuple[float, float, PriceVersion]]:
        """[start_s, end_s) cut where a new version takes effect, each piece with its version."""
        versions = self.versions
        index = 0
        while index + 1 < len(versions) and versions[index + 1].effective_from_s <= start_s:
            index += 1
        at = start_s
        while at < end_s:
            nxt = versions[index + 1].effective_from_s if index + 1 < len(versions) else math.inf
            stop = min(end_s, nxt)
            yield at, stop, versions[index]
            at = stop
            index += 1

    def hourly_price(self, model: str, start_s: float, end_s: float) -> float:
        """What a whole device of `model` costs an hour over [start_s, end_s), averaged as a bill of
        that interval prices it: each piece at the version in force then, with its tiers (0 for a
        model without a price). An empty interval: the price of its first second."""
        if end_s <= start_s:
            end_s = start_s + 1.0
        cost = 0.0
        for lo, hi, version in self.pieces(start_s, end_s):
            cost += (version.device_price(model) or 0.0) * version.tier_seconds(lo, hi)
        return cost / (end_s - start_s)


@dataclass(slots=True)
class UsageRow:
    """Usage of one group: slice-seconds, and what they cost pooled and on dedicated whole devices."""

    keys: dict[str, str]
    simulated: bool
    compute_milli_s: float = 0.0
    memory_mib_s: float = 0.0
    cost: float = 0.0
    dedicated_cost: float = 0.0
    priced: bool = True
    pods: set[str] = field(default_factory=set)

    @property
    def device_hours(self) -> float:
        return self.compute_milli_s / MILLI / HOUR_S

    @property
    def memory_gib_hours(self) -> float:
        return self.memory_mib_s / 1024.0 / HOUR_S


def day_of(time_s: float) -> str:
    """The UTC date of an epoch time, 'YYYY-MM-DD'."""
    days = math.floor(time_s / DAY_S)
    # civil-from-days (H. Hinnant), so the core reads no clock or time zone database
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    y = yoe + era * 400 + (1 if m <= 2 else 0)
    return f"{y:04d}-{m:02d}-{d:02d}"


def _cut_days(start_s: float, end_s: float) -> Iterator[tuple[float, float]]:
    at = start_s
    while at < end_s:
        stop = min(end_s, (math.floor(at / DAY_S) + 1) * DAY_S)
        yield at, stop
        at = stop


def aggregate(intervals: Iterable[PodInterval], book: PriceBook, by: Sequence[UsageKey],
              since_s: float = -math.inf, until_s: float = math.inf) -> list[UsageRow]:
    """Usage rows grouped by `by` (and always by simulated or not), of every interval's part in
    [since_s, until_s), sorted by their keys."""
    rows: dict[tuple[object, ...], UsageRow] = {}
    by_day = UsageKey.DAY in by
    for interval in intervals:
        start, end = max(interval.start_s, since_s), min(interval.end_s, until_s)
        if end <= start:
            continue
        pieces = _cut_days(start, end) if by_day else iter(((start, end),))
        for lo, hi in pieces:
            for held in interval.slices:
                keys = _keys(interval, held, by, lo)
                key = (*keys.values(), held.simulated)
                row = rows.get(key)
                if row is None:
                    row = rows[key] = UsageRow(keys, held.simulated)
                _meter(row, interval, held, book, lo, hi)
    return [rows[k] for k in sorted(rows, key=lambda k: tuple(str(part) for part in k))]


def _keys(interval: PodInterval, held: HeldSlice, by: Sequence[UsageKey], at_s: float) -> dict[str, str]:
    values = {UsageKey.TENANT: interval.tenant, UsageKey.QUEUE: interval.queue, UsageKey.MODEL: held.model,
              UsageKey.PRIORITY_CLASS: interval.priority_class, UsageKey.NODE: interval.node,
              UsageKey.SERVICE: interval.service}
    return {key.value: day_of(at_s) if key is UsageKey.DAY else values[key] for key in by}


def _meter(row: UsageRow, interval: PodInterval, held: HeldSlice, book: PriceBook, lo: float,
           hi: float) -> None:
    seconds = hi - lo
    row.compute_milli_s += held.compute_milli * seconds
    row.memory_mib_s += held.memory_mib * seconds
    row.pods.add(interval.pod_id)
    for a, b, version in book.pieces(lo, hi):
        price = version.device_price(held.model)
        if price is None:
            row.priced = False
            continue
        multiplier = version.class_multipliers.get(interval.priority_class, 1.0)
        hours = version.tier_seconds(a, b) / HOUR_S * multiplier
        row.cost += price * version.slice_share(held) * hours
        row.dedicated_cost += price * hours


def totals(rows: Sequence[UsageRow]) -> UsageRow:
    """All rows summed into one (its keys empty)."""
    total = UsageRow({}, simulated=any(r.simulated for r in rows))
    for row in rows:
        total.compute_milli_s += row.compute_milli_s
        total.memory_mib_s += row.memory_mib_s
        total.cost += row.cost
        total.dedicated_cost += row.dedicated_cost
        total.priced = total.priced and row.priced
        total.pods |= row.pods
    return total
