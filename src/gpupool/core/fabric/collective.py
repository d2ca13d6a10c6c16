"""Collective cost: ring and tree all-reduce time for a placement with the alpha-beta model."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpupool.core.fabric.model import Fabric
from gpupool.core.fabric.paths import route
from gpupool.core.fabric.updown import switch_arrays
from gpupool.errors import InvalidInput

# Per-message software and NIC start-up cost added to the path latency.
DEFAULT_BASE_ALPHA_S = 2e-6


class Algorithm(StrEnum):
    RING = "ring"
    TREE = "tree"


def ring_allreduce_s(ranks: int, message_bytes: float, alpha_s: float, beta_s_per_byte: float) -> float:
    """T = 2(p-1)·alpha + 2((p-1)/p)·n·beta."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * alpha_s + 2 * ((ranks - 1) / ranks) * message_bytes * beta_s_per_byte


def tree_allreduce_s(ranks: int, message_bytes: float, alpha_s: float, beta_s_per_byte: float) -> float:
    """Binary-tree reduce then broadcast, unpipelined: T = 2·ceil(log2 p)·(alpha + n·beta)."""
    if ranks <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(ranks)) * (alpha_s + message_bytes * beta_s_per_byte)


@dataclass(frozen=True)
class CollectiveCost:
    algorithm: Algorithm
    ranks: int
    message_bytes: float
    alpha_s: float
    beta_s_per_byte: float
    bottleneck_gbps: float
    time_s: float


def placement_cost(
    fabric: Fabric,
    cas: Sequence[str],
    message_bytes: float,
    algorithm: Algorithm = Algorithm.RING,
    base_alpha_s: float = DEFAULT_BASE_ALPHA_S,
) -> CollectiveCost:
    """All-reduce time for ranks on `cas` (one rank per CA, ring in leaf order).

    beta comes from the slowest ring neighbour pair's best path (load and health included); alpha
    is the base start-up cost plus the longest such path's latency.
    """
    if not cas:
        raise InvalidInput("A placement needs at least one CA.")
    ring = sorted(cas, key=lambda ca: (fabric.ca_leaf.get(ca, ("~", 0, None))[0], ca))
    if len(ring) == 1:
        return CollectiveCost(algorithm, 1, message_bytes, base_alpha_s, 0.0, math.inf, 0.0)
    arrays = switch_arrays(fabric)
    worst_gbps, worst_latency_ns = math.inf, 0.0
    for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
        found = route(fabric, a, b, arrays=arrays)
        if found.best is None:
            raise InvalidInput(f"{a} cannot reach {b}; the placement spans a broken fabric.")
        worst_gbps = min(worst_gbps, found.best.bottleneck_gbps)
        worst_latency_ns = max(worst_latency_ns, found.best.latency_ns())
    if worst_gbps <= 0:
        raise InvalidInput("Every path of the placement crosses a link with no bandwidth left.")
    alpha = base_alpha_s + worst_latency_ns * 1e-9
    beta = 8.0 / (worst_gbps * 1e9)
    model = ring_allreduce_s if algorithm is Algorithm.RING else tree_allreduce_s
    return CollectiveCost(
        algorithm, len(ring), message_bytes, alpha, beta, worst_gbps,
        model(len(ring), message_bytes, alpha, beta),
    )


def score_placement(fabric: Fabric, cas: Sequence[str], message_bytes: float) -> float:
    """Seconds per all-reduce of `message_bytes` with the faster of ring and tree: lower is better."""
    return min(placement_cost(fabric, cas, message_bytes, algo).time_s for algo in Algorithm)
