"""A gang's topology constraint (Kueue / Volcano semantics) and the parser for its text form.

API:
  - `Tier`: the fabric tiers a constraint can name, narrowest first: `leaf` (the nodes under one
    leaf switch, or one set of rail leaves) and `spine` (the leaves that share a spine or pod group).
  - `TopologySpec(required=, preferred=, slice_size=, slice_tier=)`: frozen; `str(spec)` gives the
    text form back; `TopologySpec()` (`UNCONSTRAINED`) asks for nothing.
      required=T   all pods inside one domain of tier T, or the gang waits;
      preferred=T  start inside one domain of tier T, widen one tier at a time if nothing fits;
      slice=N@T    pods in groups of N (in pod order), each group inside one domain of tier T.
      comm=R       no constraint: the gang's communication ratio, what the network-aware policy
                   weighs its placements by (T_net / T_comp of its step on a packed ring at the
                   fabric's link rate; e.g. 0.2 for a light model, 1.5 for a heavy one). Alone it
                   keeps the pool's default constraint.
  - `parse_topology_spec(text)`: "required=leaf", "preferred=spine", "slice=4@leaf",
    "required=spine,slice=4@leaf", "preferred=leaf,comm=1.5", "comm=0.2", or "none" (no
    constraint, overriding the pool's default);
    raises `InvalidInput` with one sentence otherwise. The CLI's `--topology` and the pool
    configuration's `scheduling.topology_default` use it.
  - `effective_spec(spec, default, pods, fractional)`: what applies to one workload: single-pod and
    fractional work is never constrained; a multi-pod gang without a spec of its own gets `default`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from gpupool.errors import InvalidInput, closest


class Tier(StrEnum):
    """A fabric tier a constraint names, narrowest first."""

    LEAF = "leaf"
    SPINE = "spine"

    @property
    def depth(self) -> int:
        """0 for leaf, 1 for spine: a tier contains every domain of a lower depth."""
        return _TIERS.index(self)


_TIERS: tuple[Tier, ...] = (Tier.LEAF, Tier.SPINE)
MAX_COMM_RATIO = 1e6
"""A stated communication ratio must be below this (a step a million times longer than its compute)."""
_TIER_NAMES = "leaf or spine"


@dataclass(frozen=True, slots=True)
class TopologySpec:
    """Where a gang's pods may go (see the module docstring); all fields unset: unconstrained."""

    required: Tier | None = None
    preferred: Tier | None = None
    slice_size: int | None = None
    slice_tier: Tier = Tier.LEAF
    comm_ratio: float | None = None
    """The gang's communication ratio as its user states it (None: unknown); constrains nothing."""

    def __post_init__(self) -> None:
        if self.comm_ratio is not None and not (0 <= self.comm_ratio < MAX_COMM_RATIO):  # nan, inf fail
            raise InvalidInput(f"comm= needs a ratio from 0 to below {MAX_COMM_RATIO:,.0f} such as comm=1.5, "
                               f"got {self.comm_ratio:g}.")
        if self.required is not None and self.preferred is not None:
            raise InvalidInput("A topology constraint is either required or preferred, not both; drop one.")
        if self.slice_size is not None and self.slice_size < 1:
            raise InvalidInput(f"A topology slice needs at least 1 pod, got {self.slice_size}.")
        if (self.slice_size is not None and self.required is not None
                and self.slice_tier.depth > self.required.depth):
            raise InvalidInput(
                f"slice=N@{self.slice_tier} is wider than required={self.required}; "
                "slice at the required tier or a narrower one."
            )

    @property
    def constrained(self) -> bool:
        return self.required is not None or self.preferred is not None or self.slice_size is not None

    @property
    def tier(self) -> Tier | None:
        """The tier the whole gang should sit in (required or preferred), None when any will do."""
        return self.required or self.preferred

    def __str__(self) -> str:
        parts = []
        if self.required is not None:
            parts.append(f"required={self.required}")
        if self.preferred is not None:
            parts.append(f"preferred={self.preferred}")
        if self.slice_size is not None:
            parts.append(f"slice={self.slice_size}@{self.slice_tier}")
        if self.comm_ratio is not None:
            parts.append(f"comm={self.comm_ratio:g}")
        return ",".join(parts) or "none"


UNCONSTRAINED = TopologySpec()


_KEYS = ("required", "preferred", "slice", "comm")


def _meant(close: str | None) -> str:
    """' (did you mean X?)' inside the one sentence of an error, or ''."""
    return f" (did you mean {close}?)" if close else ""


def _tier(text: str, key: str) -> Tier:
    try:
        return Tier(text.strip().lower())
    except ValueError:
        meant = _meant(closest(text.strip(), [t.value for t in Tier]))
        raise InvalidInput(f"Unknown topology tier {text!r} in {key}={meant}; use {_TIER_NAMES}.") from None


def parse_topology_spec(text: str) -> TopologySpec:
    """Parse 'required=leaf', 'preferred=spine', 'slice=N@leaf' (comma-joined) or 'none'."""
    cleaned = text.strip().lower()
    if cleaned in ("", "none"):
        return UNCONSTRAINED
    fields: dict[str, str] = {}
    for part in cleaned.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            tier = closest(key, [t.value for t in Tier]) if not sep else None
            meant = _meant(f"preferred={tier} or required={tier}" if tier else None)
            raise InvalidInput(
                f"Cannot read topology {text!r}{meant}; write required=leaf|spine, preferred=leaf|spine, "
                "slice=N@leaf|spine, comm=RATIO (comma-joined) or none."
            )
        if key not in _KEYS:
            raise InvalidInput(f"Unknown topology key {key!r}{_meant(closest(key, list(_KEYS)))}; use "
                               "required, preferred, slice or comm.")
        if key in fields:
            raise InvalidInput(f"The topology names {key}= twice; give it once.")
        fields[key] = value
    slice_size, slice_tier = None, Tier.LEAF
    if "slice" in fields:
        count, at, tier = fields["slice"].partition("@")
        if not count.strip().isdigit():
            raise InvalidInput(f"slice= needs a pod count such as slice=4@leaf, got {fields['slice']!r}.")
        slice_size = int(count)
        slice_tier = _tier(tier, "slice") if at else Tier.LEAF
    comm_ratio = None
    if "comm" in fields:
        try:
            comm_ratio = float(fields["comm"])
        except ValueError:
            raise InvalidInput(f"comm= needs a number such as comm=1.5, got {fields['comm']!r}.") from None
    return TopologySpec(
        required=_tier(fields["required"], "required") if "required" in fields else None,
        preferred=_tier(fields["preferred"], "preferred") if "preferred" in fields else None,
        slice_size=slice_size,
        slice_tier=slice_tier,
        comm_ratio=comm_ratio,
    )


def effective_spec(
    spec: TopologySpec | None, default: TopologySpec | None, pods: int, fractional: bool
) -> TopologySpec | None:
    """The constraint that applies to a workload of `pods` pods (None: unconstrained)."""
    if pods <= 1 or fractional:
        return None
    chosen = default if spec is None else spec
    if spec is not None and not spec.constrained and spec.comm_ratio is not None and default is not None:
        chosen = replace(default, comm_ratio=spec.comm_ratio)  # comm= alone keeps the default
    return chosen if chosen is not None and chosen.constrained else None
