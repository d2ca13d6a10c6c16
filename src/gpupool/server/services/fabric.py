"""The live fabric (`gpupool up --fabric FILE`): the topology, the state of each link as now known
(failed by an admin or by telemetry, load), the forwarding tables kept up to date as links fail and
heal, the routes of running gangs over them, and the scheduler's FabricView.

Threads: the API changes link state and reads routes under `lock`; the scheduling view (`FabricView`,
changed in place) is touched only by the scheduler loop, which takes the changes queued since its
last cycle (`view_for`), so a placement never sees a link half updated.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.core.fabric.forwarding import NO_ROUTE, ForwardingTables, compute_tables
from gpupool.core.fabric.model import Fabric, Link
from gpupool.core.fabric.parse import parse_topology
from gpupool.core.fabric.reroute import reroute_after_failure
from gpupool.core.fabric.telemetry import PortLoad
from gpupool.core.model import Node
from gpupool.core.scheduling.congestion import CongestionSample
from gpupool.core.scheduling.topology import FabricView, LinkHealth, NodePlace, hosts
from gpupool.core.topology_spec import Tier
from gpupool.errors import InvalidInput, NotFound

Key = tuple[str, int, str, int]


def load_fabric_file(path: Path | str) -> Fabric:
    """An ibnetdiscover output or a `gpupool fabric generate` file; InvalidInput when unreadable."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise InvalidInput(f"Cannot read the fabric file {str(path)!r} ({exc.strerror}); check the path "
                           "(--fabric).") from None
    return parse_topology(text, source=str(path))


def open_live_fabric(path: Path | str, nodes: Sequence[Node]) -> LiveFabric:
    """The live fabric of `gpupool up --fabric FILE`, checked against the pool's nodes (InvalidInput,
    one sentence, when it has fewer hosts than nodes)."""
    live = LiveFabric(load_fabric_file(path), source=str(path))
    live.scheduling_view(nodes)  # maps every node onto a host, or refuses
    live.tables  # noqa: B018  (computed now rather than by the first request)
    return live


@dataclass(frozen=True, slots=True)
class LinkState:
    """One cable as the pool knows it now."""

    link: Link
    failed: bool
    load: float


@dataclass(frozen=True, slots=True)
class Route:
    """A gang's routes: the links its ring of nodes uses, and what that gives it."""

    links: tuple[Key, ...]
    hops: int
    """The most links between two of its nodes (2 under one leaf)."""
    connected: bool
    """False when two of its nodes have no route left between them."""


@dataclass
class LiveFabric:
    """The fabric a running server schedules on (see the module docstring)."""

    base: Fabric
    source: str = ""
    health: LinkHealth = field(default_factory=LinkHealth)
    lock: threading.RLock = field(default_factory=threading.RLock)
    failed: dict[Key, Link] = field(default_factory=dict)
    loads: dict[Key, float] = field(default_factory=dict)
    version: int = 0
    """Bumped on every change of link state (the routes and the scheduling view follow it)."""
    _tables: ForwardingTables | None = None
    _queued: list[tuple[Key, bool | None, float | None, int]] = field(default_factory=list)
    _view: FabricView | None = None
    _view_nodes: tuple[Node, ...] | None = None
    _out: dict[tuple[int, int], int] | None = None
    _current: Fabric | None = None
    _read_view: tuple[tuple[tuple[str, tuple[str, ...]], ...], FabricView] | None = None
    """A view built for readers while the scheduler has none over the same nodes (places only)."""
    congestion_sample: CongestionSample | None = None
    """The latest telemetry's bottleneck loads, for the scheduler's next cycle to judge
    (fabric.migrate_on_congestion; `take_congestion_sample`)."""

    def hand_congestion_sample(self, sample: CongestionSample) -> None:
        """From the telemetry route: the next cycle judges this sample (a newer one replaces it)."""
        with self.lock:
            self.congestion_sample = sample

    def take_congestion_sample(self) -> CongestionSample | None:
        """From the scheduler loop: the sample not yet judged, if any (taken once)."""
        with self.lock:
            sample, self.congestion_sample = self.congestion_sample, None
            return sample

    # ------------------------------------------------------------------ reading

    def summary(self, nodes: int) -> str:
        """'Fabric FILE: 20 switches in 2 levels, 64 hosts for 4 nodes.'"""
        levels = len(set(self.base.levels.values()))
        return (f"Fabric {self.source}: {len(self.base.switches)} switches in {levels} levels, "
                f"{len(hosts(self.base))} hosts for {nodes} nodes.")

    @property
    def current(self) -> Fabric:
        """The fabric routes are computed on: every failed link removed."""
        with self.lock:
            if self._current is None:
                failed = list(self.failed.values())
                self._current = self.base.without_links(failed) if failed else self.base
            return self._current

    def load(self, key: Key) -> float:
        """A cable's last measured load (0..1)."""
        return self.loads.get(key, 0.0)

    @property
    def tables(self) -> ForwardingTables:
        with self.lock:
            if self._tables is None:
                self._tables = compute_tables(self.current)
                self._out = None
            return self._tables

    def find_link(self, ref: str) -> Link:
        """The cable at NODE:PORT (a switch or CA by id, name, GUID or LID, and one of its ports)."""
        node_ref, sep, port_text = ref.strip().rpartition(":")
        if not sep or not port_text.isdigit() or not node_ref:
            raise InvalidInput(f"Expected NODE:PORT such as leaf-01:13 (one end of the cable), got {ref!r}.")
        try:
            node = self.base.find(node_ref)
        except (InvalidInput, NotFound) as exc:
            if any(node_ref in (n.name, n.desc) for n in self.base.nodes.values()):
                raise InvalidInput(exc.message) from None  # a name several nodes share
            raise NotFound(f"No switch or adapter {node_ref!r} in the pool's fabric; `gpupool fabric status` "
                           "lists its cables by NODE:PORT.") from None
        try:
            return self.base.find_link(node, int(port_text))
        except InvalidInput:
            raise NotFound(f"No cable is attached to port {port_text} of {self.base.nodes[node].label}; "
                           "`gpupool fabric status` lists the cables by NODE:PORT.") from None

    def links(self) -> list[LinkState]:
        with self.lock:
            return [LinkState(link, link.key in self.failed, self.loads.get(link.key, link.utilization))
                    for link in self.base.links]

    def scheduling_view(self, nodes: Sequence[Node]) -> FabricView:
        """A FabricView over `nodes` to read places and domains from (never to change): the
        scheduler's when it was built over the same nodes, else one built for the caller."""
        view, built_over = self._view, self._view_nodes
        if view is not None and (built_over is nodes or _shape(built_over) == _shape(nodes)):
            return view
        shape = _shape(nodes)
        kept = self._read_view
        if kept is None or kept[0] != shape:
            kept = self._read_view = (shape, FabricView.from_fabric(self.base, nodes, self.health))
        return kept[1]

    def hcas(self, place: NodePlace | None, node: Node) -> tuple[str, ...]:
        """NCCL_IB_HCA for a pod on `node` (at `place`, from `place_of`): its adapters whose cable to
        their leaf works (device:port), the probed names where the agent found ports, else the fabric's."""
        if place is None:
            return ()
        current = self.current
        usable = [p for p in place.ports if p.ca in current.ca_leaf]
        if node.ib_ports:
            names = {p.hca for p in usable}
            return tuple(sorted({f"{p.hca}:{p.port}" for p in node.ib_ports if p.hca in names}))
        return tuple(sorted({f"{p.hca}:{p.port}" for p in usable}))

    def place_of(self, nodes: Sequence[Node]) -> dict[str, NodePlace]:
        """Each scheduler node's place in the fabric (its host, ports and leaves)."""
        return {p.node: p for p in self.scheduling_view(nodes).places if p is not None}

    # ------------------------------------------------------------------ changing link state

    def fail_link(self, link: Link) -> bool:
        """Mark the cable failed and update the routes (incrementally for a switch-to-switch cable);
        False when it was already failed."""
        with self.lock:
            if link.key in self.failed:
                return False
            tables = self.tables
            before = self.current
            self.failed[link.key] = link
            self._current = None
            self._tables = reroute_after_failure(before, tables, link).tables
            self._changed(link.key, healthy=False)
            return True

    def heal_link(self, link: Link) -> bool:
        """Put a failed cable back (routes recomputed); False when it was not failed."""
        with self.lock:
            if self.failed.pop(link.key, None) is None:
                return False
            self._tables = None  # a full recomputation, on next use
            self._changed(link.key, healthy=True)
            return True

    def apply_loads(self, loads: Mapping[tuple[str, int], PortLoad]) -> list[Link]:
        """Telemetry by (node, port): each link takes its busier end's load; an end that saw
        `link_downed` fails the link (its routes follow). Returns the links that failed now."""
        per_link: dict[Key, list[PortLoad]] = {}
        with self.lock:
            for (node, port), load in loads.items():
                link = self.find_link(f"{node}:{port}")
                per_link.setdefault(link.key, []).append(load)
            downed: list[Link] = []
            for key, seen in per_link.items():
                self.loads[key] = min(1.0, max(p.utilization for p in seen))
                errors = sum(sum(p.errors.values()) for p in seen)
                link = next(lk for lk in self.base.links_by_node[key[0]] if lk.key == key)
                if any(p.errors.get("link_downed", 0) for p in seen) and self.fail_link(link):
                    downed.append(link)
                self._queued.append((key, None, self.loads[key], errors))
            self.version += 1
            return downed

    def _changed(self, key: Key, *, healthy: bool) -> None:
        self._queued.append((key, healthy, None, 0))
        self._out = None
        self._current = None
        self.version += 1

    # ------------------------------------------------------------------ the scheduling view

    def view_for(self, nodes: tuple[Node, ...]) -> FabricView:
        """The scheduler's FabricView over `nodes` (the snapshot's, in its order): built afresh when
        the node list changed (with every known link state), else brought up to date with the link
        changes queued since the last call. Call it from the scheduler loop only."""
        with self.lock:
            queued, self._queued = self._queued, []
            moved = nodes is not self._view_nodes and _shape(nodes) != _shape(self._view_nodes)
            if self._view is None or moved:
                view = FabricView.from_fabric(self.base, nodes, self.health)
                for key in self.failed:
                    view.set_link(key, healthy=False)
                for key, value in self.loads.items():
                    view.set_link(key, utilization=value)
                self._view, self._view_nodes = view, nodes
                return view
            view, self._view_nodes = self._view, nodes
        for key, healthy, load, errors in queued:
            view.set_link(key, healthy=healthy, utilization=load, errors=errors)
        return view

    # ------------------------------------------------------------------ routes of gangs

    def route(self, nodes: Sequence[Node], gang: Sequence[str]) -> Route:
        """The links a gang on `gang` (node names, rank order) uses: its nodes talk in a ring, each
        pair of neighbours over every rail they share (the k-th adapter of one host to the k-th of
        the other)."""
        ring = list(dict.fromkeys(gang))
        if len(ring) < 2:
            return Route((), 0, True)
        places = self.place_of(nodes)
        links: dict[Key, None] = {}
        hops, connected = 0, True
        pairs = list(itertools.pairwise(ring)) + ([(ring[-1], ring[0])] if len(ring) > 2 else [])
        with self.lock:
            tables = self.tables
            for a, b in pairs:
                cas_a, cas_b = _cas(places.get(a)), _cas(places.get(b))
                found = False
                for src, dst in zip(cas_a, cas_b, strict=False):
                    path = self._path(tables, src, dst)
                    if path:
                        found = True
                        hops = max(hops, len(path))
                        links.update(dict.fromkeys(path))
                connected = connected and found
        return Route(tuple(links), hops, connected)

    def _path(self, tables: ForwardingTables, src: str, dst: str) -> list[Key]:
        """The cables from CA `src` to CA `dst` by the forwarding tables; [] when there is no route."""
        if src not in tables.cas or dst not in tables.cas:
            return []
        arrays = tables.arrays
        if self._out is None:
            self._out = {(s, p): d for s, p, d in zip(arrays.src.tolist(), arrays.port.tolist(),
                                                       arrays.dst.tolist(), strict=True)}
        s, d = tables.cas.index(src), tables.cas.index(dst)
        node, last = int(tables.ca_leaf[s]), int(tables.ca_leaf[d])
        if node < 0 or last < 0:
            return []
        current = self.current
        path = [current.ca_leaf[src][2].key]
        for _ in range(arrays.num_switches + 1):
            port = int(tables.ports[node, d])
            if port == NO_ROUTE:
                return []
            path.append(current.find_link(arrays.switches[node], port).key)
            if node == last:
                return path
            nxt = self._out.get((node, port))
            if nxt is None:
                return []
            node = nxt
        return []

    def available_gbps(self, key: Key) -> float:
        """A cable's data rate left by its load; 0 when it failed."""
        if key in self.failed:
            return 0.0
        link = self._link(key)
        return link.data_rate_gbps * max(0.0, 1.0 - self.loads.get(key, link.utilization))

    def _link(self, key: Key) -> Link:
        return next(lk for lk in self.base.links_by_node[key[0]] if lk.key == key)

    def label(self, key: Key) -> str:
        """'leaf-1[13] <-> spine-0[1]' for a cable."""
        a, b = self.base.nodes[key[0]].label, self.base.nodes[key[2]].label
        return f"{a}[{key[1]}] <-> {b}[{key[3]}]"

    def domain(self, nodes: Sequence[Node], gang: Iterable[str]) -> str:
        """The narrowest tier holding every node of the gang: node, leaf, spine or fabric."""
        names = set(gang)
        if len(names) < 2:
            return "node"
        view = self.scheduling_view(nodes)
        index = {name: i for i, name in enumerate(view.node_names)}
        at = [index[n] for n in names if n in index]
        for tier in (Tier.LEAF, Tier.SPINE):
            if len({int(view.domain_of(tier)[i]) for i in at}) == 1:
                return tier.value
        return "fabric"


def _shape(nodes: Sequence[Node] | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """What a FabricView is built from: the nodes' names and port GUIDs, in order."""
    return tuple((n.name, tuple(p.guid for p in n.ib_ports)) for n in nodes or ())


def _cas(place: NodePlace | None) -> list[str]:
    return [] if place is None else [p.ca for p in place.ports]
