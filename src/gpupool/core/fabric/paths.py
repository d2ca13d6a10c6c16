"""Routes between two CAs: every equal-cost up*/down* path, its bottleneck bandwidth and its latency."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.fabric.model import DEFAULT_CABLE_LATENCY_NS, DEFAULT_SWITCH_LATENCY_NS, Fabric, Link
from gpupool.core.fabric.updown import INF, SwitchArrays, hop_tables, next_hop_mask, switch_arrays
from gpupool.errors import InvalidInput

MAX_LISTED_PATHS = 256


@dataclass(frozen=True)
class Path:
    """One route: the switches it crosses and the cables it uses, CA to CA."""

    switches: tuple[str, ...]
    links: tuple[Link, ...]

    @property
    def hops(self) -> int:
        return len(self.links)

    @property
    def bottleneck_gbps(self) -> float:
        return min(link.available_gbps for link in self.links)

    def latency_ns(
        self,
        switch_latency_ns: float = DEFAULT_SWITCH_LATENCY_NS,
        cable_latency_ns: float = DEFAULT_CABLE_LATENCY_NS,
    ) -> float:
        return len(self.switches) * switch_latency_ns + len(self.links) * cable_latency_ns


@dataclass(frozen=True)
class Route:
    """All equal-cost paths between two CAs (listing capped at MAX_LISTED_PATHS)."""

    src: str
    dst: str
    paths: tuple[Path, ...]
    ecmp_paths: int

    @property
    def reachable(self) -> bool:
        return bool(self.paths)

    @property
    def hops(self) -> int:
        return self.paths[0].hops if self.paths else -1

    @property
    def best(self) -> Path | None:
        """The path with the most bandwidth left: what a load-aware placement should use."""
        return max(self.paths, key=lambda path: path.bottleneck_gbps) if self.paths else None

    @property
    def bottleneck_gbps(self) -> float:
        return self.best.bottleneck_gbps if self.best else 0.0


def route(
    fabric: Fabric, src: str, dst: str, roots: Sequence[str] | None = None,
    arrays: SwitchArrays | None = None,
) -> Route:
    """Every legal minimum-hop up*/down* path between CAs `src` and `dst`."""
    for end in (src, dst):
        if fabric.is_switch(end):
            raise InvalidInput(f"{fabric.nodes[end].label} is a switch; routes run between CAs.")
    attach_a, attach_b = fabric.ca_leaf.get(src), fabric.ca_leaf.get(dst)
    if attach_a is None or attach_b is None or not (attach_a[2].healthy and attach_b[2].healthy):
        return Route(src, dst, (), 0)
    arrays = arrays or switch_arrays(fabric, roots)
    leaf_a, leaf_b = arrays.index[attach_a[0]], arrays.index[attach_b[0]]
    if leaf_a == leaf_b:
        path = Path((attach_a[0],), (attach_a[2], attach_b[2]))
        return Route(src, dst, (path,), 1)
    dist, ddown = hop_tables(arrays, [leaf_b])
    if dist[leaf_a, 0] >= INF:
        return Route(src, dst, (), 0)
    valid = next_hop_mask(arrays, dist, ddown)[:, 0]
    count = count_paths(arrays, dist[:, 0], valid)
    middles = _enumerate(arrays, valid, leaf_a, leaf_b)
    paths = tuple(
        Path(tuple(arrays.switches[s] for s in nodes), (attach_a[2], *links, attach_b[2]))
        for nodes, links in middles
    )
    return Route(src, dst, paths, int(count[leaf_a]))


def count_paths(arrays: SwitchArrays, dist: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Number of next-hop-valid paths from each switch to the destination leaf (dist == 0)."""
    total = np.where(dist == 0, 1, 0).astype(np.int64)
    order = np.argsort(dist, kind="stable")
    by_src: dict[int, list[int]] = {}
    for edge in np.flatnonzero(valid).tolist():
        by_src.setdefault(int(arrays.src[edge]), []).append(edge)
    for node in order.tolist():
        if dist[node] <= 0 or dist[node] >= INF:
            continue
        total[node] = sum(int(total[arrays.dst[e]]) for e in by_src.get(node, []))
    return total


def _enumerate(
    arrays: SwitchArrays, valid: np.ndarray, start: int, goal: int
) -> list[tuple[list[int], list[Link]]]:
    by_src: dict[int, list[int]] = {}
    for edge in np.flatnonzero(valid).tolist():
        by_src.setdefault(int(arrays.src[edge]), []).append(edge)
    found: list[tuple[list[int], list[Link]]] = []
    stack: list[tuple[int, list[int], list[Link]]] = [(start, [start], [])]
    while stack and len(found) < MAX_LISTED_PATHS:
        node, nodes, links = stack.pop()
        if node == goal:
            found.append((nodes, links))
            continue
        for edge in reversed(by_src.get(node, [])):
            nxt = int(arrays.dst[edge])
            stack.append((nxt, [*nodes, nxt], [*links, arrays.links[edge]]))
    return found
