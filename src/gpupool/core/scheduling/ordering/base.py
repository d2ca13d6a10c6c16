"""The ordering-policy interface and its registry: in which order pending workloads are tried."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, ClassVar

from gpupool.core.model import Workload, WorkloadInfo
from gpupool.core.priority import Rank
from gpupool.errors import UnknownName, did_you_mean

SHARE_RESOURCES = ("device_milli", "cpu_milli", "memory_mib")
"""The resources fair share (DRF) looks at, in this order."""


@dataclass(frozen=True, slots=True)
class PendingChanges:
    """The workloads (objects) that joined and left the pending list since the list numbered
    `serial - 1` on the same view; unchanged objects are in both lists."""

    serial: int
    arrived: Sequence[Workload]
    departed: Sequence[Workload]


@dataclass(frozen=True, slots=True)
class OrderingContext:
    """What an ordering may look at besides the pending list (all read-only)."""

    now_s: float
    rank: Callable[[Workload], Rank]
    capacity: Mapping[str, float] = field(default_factory=dict)
    tenant_usage: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    info: Mapping[str, WorkloadInfo] = field(default_factory=dict)
    demand: Callable[[Workload], Mapping[str, float]] = field(default=lambda w: demand_of(w))
    """A workload's share resources (`demand_of`; the cycle passes a cached version)."""
    memo: dict[str, Any] = field(default_factory=dict)
    """Kept across the cycles on one view (an ordering's own caches, under its name); what an
    ordering keeps here must not change its order, only save recomputing it."""
    changes: PendingChanges | None = None
    """How the pending list differs from the one of the cycle before on this view, when known."""

    def attained_service_s(self, w: Workload) -> float:
        found = self.info.get(w.id)
        return found.attained_service_s if found else 0.0


fifo_key: Callable[[Workload], tuple[float, str]] = attrgetter("submit_time_s", "id")
"""Oldest first, then by id (a total order)."""


def demand_of(w: Workload) -> dict[str, float]:
    """A workload's requested share resources (what DRF charges its tenant)."""
    device = cpu = memory = 0
    for p in w.pods:
        device += p.num_devices * p.device_milli
        cpu += p.cpu_milli
        memory += p.memory_mib
    return {"device_milli": float(device), "cpu_milli": float(cpu), "memory_mib": float(memory)}


class OrderingPolicy(ABC):
    """Orders pending workloads. `strict` orderings block their ClusterQueue behind a stuck head."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    strict: ClassVar[bool] = False
    needs_usage: ClassVar[bool] = False
    """Whether `order` reads the tenants' current usage (then the cycle builds it first)."""

    @abstractmethod
    def order(self, pending: Sequence[Workload], ctx: OrderingContext) -> list[Workload]:
        """The pending workloads in the order they are tried. Pure, deterministic, total order."""

    banded: ClassVar[bool] = False
    """Whether the order lists the priority bands (`rank[0]`) highest first, each band's own order
    not depending on the order of the bands before it (then a caller may skip the rest of a band)."""

    def stream(self, pending: Sequence[Workload], ctx: OrderingContext) -> OrderStream:
        """`order` one workload at a time, for a caller that may stop early or skip a band.

        Whatever the order reads from `ctx` is read before this returns, so the caller may change
        the context's mappings (usage, info) while it consumes the stream.
        """
        ordered = self.order(pending, ctx)
        rank = ctx.rank
        return ListStream(ordered, (lambda w: rank(w)[0]) if self.banded else None)


class OrderStream(ABC):
    """An order being consumed: `next_workload` gives the next one; `skip_band` passes over a band."""

    @abstractmethod
    def next_workload(self) -> Workload | None:
        """The next workload in the order, None at the end."""

    @abstractmethod
    def skip_band(self) -> list[Workload]:
        """Pass over the rest of the band of the workload last given; returns what was passed over.

        Only for a `banded` ordering; the bands after it come exactly as if nothing was skipped.
        """


class ListStream(OrderStream):
    """A stream over an order computed in full; `band` gives a workload's band (None: unbanded)."""

    def __init__(self, ordered: list[Workload], band: Callable[[Workload], int] | None) -> None:
        self.ordered = ordered
        self.band = band
        self.at = 0

    def next_workload(self) -> Workload | None:
        if self.at >= len(self.ordered):
            return None
        self.at += 1
        return self.ordered[self.at - 1]

    def skip_band(self) -> list[Workload]:
        if self.band is None or not self.at:
            return []
        band = self.band
        current = band(self.ordered[self.at - 1])
        start = end = self.at
        while end < len(self.ordered) and band(self.ordered[end]) == current:
            end += 1
        self.at = end
        return self.ordered[start:end]


_REGISTRY: dict[str, type[OrderingPolicy]] = {}


def register_ordering(cls: type[OrderingPolicy]) -> type[OrderingPolicy]:
    """Class decorator: make an ordering policy available by its `name`."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"ordering policy {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _load_builtin() -> None:
    import gpupool.core.scheduling.ordering  # noqa: F401


def ordering_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def make_ordering(name: str, **options: Any) -> OrderingPolicy:
    """A fresh ordering policy by registered name (options go to its constructor)."""
    _load_builtin()
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise UnknownName(
            f"Unknown ordering policy {name!r}; choose one of {', '.join(sorted(_REGISTRY))}."
            + did_you_mean(name, list(_REGISTRY))
        ) from None
    return cls(**options)
