"""Up*/down* forwarding tables: for every switch, the output port toward every CA, grouped by leaf."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.fabric.model import Fabric
from gpupool.core.fabric.updown import INF, SwitchArrays, hop_tables, next_hop_mask, switch_arrays

NO_ROUTE = 255  # OpenSM's "no path" LFT value
CHUNK_LEAVES = 64


@dataclass(frozen=True)
class ForwardingTables:
    """ports[s, c]: output port of switch s toward CA c (NO_ROUTE if unreachable); a view of a
    CA-major array, so one CA's column across all switches is contiguous.

    hops[s, l]: legal up*/down* switch-to-switch hops from switch s to leaf column l;
    down_hops[s, l] the same going down only (what an incremental update after a failure reuses).
    """

    arrays: SwitchArrays
    cas: list[str]
    ca_leaf: np.ndarray
    ca_leaf_port: np.ndarray
    ports: np.ndarray
    hops: np.ndarray
    down_hops: np.ndarray | None = None

    @property
    def entries(self) -> int:
        return int(np.count_nonzero(self.ports != NO_ROUTE))

    def port(self, switch: str, ca: str) -> int:
        return int(self.ports[self.arrays.index[switch], self.cas.index(ca)])

    def ca_hops(self, src_ca: int, dst_ca: int) -> int:
        """Links on the route between two CAs (2 for CAs on one leaf); -1 when unreachable."""
        a, b = int(self.ca_leaf[src_ca]), int(self.ca_leaf[dst_ca])
        if a < 0 or b < 0:
            return -1
        if a == b:
            return 2
        column = self.arrays.leaf_index[self.arrays.switches[b]]
        value = int(self.hops[a, column])
        return value + 2 if value < INF else -1


def compute_tables(fabric: Fabric, roots: Sequence[str] | None = None) -> ForwardingTables:
    """Compute every switch's output port toward every CA with up*/down* minimum-hop routing.

    CAs on the same leaf share the route to that leaf; ECMP choices are spread by the CA's position
    on its leaf, so the CAs of one leaf fan out over all equal-cost uplinks.
    """
    arrays = switch_arrays(fabric, roots)
    cas = fabric.cas
    ca_leaf = np.full(len(cas), -1, dtype=np.int64)
    ca_leaf_port = np.zeros(len(cas), dtype=np.int64)
    ca_slot = np.zeros(len(cas), dtype=np.int64)
    per_leaf: dict[int, int] = {}
    for i, ca in enumerate(cas):
        attach = fabric.ca_leaf.get(ca)
        if attach is None or not attach[2].healthy:
            continue
        leaf = arrays.index[attach[0]]
        ca_leaf[i], ca_leaf_port[i] = leaf, attach[1]
        ca_slot[i] = per_leaf.get(leaf, 0)
        per_leaf[leaf] = ca_slot[i] + 1
    leaf_rows = [arrays.index[leaf] for leaf in arrays.leaves]
    hops = np.full((arrays.num_switches, len(leaf_rows)), INF, dtype=np.int16)
    down_hops = hops.copy()
    by_ca = np.full((len(cas), arrays.num_switches), NO_ROUTE, dtype=np.uint8)
    for first in range(0, len(leaf_rows), CHUNK_LEAVES):
        chunk = leaf_rows[first : first + CHUNK_LEAVES]
        dist, ddown = hop_tables(arrays, chunk)
        hops[:, first : first + len(chunk)] = dist
        down_hops[:, first : first + len(chunk)] = ddown
        _fill_chunk(arrays, by_ca, dist, ddown, chunk, ca_leaf, ca_slot)
    routed = ca_leaf >= 0
    by_ca[np.flatnonzero(routed), ca_leaf[routed]] = ca_leaf_port[routed]
    return ForwardingTables(arrays, cas, ca_leaf, ca_leaf_port, by_ca.T, hops, down_hops)


def _fill_chunk(
    arrays: SwitchArrays,
    by_ca: np.ndarray,
    dist: np.ndarray,
    ddown: np.ndarray,
    chunk: list[int],
    ca_leaf: np.ndarray,
    ca_slot: np.ndarray,
) -> None:
    """Fill by_ca's rows for the CAs whose leaf is in `chunk`.

    A CA's port at switch w is the (slot mod count)-th valid next hop toward its leaf column, so the
    rows are built once per (column, slot) pair and each CA's row is then copied whole."""
    valid = next_hop_mask(arrays, dist, ddown)
    n = arrays.num_switches
    if valid.size == 0:
        return
    column_of = np.full(n, -1, dtype=np.int64)
    column_of[np.asarray(chunk, dtype=np.int64)] = np.arange(len(chunk))
    columns = np.where(ca_leaf >= 0, column_of[np.maximum(ca_leaf, 0)], -1)
    targets = np.flatnonzero(columns >= 0)
    if targets.size == 0:
        return
    count, lookup = _candidate_ports(arrays, valid, len(chunk))  # (columns, n), (columns, n, k)
    slots = int(ca_slot[targets].max()) + 1
    choice = np.arange(slots, dtype=np.int32)[None, :, None] % np.maximum(count, 1)[:, None, :]
    flat = (np.arange(len(chunk) * n, dtype=np.int32).reshape(len(chunk), 1, n) * lookup.shape[2]
            + choice)
    rows = lookup.reshape(-1)[flat]  # rows[c, slot, w]
    rows[np.broadcast_to((count == 0)[:, None, :], rows.shape)] = NO_ROUTE
    by_ca[targets] = rows[columns[targets], ca_slot[targets]]


def _candidate_ports(arrays: SwitchArrays, valid: np.ndarray, columns: int) -> tuple[np.ndarray, np.ndarray]:
    """count[l, s] valid next hops of switch s toward column l, and lookup[l, s, k] the k-th one's
    port (in edge order, i.e. by port).

    Edges are sorted by source switch, so a running count of valid edges down each column, less
    the count before the switch's first edge, numbers each switch's valid next hops."""
    n = arrays.num_switches
    degree = np.bincount(arrays.src, minlength=n)
    running = np.cumsum(valid, axis=0, dtype=np.int32)  # (edges, columns)
    before = np.zeros((n, columns), dtype=np.int32)
    has = degree > 0
    first = arrays.starts[has]
    before[has] = running[first] - valid[first]
    count = np.zeros((n, columns), dtype=np.int32)
    count[has] = running[first + degree[has] - 1] - before[has]
    width = max(int(count.max()) if count.size else 0, 1)
    edge, column = np.nonzero(valid)
    source = arrays.src[edge]
    position = running[edge, column] - before[source, column] - 1
    lookup = np.full((columns, n, width), NO_ROUTE, dtype=np.uint8)
    lookup[column, source, position] = arrays.port[edge]
    return np.ascontiguousarray(count.T), lookup


def walk(fabric: Fabric, tables: ForwardingTables, src_ca: str, dst_ca: str) -> list[tuple[str, int]]:
    """Follow the tables from src's leaf: [(switch, out_port), ...] ending at dst's leaf; [] if none."""
    arrays = tables.arrays
    src, dst = tables.cas.index(src_ca), tables.cas.index(dst_ca)
    if tables.ca_leaf[src] < 0 or tables.ca_leaf[dst] < 0:
        return []
    out_link = _out_links(arrays)
    node = int(tables.ca_leaf[src])
    path: list[tuple[str, int]] = []
    for _ in range(arrays.num_switches + 1):
        port = int(tables.ports[node, dst])
        if port == NO_ROUTE:
            return []
        path.append((arrays.switches[node], port))
        if node == tables.ca_leaf[dst]:
            return path
        nxt = out_link.get((node, port))
        if nxt is None:
            return []
        node = nxt
    return []


def _out_links(arrays: SwitchArrays) -> dict[tuple[int, int], int]:
    return {
        (s, p): d
        for s, p, d in zip(arrays.src.tolist(), arrays.port.tolist(), arrays.dst.tolist(), strict=True)
    }


def is_up_down(arrays: SwitchArrays, switch_path: Sequence[str]) -> bool:
    """True when the switch sequence never climbs again after it has started down."""
    key = arrays.rank * arrays.num_switches + np.arange(arrays.num_switches)
    went_down = False
    for a, b in itertools.pairwise(switch_path):
        going_up = key[arrays.index[b]] < key[arrays.index[a]]
        if going_up and went_down:
            return False
        went_down = went_down or not going_up
    return True
