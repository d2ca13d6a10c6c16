"""Fabric-wide questions: CA pairs a link failure cuts off or slows; a node set's bisection bandwidth."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.fabric.model import Fabric, Link
from gpupool.core.fabric.updown import INF, SwitchArrays, hop_tables, next_hop_mask, switch_arrays
from gpupool.errors import InvalidInput

CHUNK_LEAVES = 64
SAMPLE_PAIRS = 20


@dataclass(frozen=True)
class LeafMatrix:
    """Leaf-to-leaf view of the routes: hops and number of equal-cost paths (0 = unreachable)."""

    leaves: list[str]
    cas_per_leaf: dict[str, list[str]]
    hops: np.ndarray
    paths: np.ndarray


def leaf_matrix(fabric: Fabric, roots: Sequence[str] | None = None) -> LeafMatrix:
    arrays = switch_arrays(fabric, roots)
    rows = [arrays.index[leaf] for leaf in arrays.leaves]
    n = len(rows)
    hops = np.full((n, n), -1, dtype=np.int64)
    paths = np.zeros((n, n), dtype=np.int64)
    for first in range(0, n, CHUNK_LEAVES):
        chunk = rows[first : first + CHUNK_LEAVES]
        dist, ddown = hop_tables(arrays, chunk)
        counts = _path_counts(arrays, dist, next_hop_mask(arrays, dist, ddown))
        block = dist[rows]
        hops[:, first : first + len(chunk)] = np.where(block < INF, block, -1)
        paths[:, first : first + len(chunk)] = counts[rows]
    cas: dict[str, list[str]] = {leaf: [] for leaf in arrays.leaves}
    for ca, (leaf, _, link) in fabric.ca_leaf.items():
        if link.healthy and leaf in cas:
            cas[leaf].append(ca)
    return LeafMatrix(arrays.leaves, cas, hops, paths)


def _path_counts(arrays: SwitchArrays, dist: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Equal-cost path counts from each switch, built up one hop layer at a time."""
    counts = (dist == 0).astype(np.int64)
    finite = dist[dist < INF]
    longest = int(finite.max()) if finite.size else 0
    src, dst = arrays.src, arrays.dst
    if src.size == 0:
        return counts
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])
    rows = src[starts]
    for _ in range(longest):
        summed = np.add.reduceat(np.where(valid, counts[dst], 0), starts, axis=0)
        update = counts.copy()
        update[rows] = summed
        counts = np.where(dist == 0, 1, update)
    return counts


@dataclass(frozen=True)
class LinkFailureImpact:
    """What losing one cable does: CA pairs cut off, and pairs left with fewer or longer paths."""

    link: Link
    lost_pairs: int
    degraded_pairs: int
    lost_sample: list[tuple[str, str]]
    degraded_sample: list[tuple[str, str, int, int]]


def fail_link(fabric: Fabric, link: Link, roots: Sequence[str] | None = None) -> LinkFailureImpact:
    """Recompute routes without `link` and compare every CA pair (grouped by leaf) with before."""
    after_fabric = fabric.without_links([link])
    ca_end = next((end for end in (link.a, link.b) if not fabric.is_switch(end)), None)
    if ca_end is not None:
        others = [ca for ca in fabric.cas if ca != ca_end and ca in fabric.ca_leaf]
        attached = fabric.ca_leaf.get(ca_end)
        lost = [(ca_end, other) for other in others] if attached and attached[2] == link else []
        return LinkFailureImpact(link, len(lost), 0, lost[:SAMPLE_PAIRS], [])
    before, after = leaf_matrix(fabric, roots), leaf_matrix(after_fabric, roots)
    if before.leaves != after.leaves:
        raise InvalidInput("Removing a switch-to-switch link changed the set of leaves; this is a bug.")
    size = np.array([len(before.cas_per_leaf[leaf]) for leaf in before.leaves], dtype=np.int64)
    upper = np.triu(np.ones_like(before.paths, dtype=bool), k=1)
    was_up = before.paths > 0
    lost_mask = upper & was_up & (after.paths == 0)
    worse = upper & was_up & (after.paths > 0) & (
        (after.paths < before.paths) | (after.hops > before.hops)
    )
    weight = np.outer(size, size)
    return LinkFailureImpact(
        link,
        int(weight[lost_mask].sum()),
        int(weight[worse].sum()),
        _sample(before, lost_mask),
        [(a, b, int(before.paths[i, j]), int(after.paths[i, j])) for (a, b), (i, j) in
         zip(_sample(before, worse), _sample_index(worse), strict=True)],
    )


def _sample_index(mask: np.ndarray) -> list[tuple[int, int]]:
    rows, cols = np.nonzero(mask)
    return list(zip(rows.tolist(), cols.tolist(), strict=True))[:SAMPLE_PAIRS]


def _sample(matrix: LeafMatrix, mask: np.ndarray) -> list[tuple[str, str]]:
    out = []
    for i, j in _sample_index(mask):
        a = matrix.cas_per_leaf[matrix.leaves[i]]
        b = matrix.cas_per_leaf[matrix.leaves[j]]
        if a and b:
            out.append((a[0], b[0]))
    return out


@dataclass(frozen=True)
class Bisection:
    """Max flow between the two halves of a CA set split along leaf order (the tree's worst cut)."""

    gbps: float
    half_a: list[str]
    half_b: list[str]

    @property
    def per_ca_gbps(self) -> float:
        return self.gbps / max(1, min(len(self.half_a), len(self.half_b)))


def bisection_bandwidth(fabric: Fabric, cas: Sequence[str]) -> Bisection:
    """Bandwidth the fabric can carry between the two halves of `cas` (available Gb/s per link)."""
    import networkx as nx

    members = sorted(set(cas), key=lambda ca: (fabric.ca_leaf.get(ca, ("~", 0, None))[0], ca))
    if len(members) < 2:
        raise InvalidInput("Bisection bandwidth needs at least two CAs.")
    half = len(members) // 2
    half_a, half_b = members[:half], members[half:]
    graph = nx.DiGraph()
    for link in fabric.links:
        if link.a == link.b:
            continue
        for u, v in ((link.a, link.b), (link.b, link.a)):
            prior = graph.get_edge_data(u, v, {"capacity": 0.0})["capacity"]
            graph.add_edge(u, v, capacity=prior + link.available_gbps)
    source, sink = ("__source__",), ("__sink__",)
    for ca in half_a:
        graph.add_edge(source, ca)
    for ca in half_b:
        graph.add_edge(ca, sink)
    value = nx.maximum_flow_value(graph, source, sink) if all(
        ca in graph for ca in members
    ) else 0.0
    return Bisection(float(value), half_a, half_b)
