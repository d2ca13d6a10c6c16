"""Up*/down* hop counts over integer-indexed switch arrays: ranks from the roots, then per-leaf BFS layers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.fabric.model import Fabric, Link

INF = np.int16(10_000)


@dataclass(frozen=True)
class SwitchArrays:
    """Directed switch-to-switch edges sorted by source then port, and what up*/down* needs.

    `up[e]` is True when edge e climbs toward the roots: to a lower rank, or, between switches of
    equal rank, to the lower index (a fixed total order, so up-moves can never form a cycle).
    """

    switches: list[str]
    index: dict[str, int]
    src: np.ndarray
    dst: np.ndarray
    port: np.ndarray
    links: list[Link]
    up: np.ndarray
    rank: np.ndarray
    roots: list[str]
    leaves: list[str]
    leaf_index: dict[str, int]
    starts: np.ndarray
    has_edges: np.ndarray

    @property
    def num_switches(self) -> int:
        return len(self.switches)


def switch_arrays(fabric: Fabric, roots: Sequence[str] | None = None) -> SwitchArrays:
    """Index the healthy switch-to-switch cables of `fabric`; roots default to its ftree roots."""
    switches = fabric.switches
    n = len(switches)
    index = {sw: i for i, sw in enumerate(switches)}
    links = [link for link in fabric.links
             if link.healthy and link.a != link.b and link.a in index and link.b in index]
    ends = np.array([(index[lk.a], lk.a_port, index[lk.b], lk.b_port) for lk in links],
                    dtype=np.int64).reshape(-1, 4)
    k = np.arange(len(links), dtype=np.int64)
    # both directions of every cable, ordered by (source, port, destination, cable) as a sort of
    # those tuples would order them
    src = np.concatenate([ends[:, 0], ends[:, 2]])
    port = np.concatenate([ends[:, 1], ends[:, 3]])
    dst = np.concatenate([ends[:, 2], ends[:, 0]])
    link_idx = np.concatenate([k, k])
    order = np.lexsort((link_idx, dst, port, src))
    src, port, dst, link_idx = src[order], port[order], dst[order], link_idx[order]
    ordered_links = [links[i] for i in link_idx.tolist()]
    chosen = sorted(roots) if roots else _default_roots(fabric)
    rank = _ranks(n, src, dst, [index[r] for r in chosen if r in index])
    key = rank.astype(np.int64) * n + np.arange(n)
    up = key[dst] < key[src]
    leaves = sorted({sw for sw, _, link in fabric.ca_leaf.values() if link.healthy})
    starts = np.searchsorted(src, np.arange(n))
    has_edges = np.bincount(src, minlength=n) > 0
    return SwitchArrays(
        switches, index, src, dst, port, ordered_links, up, rank, chosen,
        leaves, {leaf: i for i, leaf in enumerate(leaves)}, starts, has_edges,
    )


def _default_roots(fabric: Fabric) -> list[str]:
    return fabric.roots


def _ranks(n: int, src: np.ndarray, dst: np.ndarray, roots: list[int]) -> np.ndarray:
    """BFS distance from the root set; switches that cannot be reached rank after all others.

    Level by level over the edge arrays: the switches first reached from level d are at d + 1,
    the same distances a queue-driven BFS finds."""
    rank = np.full(n, n + 1, dtype=np.int64)
    if not roots:
        return rank
    frontier = np.zeros(n, dtype=bool)
    frontier[roots] = True
    rank[frontier] = 0
    level = 0
    while frontier.any():
        reached = dst[frontier[src]]
        reached = reached[rank[reached] > level + 1]
        level += 1
        rank[reached] = level
        frontier = np.zeros(n, dtype=bool)
        frontier[reached] = True
    return rank


def _relax(dist: np.ndarray, arrays: SwitchArrays, mask: np.ndarray, base: np.ndarray) -> None:
    """In place: dist[s] = min(dist[s], base[d] + 1) over masked edges s->d (rows of `dist`)."""
    src = arrays.src[mask]
    if src.size == 0:
        return
    dst = arrays.dst[mask]
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])
    candidate = np.minimum.reduceat(base[dst] + 1, starts, axis=0)
    rows = src[starts]
    np.minimum(dist[rows], candidate, out=candidate)
    dist[rows] = candidate


def hop_tables(arrays: SwitchArrays, leaves: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(D, Ddown): legal up*/down* hops from every switch to each leaf column, and down-only hops.

    Ddown follows down-edges only; D allows up-moves first: D[s] = min(Ddown[s], 1 + D[up(s)]).
    Each loop ends when a pass changes nothing, at most one pass per hop of the longest path.
    """
    n = arrays.num_switches
    ddown = np.full((n, len(leaves)), INF, dtype=np.int16)
    ddown[np.asarray(leaves, dtype=np.int64), np.arange(len(leaves))] = 0
    down_mask = ~arrays.up
    for _ in range(n):
        before = ddown.copy()
        _relax(ddown, arrays, down_mask, ddown)
        if np.array_equal(before, ddown):
            break
    dist = ddown.copy()
    for _ in range(n):
        before = dist.copy()
        _relax(dist, arrays, arrays.up, dist)
        if np.array_equal(before, dist):
            break
    np.minimum(dist, INF, out=dist)
    np.minimum(ddown, INF, out=ddown)
    return dist, ddown


def next_hop_mask(arrays: SwitchArrays, dist: np.ndarray, ddown: np.ndarray) -> np.ndarray:
    """valid[e, l]: edge e is a next hop on a legal minimum path to leaf column l.

    A switch that can still reach the leaf going only down uses only down-edges, so a packet that
    has started down never meets a switch that sends it up again.
    """
    src, dst, up = arrays.src, arrays.dst, arrays.up[:, None]
    here = dist[src]
    reachable = here < INF
    going_down = ddown[src] == here
    down_ok = ~up & going_down & (ddown[dst] + 1 == here)
    up_ok = up & ~going_down & (dist[dst] + 1 == here)
    return (down_ok | up_ok) & reachable
