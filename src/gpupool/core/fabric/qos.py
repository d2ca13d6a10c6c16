"""QoS: a service level per priority class, the SL-to-VL map and the VL arbitration weights."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpupool.errors import InvalidInput

MAX_DATA_VLS = 8
MAX_WEIGHT = 255  # one VLArb table entry: weight in units of 64 bytes
NUM_SLS = 16


@dataclass(frozen=True)
class QosClass:
    """A priority class: the SL applications set (NCCL_IB_SL), its VL and its VLArb weight."""

    name: str
    sl: int
    vl: int
    weight: int


@dataclass(frozen=True)
class QosPlan:
    """Classes, the 16-entry SL-to-VL table and the low-priority VL arbitration table."""

    classes: tuple[QosClass, ...]

    @property
    def sl2vl(self) -> tuple[int, ...]:
        default_vl = self.default.vl
        table = [default_vl] * NUM_SLS
        for cls in self.classes:
            table[cls.sl] = cls.vl
        return tuple(table)

    @property
    def default(self) -> QosClass:
        return next(cls for cls in self.classes if cls.sl == 0)

    @property
    def vlarb_low(self) -> tuple[tuple[int, int], ...]:
        return tuple((cls.vl, cls.weight) for cls in sorted(self.classes, key=lambda c: c.vl))

    @property
    def max_vls(self) -> int:
        """Smallest VLCap value (1, 2, 4 or 8 data VLs) that holds every class's VL."""
        needed = max(cls.vl for cls in self.classes) + 1
        return next(cap for cap in (1, 2, 4, 8) if cap >= needed)

    def by_name(self, name: str) -> QosClass:
        for cls in self.classes:
            if cls.name == name:
                return cls
        known = ", ".join(cls.name for cls in self.classes)
        raise InvalidInput(f"No QoS class {name!r}; the plan has {known}.")

    def share(self, name: str) -> float:
        """The class's guaranteed share of a busy link: its weight over the sum of low-priority weights."""
        total = sum(cls.weight for cls in self.classes)
        return self.by_name(name).weight / total if total else 0.0


def _weights(shares: list[float]) -> list[int]:
    """Integer weights <= 255 whose ratios come closest to `shares` (ties: the smaller scale)."""
    peak = max(shares)
    best: tuple[float, list[int]] | None = None
    for top in range(1, MAX_WEIGHT + 1):
        raw = [max(1, round(share / peak * top)) for share in shares]
        total = sum(raw)
        error = sum(abs(w / total - s) for w, s in zip(raw, shares, strict=True))
        if best is None or error < best[0] - 1e-12:
            best = (error, raw)
    assert best is not None
    scale = MAX_WEIGHT // max(best[1])
    return [w * scale for w in best[1]]


def plan_qos(shares: Mapping[str, float], default_class: str | None = None) -> QosPlan:
    """Classes with the given link shares under contention, e.g. {"critical": 0.8, "batch": 0.2}.

    The default class (named, else "default" if present, else the smallest share) gets SL 0 so
    untagged traffic never lands in a privileged class; the others get SL 1, 2, ... in order.
    """
    if not shares:
        raise InvalidInput("Give at least one QoS class with its share, e.g. critical=0.8.")
    if len(shares) > MAX_DATA_VLS:
        raise InvalidInput(f"At most {MAX_DATA_VLS} QoS classes fit the 8 data VLs, got {len(shares)}.")
    if any(share <= 0 for share in shares.values()):
        raise InvalidInput("Every QoS share must be positive; drop classes that should get nothing.")
    total = sum(shares.values())
    normalised = {name: share / total for name, share in shares.items()}
    if default_class is None:
        default_class = "default" if "default" in shares else min(shares, key=shares.__getitem__)
    if default_class not in shares:
        raise InvalidInput(f"Default class {default_class!r} is not one of {', '.join(shares)}.")
    order = [default_class] + [name for name in shares if name != default_class]
    weights = _weights([normalised[name] for name in order])
    classes = tuple(QosClass(name, i, i, w) for i, (name, w) in enumerate(zip(order, weights, strict=True)))
    return QosPlan(classes)


def parse_shares(items: list[str]) -> dict[str, float]:
    """['critical=0.8', 'normal=20%'] -> {'critical': 0.8, 'normal': 0.2}."""
    shares: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            number = float(value.rstrip("%")) / (100.0 if value.endswith("%") else 1.0)
        except ValueError:
            number = -1.0
        if not sep or not name or number <= 0:
            raise InvalidInput(f"Expected CLASS=SHARE such as critical=0.8 or critical=80%, got {item!r}.")
        shares[name] = number
    return shares
