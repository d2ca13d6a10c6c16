"""Incremental up*/down* re-route after one switch-to-switch link fails: only affected entries change.

Removing one cable (two directed edges u->v, v->u) changes a leaf column's hop counts only when an
end of that cable loses its distance to the leaf (no other edge reaches it as cheaply). Such
"hard" columns are recomputed whole; in every other column no hop count changes, so the only
forwarding entries that can change are those of u and v themselves (they lost a candidate next
hop), recomputed for those two rows. Where the failure would move the switch ranks or the fat-tree
roots (a switch cut off from the roots), the update falls back to `compute_tables` on the fabric
without the link. The result always equals that full recomputation (tests check it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from gpupool.core.fabric.forwarding import NO_ROUTE, ForwardingTables, _fill_chunk, compute_tables
from gpupool.core.fabric.model import Fabric, Link, canonical_link
from gpupool.core.fabric.updown import INF, SwitchArrays, hop_tables


@dataclass(frozen=True)
class Reroute:
    """The tables after the failure and what the update touched."""

    tables: ForwardingTables
    changed_entries: int
    """Forwarding entries (switch, CA) whose output port changed."""
    hard_columns: int
    """Leaf columns whose hop counts changed and were recomputed whole."""
    incremental: bool
    """False when the update fell back to a full recomputation."""


def reroute_after_failure(fabric: Fabric, tables: ForwardingTables, link: Link) -> Reroute:
    """The forwarding tables of `fabric` without `link`, updated from `tables` (those of `fabric`).

    Pure: `tables` is not modified. Equal to `compute_tables` on `fabric.without_links([link])`
    with the same roots (the fabric's own roots when `tables` used those).
    """
    edges = _edges_of(tables.arrays, link)
    if edges is None or tables.down_hops is None or not _structure_kept(fabric, tables.arrays, edges):
        return _full(fabric, tables, link)
    arrays = _without_edges(tables.arrays, edges)
    u, v = (int(tables.arrays.src[e]) for e in edges)
    dist, ddown = tables.hops, tables.down_hops
    hard = np.zeros(dist.shape[1], dtype=bool)
    for t in (u, v):
        new_down, new_dist = _row_values(arrays, t, dist, ddown)
        hard |= (new_down != ddown[t]) | (new_dist != dist[t])
    by_ca = np.array(tables.ports.T, order="C")  # a copy: the input tables stay as they are
    before = by_ca.copy()
    dist, ddown = dist.copy(), ddown.copy()
    slot = _ca_slots(tables.ca_leaf)
    leaf_col = _leaf_columns(tables)
    hard_cols = np.flatnonzero(hard)
    if hard_cols.size:
        rows = [arrays.index[arrays.leaves[c]] for c in hard_cols.tolist()]
        new_dist, new_down = hop_tables(arrays, rows)
        dist[:, hard_cols], ddown[:, hard_cols] = new_dist, new_down
        _fill_chunk(arrays, by_ca, new_dist, new_down, rows, tables.ca_leaf, slot)
    soft_cas = np.flatnonzero((leaf_col >= 0) & ~hard[np.maximum(leaf_col, 0)])
    for t in (u, v):
        by_ca[soft_cas, t] = _row_picks(arrays, t, dist, ddown, leaf_col[soft_cas], slot[soft_cas])
    routed = np.flatnonzero(tables.ca_leaf >= 0)
    by_ca[routed, tables.ca_leaf[routed]] = tables.ca_leaf_port[routed]
    updated = replace(tables, arrays=arrays, ports=by_ca.T, hops=dist, down_hops=ddown)
    changed = int(np.count_nonzero(by_ca != before))
    return Reroute(updated, changed, int(hard_cols.size), True)


def _full(fabric: Fabric, tables: ForwardingTables, link: Link) -> Reroute:
    roots = None if tables.arrays.roots == fabric.roots else tables.arrays.roots
    full = compute_tables(fabric.without_links([canonical_link(link)]), roots)
    changed = (int(np.count_nonzero(full.ports != tables.ports))
               if full.ports.shape == tables.ports.shape else int(full.ports.size))
    return Reroute(full, changed, full.hops.shape[1], False)


def _edges_of(arrays: SwitchArrays, link: Link) -> tuple[int, int] | None:
    """The two directed edges of a healthy switch-to-switch cable; None for any other link."""
    if link.a == link.b or link.a not in arrays.index or link.b not in arrays.index:
        return None
    a, b = arrays.index[link.a], arrays.index[link.b]
    found = []
    for s, port, d in ((a, link.a_port, b), (b, link.b_port, a)):
        lo, hi = int(arrays.starts[s]), int(np.searchsorted(arrays.src, s, side="right"))
        hit = [e for e in range(lo, hi) if arrays.port[e] == port and arrays.dst[e] == d]
        if len(hit) != 1:
            return None
        found.append(hit[0])
    return found[0], found[1]


def _structure_kept(fabric: Fabric, arrays: SwitchArrays, edges: tuple[int, int]) -> bool:
    """True when ranks (BFS from the roots) and fat-tree levels (BFS from the leaves) survive.

    A BFS distance grows after an edge is cut only at the far end of a tight edge that had no
    other neighbour one step closer; everything beyond it keeps its distance.
    """
    e = edges[0]
    s, d = int(arrays.src[e]), int(arrays.dst[e])
    rank = arrays.rank
    if rank[s] != rank[d]:
        far = s if rank[s] > rank[d] else d
        others = [int(arrays.dst[k]) for k in range(int(arrays.starts[far]), _end(arrays, far))
                  if k not in edges]
        if not any(rank[o] == rank[far] - 1 for o in others):
            return False
    levels = fabric.levels
    a, b = arrays.switches[s], arrays.switches[d]
    la, lb = levels.get(a), levels.get(b)
    if la is None or lb is None or la == lb:
        return True
    far_sw = a if la > lb else b
    near_sw = b if far_sw == a else a
    for other_link in fabric.links_by_node[far_sw]:
        other = other_link.other(far_sw)
        if other == near_sw and _same_cable(other_link, arrays.links[e]):
            continue
        if levels.get(other) == levels[far_sw] - 1 and fabric.is_switch(other):
            return True
    return False


def _same_cable(one: Link, two: Link) -> bool:
    return canonical_link(one).key == canonical_link(two).key


def _end(arrays: SwitchArrays, s: int) -> int:
    return int(np.searchsorted(arrays.src, s, side="right"))


def _without_edges(arrays: SwitchArrays, edges: tuple[int, int]) -> SwitchArrays:
    drop = sorted(edges)
    src = np.delete(arrays.src, drop)
    n = arrays.num_switches
    return replace(
        arrays,
        src=src,
        dst=np.delete(arrays.dst, drop),
        port=np.delete(arrays.port, drop),
        links=[lk for k, lk in enumerate(arrays.links) if k not in drop],
        up=np.delete(arrays.up, drop),
        starts=np.searchsorted(src, np.arange(n)),
        has_edges=np.bincount(src, minlength=n) > 0,
    )


def _row_values(
    arrays: SwitchArrays, t: int, dist: np.ndarray, ddown: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Switch t's down-only and legal hop counts per column, from its remaining edges."""
    edges = np.arange(int(arrays.starts[t]), _end(arrays, t))
    is_leaf_column = ddown[t] == 0
    down = edges[~arrays.up[edges]]
    up = edges[arrays.up[edges]]
    new_down = (ddown[arrays.dst[down]].min(axis=0) + 1 if down.size
                else np.full(dist.shape[1], INF, dtype=np.int32))
    new_down = np.where(is_leaf_column, 0, np.minimum(new_down, INF))
    via_up = (dist[arrays.dst[up]].min(axis=0) + 1 if up.size
              else np.full(dist.shape[1], INF, dtype=np.int32))
    new_dist = np.minimum(new_down, np.minimum(via_up, INF))
    return new_down, new_dist


def _row_picks(
    arrays: SwitchArrays, t: int, dist: np.ndarray, ddown: np.ndarray, cols: np.ndarray, slot: np.ndarray
) -> np.ndarray:
    """Switch t's output port toward CAs whose leaf columns are `cols` (ECMP by `slot`), as
    `compute_tables` picks it: the (slot mod count)-th valid next hop in port order."""
    edges = np.arange(int(arrays.starts[t]), _end(arrays, t))
    if edges.size == 0 or cols.size == 0:
        return np.full(cols.size, NO_ROUTE, dtype=np.uint8)
    here = dist[t][None, :]
    going_down = (ddown[t] == dist[t])[None, :]
    up = arrays.up[edges][:, None]
    dst = arrays.dst[edges]
    down_ok = ~up & going_down & (ddown[dst] + 1 == here)
    up_ok = up & ~going_down & (dist[dst] + 1 == here)
    valid = (down_ok | up_ok) & (here < INF)
    count = valid.sum(axis=0)
    rank = np.cumsum(valid, axis=0)
    want = slot % np.maximum(count[cols], 1) + 1
    hit = valid[:, cols] & (rank[:, cols] == want[None, :])
    picked = arrays.port[edges][hit.argmax(axis=0)].astype(np.uint8)
    picked[count[cols] == 0] = NO_ROUTE
    return picked


def _ca_slots(ca_leaf: np.ndarray) -> np.ndarray:
    """Each routed CA's position among the CAs of its leaf, in CA order (ECMP spreading)."""
    slot = np.zeros(ca_leaf.size, dtype=np.int64)
    routed = np.flatnonzero(ca_leaf >= 0)
    order = routed[np.argsort(ca_leaf[routed], kind="stable")]
    leaves = ca_leaf[order]
    starts = np.flatnonzero(np.r_[True, leaves[1:] != leaves[:-1]]) if order.size else order
    first = np.repeat(starts, np.diff(np.r_[starts, order.size]))
    slot[order] = np.arange(order.size) - first
    return slot


def _leaf_columns(tables: ForwardingTables) -> np.ndarray:
    """Each CA's leaf column in `hops` (-1 when unattached)."""
    arrays = tables.arrays
    col_of_row = np.full(arrays.num_switches, -1, dtype=np.int64)
    for leaf, col in arrays.leaf_index.items():
        col_of_row[arrays.index[leaf]] = col
    out = np.full(tables.ca_leaf.size, -1, dtype=np.int64)
    routed = tables.ca_leaf >= 0
    out[routed] = col_of_row[tables.ca_leaf[routed]]
    return out
