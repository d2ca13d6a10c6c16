"""The fabric model: switches, CAs and cabled links, with fat-tree levels and degraded-link detection."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from typing import TYPE_CHECKING

from gpupool.core.fabric.rates import (
    SPEED_ORDER,
    LinkSpeed,
    data_rate_gbps,
    format_width_speed,
    signal_rate_gbps,
)
from gpupool.errors import InvalidInput

if TYPE_CHECKING:
    import networkx as nx

# Port-to-port forwarding latency of one switch hop; cut-through IB switches sit around 100-130 ns.
DEFAULT_SWITCH_LATENCY_NS = 100.0
# Propagation over a short copper/optical cable (~5 ns per metre, ~1 m).
DEFAULT_CABLE_LATENCY_NS = 5.0


class NodeKind(StrEnum):
    SWITCH = "switch"
    CA = "ca"
    ROUTER = "router"


@dataclass(frozen=True, slots=True)
class FabricNode:
    """One IB node: `id` is the quoted name in the topology file ("S-0008f1...", "Hca1")."""

    id: str
    kind: NodeKind
    num_ports: int
    guid: int | None = None
    desc: str = ""
    lid: int | None = None
    name: str = ""

    @property
    def label(self) -> str:
        """The name people see: node-name-map name, else the file's id."""
        return self.name or self.id


@dataclass(frozen=True, slots=True)
class Link:
    """A cable between (a, a_port) and (b, b_port); a == b for a switch port looped to itself."""

    a: str
    a_port: int
    b: str
    b_port: int
    width: int = 4
    speed: LinkSpeed = LinkSpeed.SDR
    healthy: bool = True
    utilization: float = 0.0

    @property
    def key(self) -> tuple[str, int, str, int]:
        return (self.a, self.a_port, self.b, self.b_port)

    @property
    def rate_gbps(self) -> float:
        return signal_rate_gbps(self.width, self.speed)

    @property
    def data_rate_gbps(self) -> float:
        return data_rate_gbps(self.width, self.speed)

    @property
    def available_gbps(self) -> float:
        """Data rate left after measured load; zero for a sick link."""
        if not self.healthy:
            return 0.0
        return self.data_rate_gbps * max(0.0, 1.0 - self.utilization)

    @property
    def width_speed(self) -> str:
        return format_width_speed(self.width, self.speed)

    def other(self, node: str) -> str:
        return self.b if node == self.a else self.a

    def port_on(self, node: str) -> int:
        return self.a_port if node == self.a else self.b_port


def canonical_link(link: Link) -> Link:
    """Order the two ends so the same cable read from either side compares equal."""
    if link.b < link.a or (link.b == link.a and link.b_port < link.a_port):
        return replace(link, a=link.b, a_port=link.b_port, b=link.a, b_port=link.a_port)
    return link


@dataclass(frozen=True)
class Fabric:
    """An immutable IB fabric. Build it with `Fabric.build`, which de-duplicates links."""

    nodes: dict[str, FabricNode]
    links: tuple[Link, ...]
    port_guids: dict[tuple[str, int], int] = field(default_factory=dict)
    port_lids: dict[tuple[str, int], int] = field(default_factory=dict)
    lmc: dict[str, int] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        nodes: Iterable[FabricNode],
        links: Iterable[Link],
        port_guids: dict[tuple[str, int], int] | None = None,
        port_lids: dict[tuple[str, int], int] | None = None,
        lmc: dict[str, int] | None = None,
    ) -> Fabric:
        node_map = {node.id: node for node in nodes}
        seen: dict[tuple[str, int, str, int], Link] = {}
        for link in links:
            if link.a not in node_map or link.b not in node_map:
                missing = link.a if link.a not in node_map else link.b
                raise InvalidInput(f"Link {link.width_speed} names unknown node {missing!r}.")
            canon = canonical_link(link)
            prior = seen.get(canon.key)
            seen[canon.key] = canon if prior is None else _slower(prior, canon)
        return cls(
            nodes=node_map,
            links=tuple(seen[key] for key in sorted(seen)),
            port_guids=dict(port_guids or {}),
            port_lids=dict(port_lids or {}),
            lmc=dict(lmc or {}),
        )

    # ---- basic views -------------------------------------------------------------------------
    @cached_property
    def switches(self) -> list[str]:
        return sorted(n.id for n in self.nodes.values() if n.kind is NodeKind.SWITCH)

    @cached_property
    def cas(self) -> list[str]:
        return sorted(n.id for n in self.nodes.values() if n.kind is not NodeKind.SWITCH)

    @cached_property
    def links_by_node(self) -> dict[str, list[Link]]:
        table: dict[str, list[Link]] = {node: [] for node in self.nodes}
        for link in self.links:
            table[link.a].append(link)
            if link.b != link.a:
                table[link.b].append(link)
        return table

    def is_switch(self, node: str) -> bool:
        return self.nodes[node].kind is NodeKind.SWITCH

    @cached_property
    def ca_leaf(self) -> dict[str, tuple[str, int, Link]]:
        """CA -> (switch, switch port, link) for each CA's first cabled port to a switch."""
        out: dict[str, tuple[str, int, Link]] = {}
        for ca in self.cas:
            for link in sorted(self.links_by_node[ca], key=lambda lk: lk.port_on(ca)):
                other = link.other(ca)
                if other != ca and self.is_switch(other):
                    out[ca] = (other, link.port_on(other), link)
                    break
        return out

    def find(self, ref: str) -> str:
        """Resolve a node by id, mapped name, description, GUID (hex) or LID; NotFound otherwise."""
        return _resolve(self, ref)

    # ---- structure ---------------------------------------------------------------------------
    @cached_property
    def levels(self) -> dict[str, int]:
        """Switch -> level: CA-attached switches are 0 (leaves), then BFS distance from the leaves."""
        leaves = sorted({sw for sw, _, _ in self.ca_leaf.values()})
        level = dict.fromkeys(leaves, 0)
        queue = deque(leaves)
        while queue:
            node = queue.popleft()
            for link in self.links_by_node[node]:
                other = link.other(node)
                if other not in level and self.is_switch(other):
                    level[other] = level[node] + 1
                    queue.append(other)
        return level

    @cached_property
    def roots(self) -> list[str]:
        """Switches farthest from the CAs (OpenSM ftree's roots)."""
        if not self.levels:
            return []
        top = max(self.levels.values())
        return sorted(sw for sw, lvl in self.levels.items() if lvl == top)

    @cached_property
    def norm(self) -> tuple[int, LinkSpeed] | None:
        """The fabric's usual width and speed: the most common of each among its links."""
        if not self.links:
            return None
        widths = Counter(link.width for link in self.links)
        speeds = Counter(link.speed for link in self.links)
        return widths.most_common(1)[0][0], speeds.most_common(1)[0][0]

    @cached_property
    def degraded_links(self) -> list[Link]:
        """Links whose width or lane speed is below the fabric's norm."""
        if self.norm is None:
            return []
        width, speed = self.norm
        return [
            link
            for link in self.links
            if link.width < width or SPEED_ORDER[link.speed] < SPEED_ORDER[speed]
        ]

    def graph(self) -> nx.MultiGraph:
        """A networkx multigraph: node attrs kind/desc/level; edge key = (a_port, b_port)."""
        import networkx as nx

        graph = nx.MultiGraph()
        for node in self.nodes.values():
            graph.add_node(node.id, kind=node.kind.value, desc=node.desc, level=self.levels.get(node.id))
        for link in self.links:
            graph.add_edge(
                link.a,
                link.b,
                key=(link.a_port, link.b_port),
                width=link.width,
                speed=link.speed.value,
                rate_gbps=link.rate_gbps,
                data_rate_gbps=link.data_rate_gbps,
                capacity=link.available_gbps,
            )
        return graph

    # ---- edits -------------------------------------------------------------------------------
    def find_link(self, node: str, port: int) -> Link:
        for link in self.links_by_node.get(node, []):
            if (link.a == node and link.a_port == port) or (link.b == node and link.b_port == port):
                return link
        raise InvalidInput(f"No cable is attached to port {port} of {self.nodes[node].label}; "
                       "check the port number with `gpupool fabric show`.")

    def without_links(self, removed: Sequence[Link]) -> Fabric:
        keys = {link.key for link in removed}
        return replace(self, links=tuple(lk for lk in self.links if lk.key not in keys))

    def with_links(self, updated: Sequence[Link]) -> Fabric:
        """Replace links that share a key with `updated` (e.g. after telemetry)."""
        by_key = {link.key: link for link in updated}
        return replace(self, links=tuple(by_key.get(lk.key, lk) for lk in self.links))


def _slower(one: Link, two: Link) -> Link:
    """The two ends of a cable may report different widths/speeds; the link runs at the lower."""
    speed = min(one.speed, two.speed, key=SPEED_ORDER.__getitem__)
    return replace(one, width=min(one.width, two.width), speed=speed)


def _resolve(fabric: Fabric, ref: str) -> str:
    if ref in fabric.nodes:
        return ref
    matches = [n.id for n in fabric.nodes.values() if ref in (n.name, n.desc)]
    if len(matches) == 1:
        return matches[0]
    text = ref.lower().removeprefix("0x")
    try:
        number = int(text, 16)
    except ValueError:
        number = None
    if number is not None:
        guid_hits = [n.id for n in fabric.nodes.values() if n.guid == number]
        guid_hits += [node for (node, _), guid in fabric.port_guids.items() if guid == number]
        if guid_hits:
            return guid_hits[0]
    if ref.isdigit():
        lid = int(ref)
        lid_hits = [node for (node, _), value in fabric.port_lids.items() if value == lid]
        lid_hits += [n.id for n in fabric.nodes.values() if n.lid == lid]
        if lid_hits:
            return lid_hits[0]
    if len(matches) > 1:
        raise InvalidInput(f"{ref!r} names {len(matches)} nodes; use the node id or GUID instead.")
    raise InvalidInput(f"No node called {ref!r} in the fabric; use an id, name, GUID or LID "
                   "as listed by `gpupool fabric show FILE --cas` (or --switches).")
