"""The fabric in the scheduling view: each node's HCA ports, leaf domain and spine group, and live link state.

API (node indices are those of the `ClusterState` built from the same node list):
  - `FabricView.from_fabric(fabric, nodes, health=LinkHealth())`: place every scheduler node on a host
    of the fabric (`map_hosts`), group the nodes by tier and index the links a gang's traffic uses.
    Refuses (InvalidInput, one sentence) a fabric with fewer hosts than nodes.
  - `FabricView.from_labels(nodes)`: no fabric known: domains from the node labels
    `topology.gpupool.io/leaf` and `topology.gpupool.io/spine`; a node without them is its own
    domain (so no gang ever shares one: behaviour unchanged). No link state.
  - `topology_for(nodes, fabric=None)`: from_fabric, else from_labels when some node has a topology
    label, else None (what a caller hands `ClusterView.set_topology`).
  - `map_hosts(fabric, nodes)` -> {node name: host name}: see "node to host mapping" below.
  - `domain_of(tier)` -> [node] domain id (leaf or spine group; -1 off the fabric); `domains(tier)`
    -> node index arrays, one per domain; `places[i]` the node's `NodePlace` (ports, leaf switches,
    rails); `hops(a, b)` links between two nodes (0 on one node).
  - Link state, changed in place (no rebuild): `set_link(key, healthy=, utilization=, errors=,
    data_rate_gbps=)` (a degraded link retrained to a lower rate),
    `apply_loads(loads)` (telemetry `PortLoad`s by (node, port)); `LinkHealth` sets the thresholds:
    a link whose errors grow, or whose load reaches `load_high`, is penalised (its bandwidth counts
    at `penalty_factor`) until its load falls to `load_low` and `clean_samples` samples in a row show
    no new errors (hysteresis, so placements do not flap). A failed link carries nothing.
  - Gangs on the fabric: `add_gang(id, nodes, weight_gpu_s)` / `remove_gang(id)` (idempotent by id),
    `clear_gangs()`;
    `share_gbps(nodes)` the bottleneck bandwidth one more gang on those nodes would get (bandwidth
    shared with the gangs already on each link pool), `sharing(nodes)` per pool it would use: the
    bandwidth, the gangs on it and their GPU-seconds at stake; `reachable(nodes)` whether no part
    of it is cut off (a dead pool).
  - `TopologyContext(view, default, estimate_s, comm_ratio)`: what a placement policy is bound to
    (`PlacementPolicy.bind_topology`); `spec_for(workload)` is the constraint that applies to it,
    `comm_ratio(workload)` the scheduler's estimate of its communication ratio (None: unknown).
  - `ref_gbps`: the as-built rate of the fastest HCA link, what a packed flow gets on idle links
    (the bandwidth a job's communication ratio is stated at; 0 when no fabric is known).

Traffic model (documented in docs/network-aware.md): a gang's pods talk in a ring ordered by leaf,
so a gang on k nodes puts one flow on each of its nodes' access links, one flow on the uplinks of
each leaf domain it spans when it spans more than one, and one on the uplinks of each spine group
when it spans more than one. Links are pooled per owner (a node's HCA links, a leaf domain's
uplinks, a spine group's uplinks; ECMP spreads flows over them); a flow's share is the pool's
available bandwidth over its flows. Node to host mapping: CAs are grouped into hosts by the first
word of their description ("node00017 HCA-1" -> node00017); a scheduler node takes the host of its
own name, else the host holding one of its ports' GUIDs, else the next unused host, nodes and hosts
both taken in natural name order (node2 before node10). One host per node.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from gpupool.core.fabric.model import Fabric, Link
from gpupool.core.fabric.telemetry import PortLoad
from gpupool.core.fabric.updown import INF, hop_tables, switch_arrays
from gpupool.core.model import Node, Workload
from gpupool.core.topology_spec import Tier, TopologySpec, effective_spec
from gpupool.errors import InvalidInput

LEAF_LABEL = "topology.gpupool.io/leaf"
SPINE_LABEL = "topology.gpupool.io/spine"

UNKNOWN_RUN_S = 3600.0
"""The run time a gang without an estimate is assumed to have left (to weigh what its links cost it)."""

ACCESS, LEAF_UP, SPINE_UP = 0, 1, 2
"""What a link carries for the scheduler: a node's HCA link, a leaf domain's or a spine group's uplink."""


@dataclass(frozen=True, slots=True)
class LinkHealth:
    """When a link is penalised (see the module docstring)."""

    load_high: float = 0.8
    load_low: float = 0.6
    clean_samples: int = 3
    penalty_factor: float = 0.25

    def __post_init__(self) -> None:
        if not 0.0 <= self.load_low <= self.load_high <= 1.0:
            raise InvalidInput("Link load thresholds need 0 <= load_low <= load_high <= 1.")


@dataclass(frozen=True, slots=True)
class PortPlace:
    """One HCA port of a node as the fabric sees it."""

    ca: str
    hca: str
    port: int
    leaf: str
    rail: int = 0


@dataclass(frozen=True, slots=True)
class NodePlace:
    """Where a node sits: the fabric host it was mapped to, its ports, and their leaf switches."""

    node: str
    host: str
    ports: tuple[PortPlace, ...] = ()

    @property
    def leaves(self) -> tuple[str, ...]:
        return tuple(sorted({p.leaf for p in self.ports}))

    @property
    def rails(self) -> tuple[int, ...]:
        return tuple(sorted({p.rail for p in self.ports}))


@dataclass(slots=True)
class _Gang:
    nodes: tuple[int, ...]
    leaves: tuple[int, ...]
    spines: tuple[int, ...]
    weight_gpu_s: float


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders embedded numbers by value (node2 before node10)."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text) if part)


def host_of(fabric: Fabric, ca: str) -> str:
    """The host a CA belongs to: the first word of its description (else its name or id)."""
    node = fabric.nodes[ca]
    words = node.desc.split()
    return words[0] if words else node.label


def hosts(fabric: Fabric) -> dict[str, list[str]]:
    """Host name -> its CAs attached to a switch (natural order of hosts, then of CAs)."""
    found: dict[str, list[str]] = {}
    for ca in fabric.cas:
        if ca in fabric.ca_leaf:
            found.setdefault(host_of(fabric, ca), []).append(ca)
    return {h: sorted(found[h], key=lambda c: natural_key(fabric.nodes[c].desc or c))
            for h in sorted(found, key=natural_key)}


def map_hosts(fabric: Fabric, nodes: Sequence[Node]) -> dict[str, str]:
    """Scheduler node name -> fabric host name, one host per node (see the module docstring)."""
    by_host = hosts(fabric)
    if len(by_host) < len(nodes):
        raise InvalidInput(
            f"The fabric has {len(by_host)} hosts for {len(nodes)} nodes; give a fabric with at least "
            "one host per node (gpupool fabric generate --ports/--pods makes a larger one)."
        )
    host_of_ca = {ca: host for host, cas in by_host.items() for ca in cas}
    guid_host: dict[int, str] = {}
    for ca, host in host_of_ca.items():
        guid = fabric.nodes[ca].guid
        if guid is not None:
            guid_host[guid] = host
    for (owner, _), port_guid in fabric.port_guids.items():
        if owner in host_of_ca:
            guid_host[port_guid] = host_of_ca[owner]
    taken: set[str] = set()
    mapping: dict[str, str] = {}
    for node in nodes:
        found = node.name if node.name in by_host else _by_guid(node, guid_host)
        if found is not None and found not in taken:
            mapping[node.name] = found
            taken.add(found)
    free = iter(h for h in by_host if h not in taken)
    for node in sorted((n for n in nodes if n.name not in mapping), key=lambda n: natural_key(n.name)):
        mapping[node.name] = next(free)
    return mapping


def _by_guid(node: Node, guid_host: Mapping[int, str]) -> str | None:
    for port in node.ib_ports:
        text = port.guid.lower().removeprefix("0x")
        try:
            host = guid_host.get(int(text, 16)) if text else None
        except ValueError:
            host = None
        if host is not None:
            return host
    return None


@dataclass(slots=True, eq=False)
class FabricView:
    """The nodes' places in the fabric, their domains per tier and the link state gangs share."""

    node_names: tuple[str, ...]
    places: tuple[NodePlace | None, ...]
    leaf_id: np.ndarray
    spine_id: np.ndarray
    leaf_names: list[str]
    spine_names: list[str]
    leaf_hops: np.ndarray
    """[leaf, leaf] links between nodes of two leaf domains (2 within one)."""
    health: LinkHealth = field(default_factory=LinkHealth)
    link_index: dict[tuple[str, int, str, int], int] = field(default_factory=dict)
    port_links: dict[tuple[str, int], int] = field(default_factory=dict)
    cap_gbps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    healthy: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    load: np.ndarray = field(default_factory=lambda: np.zeros(0))
    penalised: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    clean: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    owner_kind: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    owner_id: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    avail: list[np.ndarray] = field(default_factory=list)
    """[kind][owner] available Gb/s of each link pool (a node's HCA links, a leaf's or spine group's
    uplinks); inf where the pool has no links of that kind (a spine group at the top)."""
    flows: list[np.ndarray] = field(default_factory=list)
    stake: list[np.ndarray] = field(default_factory=list)
    owner_links: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    gangs: dict[str, _Gang] = field(default_factory=dict)
    version: int = 0
    """Bumped on every change of link state or of the gangs on the fabric."""
    fabric_known: bool = True
    ref_gbps: float = 0.0
    """The as-built rate of the fastest HCA link (0: no fabric known)."""

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_fabric(
        cls, fabric: Fabric, nodes: Sequence[Node], health: LinkHealth | None = None
    ) -> FabricView:
        mapping = map_hosts(fabric, nodes)
        by_host = hosts(fabric)
        leaf_sw = fabric.ca_leaf
        rail_of = _rails(by_host)
        places: list[NodePlace] = []
        for node in nodes:
            host = mapping[node.name]
            ports = tuple(
                PortPlace(ca, _hca(fabric, ca), leaf_sw[ca][2].port_on(ca), leaf_sw[ca][0],
                          rail_of.get(ca, 0))
                for ca in by_host[host]
            )
            places.append(NodePlace(node.name, host, ports))
        domain_keys = list(dict.fromkeys(p.leaves for p in places))  # numbered in node order
        leaf_of_key = {k: i for i, k in enumerate(domain_keys)}
        leaf_id = np.array([leaf_of_key[p.leaves] for p in places], dtype=np.int64)
        groups = _spine_groups(fabric, domain_keys)
        spine_id = np.array([groups[leaf_of_key[p.leaves]] for p in places], dtype=np.int64)
        view = cls(
            node_names=tuple(n.name for n in nodes),
            places=tuple(places),
            leaf_id=leaf_id,
            spine_id=spine_id,
            leaf_names=["+".join(fabric.nodes[s].label for s in k) for k in domain_keys],
            spine_names=[f"spine-group-{g}" for g in range(max(groups, default=-1) + 1)],
            leaf_hops=_leaf_hops(fabric, domain_keys),
            health=health or LinkHealth(),
        )
        view._index_links(fabric, places, domain_keys, groups)
        return view

    @classmethod
    def from_labels(cls, nodes: Sequence[Node]) -> FabricView:
        leaf_keys = [n.labels.get(LEAF_LABEL) or f"\0{n.name}" for n in nodes]
        spine_keys = [n.labels.get(SPINE_LABEL) or f"\0{key}"
                      for n, key in zip(nodes, leaf_keys, strict=True)]
        leaves = sorted(set(leaf_keys), key=natural_key)
        spines = sorted(set(spine_keys), key=natural_key)
        leaf_index = {k: i for i, k in enumerate(leaves)}
        spine_index = {k: i for i, k in enumerate(spines)}
        leaf_id = np.array([leaf_index[k] for k in leaf_keys], dtype=np.int64)
        spine_id = np.array([spine_index[k] for k in spine_keys], dtype=np.int64)
        spine_of_leaf = np.zeros(len(leaves), dtype=np.int64)
        spine_of_leaf[leaf_id] = spine_id
        same_spine = spine_of_leaf[:, None] == spine_of_leaf[None, :]
        hops = np.where(same_spine, 4, 6).astype(np.int64)
        np.fill_diagonal(hops, 2)
        view = cls(
            node_names=tuple(n.name for n in nodes),
            places=tuple(None for _ in nodes),
            leaf_id=leaf_id,
            spine_id=spine_id,
            leaf_names=[k.lstrip("\0") for k in leaves],
            spine_names=[k.lstrip("\0") for k in spines],
            leaf_hops=hops,
            fabric_known=False,
        )
        view.avail = [np.full(len(nodes), np.inf), np.full(len(leaves), np.inf), np.full(len(spines), np.inf)]
        view.flows = [np.zeros(len(a), dtype=np.int64) for a in view.avail]
        view.stake = [np.zeros(len(a)) for a in view.avail]
        return view

    def _index_links(
        self, fabric: Fabric, places: Sequence[NodePlace], domain_keys: Sequence[tuple[str, ...]],
        groups: Sequence[int],
    ) -> None:
        ca_node = {port.ca: i for i, place in enumerate(places) for port in place.ports}
        leaf_domains: dict[str, list[int]] = {}
        for d, key in enumerate(domain_keys):
            for sw in key:
                leaf_domains.setdefault(sw, []).append(d)
        levels = fabric.levels
        group_of_l1: dict[str, set[int]] = {}
        for sw, ds in leaf_domains.items():
            for link in fabric.links_by_node[sw]:
                if levels.get(link.other(sw)) == 1:
                    group_of_l1.setdefault(link.other(sw), set()).update(groups[d] for d in ds)
        rows: list[tuple[Link, int, int]] = []
        for link in fabric.links:
            if link.a == link.b:
                continue
            for ca in (link.a, link.b):
                if ca in ca_node:
                    rows.append((link, ACCESS, ca_node[ca]))
                    break
            else:
                la, lb = levels.get(link.a), levels.get(link.b)
                if la is None or lb is None or abs(la - lb) != 1:
                    continue
                low = link.a if la < lb else link.b
                if min(la, lb) == 0:
                    rows.extend((link, LEAF_UP, d) for d in leaf_domains.get(low, []))
                elif min(la, lb) == 1:
                    rows.extend((link, SPINE_UP, g) for g in sorted(group_of_l1.get(low, ())))
        count = len(rows)
        self.cap_gbps = np.array([lk.data_rate_gbps for lk, _, _ in rows], dtype=np.float64)
        self.healthy = np.array([lk.healthy for lk, _, _ in rows], dtype=bool)
        self.load = np.array([lk.utilization for lk, _, _ in rows], dtype=np.float64)
        self.penalised = np.zeros(count, dtype=bool)
        self.clean = np.full(count, self.health.clean_samples, dtype=np.int64)
        self.owner_kind = np.array([k for _, k, _ in rows], dtype=np.int64)
        self.owner_id = np.array([o for _, _, o in rows], dtype=np.int64)
        self.ref_gbps = float(self.cap_gbps[self.owner_kind == ACCESS].max(initial=0.0))
        for k, (link, _, _) in enumerate(rows):
            self.link_index.setdefault(link.key, k)
            self.port_links.setdefault((link.a, link.a_port), k)
            self.port_links.setdefault((link.b, link.b_port), k)
        sizes = (len(places), len(domain_keys), max(groups, default=-1) + 1)
        self.flows = [np.zeros(n, dtype=np.int64) for n in sizes]
        self.stake = [np.zeros(n) for n in sizes]
        self._recompute_avail(sizes)

    def _recompute_avail(self, sizes: Sequence[int]) -> None:
        self.avail = self._pools(self._link_avail(np.arange(len(self.cap_gbps))), sizes)

    def _pools(self, per_link: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
        pools = []
        for kind, n in enumerate(sizes):
            sel = self.owner_kind == kind
            pool = np.bincount(self.owner_id[sel], weights=per_link[sel], minlength=n)[:n]
            has = np.bincount(self.owner_id[sel], minlength=n)[:n] > 0
            pools.append(np.where(has, pool, np.inf if kind == SPINE_UP else 0.0))
        return pools

    @contextmanager
    def as_built(self) -> Iterator[None]:
        """While open, every link is up, unloaded and unpenalised: what "could this gang ever fit the
        pool" asks, since failed links are repaired and load passes."""
        saved = self.avail
        self.avail = self._pools(np.asarray(self.cap_gbps, dtype=float), [len(f) for f in self.flows])
        try:
            yield
        finally:
            self.avail = saved

    def _link_avail(self, k: np.ndarray) -> np.ndarray:
        factor = np.where(self.penalised[k], self.health.penalty_factor, 1.0)
        return np.where(self.healthy[k], self.cap_gbps[k] * np.maximum(0.0, 1.0 - self.load[k]) * factor, 0.0)

    # ------------------------------------------------------------------ domains

    def domain_of(self, tier: Tier) -> np.ndarray:
        return self.leaf_id if tier is Tier.LEAF else self.spine_id

    def domains(self, tier: Tier) -> list[np.ndarray]:
        """Node indices of each domain of the tier (by domain id)."""
        ids = self.domain_of(tier)
        order = np.argsort(ids, kind="stable")
        bounds = np.searchsorted(ids[order], np.arange(int(ids.max(initial=-1)) + 2))
        return [order[bounds[d]:bounds[d + 1]] for d in range(len(bounds) - 1)]

    def hops(self, a: int, b: int) -> int:
        if a == b:
            return 0
        return int(self.leaf_hops[self.leaf_id[a], self.leaf_id[b]])

    def max_hops(self, nodes: Iterable[int]) -> int:
        distinct = sorted(set(nodes))
        if len(distinct) < 2:
            return 0
        leaves = np.unique(self.leaf_id[distinct])
        return int(self.leaf_hops[np.ix_(leaves, leaves)].max())

    # ------------------------------------------------------------------ link state

    def set_link(
        self, key: tuple[str, int, str, int], *, healthy: bool | None = None,
        utilization: float | None = None, errors: int = 0, data_rate_gbps: float | None = None,
    ) -> bool:
        """Update one link (by `Link.key`, either end first): its health, its load (0..1), the errors
        counted since the last sample, and its data rate when it retrained to another width or speed
        (degraded). False when the view does not use the link."""
        k = self.link_index.get(key)
        if k is None:
            k = self.link_index.get((key[2], key[3], key[0], key[1]))
        if k is None:
            return False
        if healthy is not None:
            self.healthy[k] = healthy
        if data_rate_gbps is not None:
            self.cap_gbps[k] = max(0.0, data_rate_gbps)
        if utilization is not None:
            self.load[k] = min(1.0, max(0.0, utilization))
        self._hysteresis(k, errors)
        self._refresh_owner(k)
        self.version += 1
        return True

    def _hysteresis(self, k: int, errors: int) -> None:
        """One sample of link k: penalised from errors or high load until low load and clean samples."""
        health, load = self.health, float(self.load[k])
        self.clean[k] = 0 if errors > 0 else self.clean[k] + 1
        if errors > 0 or load >= health.load_high:
            self.penalised[k] = True
        elif self.penalised[k] and load <= health.load_low and self.clean[k] >= health.clean_samples:
            self.penalised[k] = False

    def _refresh_owner(self, k: int) -> None:
        kind, owner = int(self.owner_kind[k]), int(self.owner_id[k])
        sel = self.owner_links.get((kind, owner))
        if sel is None:
            sel = self.owner_links[(kind, owner)] = np.flatnonzero(
                (self.owner_kind == kind) & (self.owner_id == owner))
        self.avail[kind][owner] = float(self._link_avail(sel).sum())

    def apply_loads(self, loads: Mapping[tuple[str, int], PortLoad]) -> int:
        """Telemetry: each link takes the load of its busier end and fails when an end reports
        `link_downed`; error counters feed the hysteresis. Returns how many links changed."""
        per_link: dict[int, list[PortLoad]] = {}
        for end, load in loads.items():
            k = self.port_links.get(end)
            if k is not None:
                per_link.setdefault(k, []).append(load)
        for k, seen in per_link.items():
            errors = sum(sum(p.errors.values()) for p in seen)
            downed = any(p.errors.get("link_downed", 0) for p in seen)
            self.load[k] = min(1.0, max(p.utilization for p in seen))
            if downed:
                self.healthy[k] = False
            self._hysteresis(k, errors)
            self._refresh_owner(k)
        if per_link:
            self.version += 1
        return len(per_link)

    def link_state(self, key: tuple[str, int, str, int]) -> tuple[bool, float, bool] | None:
        """(healthy, load, penalised) of a link the view uses, else None."""
        k = self.link_index.get(key)
        if k is None:
            return None
        return bool(self.healthy[k]), float(self.load[k]), bool(self.penalised[k])

    # ------------------------------------------------------------------ gangs on links

    def _span(self, nodes: Iterable[int]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        distinct = tuple(sorted(set(nodes)))
        if len(distinct) < 2:
            return distinct, (), ()
        leaves = tuple(sorted(set(self.leaf_id[list(distinct)].tolist())))
        spines = tuple(sorted(set(self.spine_id[list(distinct)].tolist())))
        return distinct, leaves if len(leaves) > 1 else (), spines if len(spines) > 1 else ()

    def add_gang(self, gang_id: str, nodes: Iterable[int], weight_gpu_s: float = 0.0) -> None:
        """A gang now runs on `nodes`; one on a single node puts nothing on the fabric."""
        if gang_id in self.gangs:
            return
        distinct, leaves, spines = self._span(nodes)
        if len(distinct) < 2:
            return
        self.gangs[gang_id] = _Gang(distinct, leaves, spines, weight_gpu_s)
        self._count(self.gangs[gang_id], 1)

    def clear_gangs(self) -> None:
        """Take every gang off the fabric (a view built afresh puts its running gangs back)."""
        for kind in range(len(self.flows)):
            self.flows[kind][:] = 0
            self.stake[kind][:] = 0.0
        self.gangs.clear()
        self.version += 1

    def remove_gang(self, gang_id: str) -> None:
        gang = self.gangs.pop(gang_id, None)
        if gang is not None:
            self._count(gang, -1)

    def _count(self, gang: _Gang, sign: int) -> None:
        for kind, owners in ((ACCESS, gang.nodes), (LEAF_UP, gang.leaves), (SPINE_UP, gang.spines)):
            if owners:
                at = np.asarray(owners, dtype=np.int64)
                self.flows[kind][at] += sign
                self.stake[kind][at] += sign * gang.weight_gpu_s
        self.version += 1

    def reachable(self, nodes: Iterable[int]) -> bool:
        """Whether every part of a placement can talk to the others (no pool it needs is dead)."""
        distinct, leaves, spines = self._span(nodes)
        if len(distinct) < 2:
            return True
        for kind, owners in ((ACCESS, distinct), (LEAF_UP, leaves), (SPINE_UP, spines)):
            if owners and (self.avail[kind][list(owners)] <= 0).any():
                return False
        return True

    def connected_mask(self) -> np.ndarray:
        """[node] True where the node's own links and its leaf's and spine group's uplinks are not all
        dead: any set of such nodes can reach one another."""
        ok = self.avail[ACCESS] > 0
        for kind, ids in ((LEAF_UP, self.leaf_id), (SPINE_UP, self.spine_id)):
            pools = self.avail[kind]
            inside = (ids >= 0) & (ids < len(pools))
            alive = np.ones(len(ids), dtype=bool)
            alive[inside] = pools[ids[inside]] > 0
            ok &= alive
        return ok

    def share_gbps(self, nodes: Iterable[int], joining: bool = True) -> float:
        """Bottleneck Gb/s of a gang on `nodes` (one more flow per pool when `joining`); inf on one node."""
        distinct, leaves, spines = self._span(nodes)
        if len(distinct) < 2:
            return math.inf
        extra = 1 if joining else 0
        best = math.inf
        for kind, owners in ((ACCESS, distinct), (LEAF_UP, leaves), (SPINE_UP, spines)):
            if owners:
                at = list(owners)
                share = self.avail[kind][at] / np.maximum(self.flows[kind][at] + extra, 1)
                best = min(best, float(share.min()))
        return best

    def sharing(self, nodes: Iterable[int]) -> list[tuple[float, int, float]]:
        """For each link pool a gang on `nodes` would use: (available Gb/s, gangs already on it,
        their GPU-seconds at stake)."""
        distinct, leaves, spines = self._span(nodes)
        if len(distinct) < 2:
            return []
        out: list[tuple[float, int, float]] = []
        for kind, owners in ((ACCESS, distinct), (LEAF_UP, leaves), (SPINE_UP, spines)):
            for o in owners:
                out.append((float(self.avail[kind][o]), int(self.flows[kind][o]), float(self.stake[kind][o])))
        return out


def topology_for(nodes: Sequence[Node], fabric: Fabric | None = None) -> FabricView | None:
    """The view's fabric: from `fabric` when given, else from the nodes' topology labels when any
    node has one, else None (no fabric known: every node its own domain, placement as before)."""
    if fabric is not None:
        return FabricView.from_fabric(fabric, nodes)
    if any(LEAF_LABEL in n.labels or SPINE_LABEL in n.labels for n in nodes):
        return FabricView.from_labels(nodes)
    return None


def _no_estimate(workload: Workload) -> float | None:
    return None


def _stated_ratio(workload: Workload) -> float | None:
    """The ratio the gang's user stated (`--topology comm=R`); None: unknown, the policy's uniform
    assumption applies."""
    return workload.topology.comm_ratio if workload.topology is not None else None


@dataclass(frozen=True, slots=True)
class TopologyContext:
    """What a placement policy reads about the network (`PlacementPolicy.bind_topology`): the fabric
    view, the pool's default constraint for multi-pod gangs, the scheduler's runtime estimate
    (the user's or the history's remaining estimate, never a job's real duration) and its estimate
    of a job's communication ratio (`comm_cost.CommModel.ratio` at `view.ref_gbps`; None: unknown,
    the scheduler knows hop counts only; never the replay's truth itself)."""

    view: FabricView
    default: TopologySpec | None = None
    estimate_s: Callable[[Workload], float | None] = _no_estimate
    comm_ratio: Callable[[Workload], float | None] = _stated_ratio

    def spec_for(self, workload: Workload) -> TopologySpec | None:
        """The constraint that applies to `workload` (None: unconstrained)."""
        fractional = any(p.is_fractional for p in workload.pods)
        return effective_spec(workload.topology, self.default, len(workload.pods), fractional)


def _hca(fabric: Fabric, ca: str) -> str:
    words = fabric.nodes[ca].desc.split()
    return words[1] if len(words) > 1 else fabric.nodes[ca].label


def _rails(by_host: Mapping[str, list[str]]) -> dict[str, int]:
    """A host's k-th CA is on rail k when hosts have several CAs (rail-optimised); else rail 0."""
    return {ca: r for cas in by_host.values() if len(cas) > 1 for r, ca in enumerate(cas)}


def _spine_groups(fabric: Fabric, domain_keys: Sequence[tuple[str, ...]]) -> list[int]:
    """Group id of each leaf domain: domains whose leaves share a level-1 switch are one group."""
    parent = list(range(len(domain_keys)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    owner: dict[str, int] = {}
    levels = fabric.levels
    for d, key in enumerate(domain_keys):
        for sw in key:
            for link in fabric.links_by_node[sw]:
                up = link.other(sw)
                if levels.get(up) == 1:
                    if up in owner:
                        parent[find(d)] = find(owner[up])
                    else:
                        owner[up] = d
    roots = [find(d) for d in range(len(domain_keys))]
    ids: dict[int, int] = {}
    return [ids.setdefault(r, len(ids)) for r in roots]


def _leaf_hops(fabric: Fabric, domain_keys: Sequence[tuple[str, ...]]) -> np.ndarray:
    """[domain, domain] links between nodes of two leaf domains, by up*/down* minimum hops."""
    n = len(domain_keys)
    hops = np.full((n, n), 2, dtype=np.int64)
    if n < 2:
        return hops
    arrays = switch_arrays(fabric)
    firsts = [key[0] for key in domain_keys]
    rows = [arrays.index[sw] for sw in firsts]
    dist, _ = hop_tables(arrays, rows)
    between = dist[rows, :].astype(np.int64)  # [from leaf, to leaf column]
    hops = np.where(between >= INF, 2 * n + 2, between + 2)
    np.fill_diagonal(hops, 2)
    return np.asarray(hops, dtype=np.int64)
