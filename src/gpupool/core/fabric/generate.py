"""Generate fabrics: k-ary 2- and 3-level fat trees with oversubscription, and rail-optimised GPU clusters."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.core.fabric.model import Fabric, FabricNode, Link, NodeKind
from gpupool.core.fabric.rates import LinkSpeed
from gpupool.errors import InvalidInput

SWITCH_GUID_BASE = 0x0002C90300000000
CA_GUID_BASE = 0x0002C90400000000
MAX_SWITCH_PORTS = 254
"""InfiniBand numbers a switch's external ports 1 to 254 (255 is the forwarding tables' "no route"),
so no switch, real or generated, has a larger radix."""
MAX_GENERATED_HOSTS = 131_072
"""The most hosts a generated fabric has: twice a full 3-level fat tree of 64-port switches. Each host
costs memory and lines of the file; a 3-level tree of 254-port switches would have four million."""


@dataclass
class _Builder:
    speed: LinkSpeed
    width: int
    nodes: list[FabricNode] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    port_guids: dict[tuple[str, int], int] = field(default_factory=dict)
    port_lids: dict[tuple[str, int], int] = field(default_factory=dict)
    next_lid: int = 1

    def switch(self, desc: str, ports: int) -> str:
        guid = SWITCH_GUID_BASE + len(self.nodes) + 1
        node_id = f"S-{guid:016x}"
        self.nodes.append(FabricNode(node_id, NodeKind.SWITCH, ports, guid, desc, self.next_lid))
        self.port_guids[(node_id, 0)] = guid
        self.next_lid += 1
        return node_id

    def ca(self, desc: str) -> str:
        guid = CA_GUID_BASE + 2 * (len(self.nodes) + 1)
        node_id = f"H-{guid:016x}"
        self.nodes.append(FabricNode(node_id, NodeKind.CA, 1, guid, desc))
        self.port_guids[(node_id, 1)] = guid + 1
        self.port_lids[(node_id, 1)] = self.next_lid
        self.next_lid += 1
        return node_id

    def cable(self, a: str, a_port: int, b: str, b_port: int) -> None:
        self.links.append(Link(a, a_port, b, b_port, self.width, self.speed))

    def fabric(self) -> Fabric:
        return Fabric.build(self.nodes, self.links, self.port_guids, self.port_lids)


def _check_radix(ports: int, what: str) -> None:
    if ports < 2 or ports % 2:
        raise InvalidInput(f"{what} needs an even switch radix of at least 2 ports, got {ports}.")
    if ports > MAX_SWITCH_PORTS:
        raise InvalidInput(f"{what} needs a switch radix of at most {MAX_SWITCH_PORTS} ports (InfiniBand "
                           f"numbers a switch's ports 1 to {MAX_SWITCH_PORTS}), got {ports}; give a smaller "
                           "radix.")


def split_ports(ports: int, oversubscription: float) -> tuple[int, int]:
    """Leaf ports for hosts and uplinks for a down:up ratio (1.0 = non-blocking)."""
    _check_radix(ports, "A fat tree")
    if not 1.0 <= oversubscription <= ports:  # (also refuses nan)
        raise InvalidInput(f"Oversubscription is down:up and must be 1.0 to {ports} (the radix), got "
                           f"{oversubscription}.")
    down = round(ports * oversubscription / (oversubscription + 1.0))
    down = min(max(down, 1), ports - 1)
    return down, ports - down


def fat_tree(
    ports: int,
    levels: int = 2,
    oversubscription: float = 1.0,
    pods: int | None = None,
    speed: LinkSpeed = LinkSpeed.HDR,
    width: int = 4,
) -> Fabric:
    """A k-ary fat tree of `ports`-port switches, one HCA per host.

    2 levels: `pods` leaves (default `ports`), each with one uplink to every spine.
    3 levels: `pods` pods (default `ports`) of ports/2 leaves and one aggregation switch per leaf
    uplink; aggregation switch j of every pod reaches core group j. Oversubscription is applied at
    the leaves. Non-blocking k=36: 648 hosts (2 levels), 11,664 hosts (3 levels).
    """
    if levels not in (2, 3):
        raise InvalidInput(f"Fat trees have 2 or 3 levels here, got {levels}.")
    down, up = split_ports(ports, oversubscription)
    builder = _Builder(speed, width)
    count = ports if pods is None else pods
    if not 1 <= count <= ports:
        raise InvalidInput(f"pods must be between 1 and the switch radix {ports}, got {count}.")
    hosts = count * down * (1 if levels == 2 else ports // 2)
    if hosts > MAX_GENERATED_HOSTS:
        raise InvalidInput(f"This {levels}-level fat tree would have {hosts:,} hosts, but a generated fabric "
                           f"has at most {MAX_GENERATED_HOSTS:,} (each costs memory and lines of the file); "
                           "give fewer pods or a smaller radix.")
    if levels == 2:
        _two_level(builder, ports, down, up, count)
    else:
        _three_level(builder, ports, down, up, count)
    return builder.fabric()


def _add_hosts(builder: _Builder, leaf: str, down: int, first_host: int) -> int:
    for port in range(1, down + 1):
        host = builder.ca(f"node{first_host:05d} HCA-1")
        builder.cable(leaf, port, host, 1)
        first_host += 1
    return first_host


def _two_level(builder: _Builder, ports: int, down: int, up: int, leaves: int) -> None:
    spines = [builder.switch(f"spine-{j}", ports) for j in range(up)]
    host = 1
    for i in range(leaves):
        leaf = builder.switch(f"leaf-{i}", ports)
        host = _add_hosts(builder, leaf, down, host)
        for j, spine in enumerate(spines):
            builder.cable(leaf, down + 1 + j, spine, i + 1)


def _three_level(builder: _Builder, ports: int, down: int, up: int, pods: int) -> None:
    half = ports // 2
    cores = [[builder.switch(f"core-{g}-{c}", ports) for c in range(half)] for g in range(up)]
    host = 1
    for pod in range(pods):
        aggs = [builder.switch(f"agg-p{pod}-{j}", ports) for j in range(up)]
        for i in range(half):
            leaf = builder.switch(f"leaf-p{pod}-{i}", ports)
            host = _add_hosts(builder, leaf, down, host)
            for j, agg in enumerate(aggs):
                builder.cable(leaf, down + 1 + j, agg, i + 1)
        for j, agg in enumerate(aggs):
            for c, core in enumerate(cores[j]):
                builder.cable(agg, half + 1 + c, core, pod + 1)


def rail_optimized(
    nodes: int,
    rails: int = 8,
    ports: int = 64,
    speed: LinkSpeed = LinkSpeed.NDR,
    width: int = 4,
) -> Fabric:
    """N GPU servers x `rails` HCAs; HCA r of every server lands on rail r's leaf switches.

    Each leaf uses half its ports for HCAs and half for one uplink to each of ports/2 spines, so
    traffic between servers on the same rail stays on one leaf and cross-rail traffic takes 3 hops.
    """
    if nodes < 1 or rails < 1:
        raise InvalidInput("A rail-optimised cluster needs at least one node and one rail.")
    _check_radix(ports, "A rail-optimised cluster")
    half = ports // 2
    per_rail = -(-nodes // half)
    if rails * per_rail > ports:
        raise InvalidInput(
            f"{nodes} nodes x {rails} rails need {rails * per_rail} leaves but a {ports}-port "
            "spine reaches only {ports}; use fewer nodes or larger switches.".replace("{ports}", str(ports))
        )
    builder = _Builder(speed, width)
    spines = [builder.switch(f"spine-{j}", ports) for j in range(half)]
    leaf_index = 0
    for rail in range(rails):
        for block in range(per_rail):
            leaf = builder.switch(f"rail{rail}-leaf-{block}", ports)
            members = range(block * half, min(nodes, (block + 1) * half))
            for port, node in enumerate(members, start=1):
                hca = builder.ca(f"gpu{node:04d} mlx5_{rail}")
                builder.cable(leaf, port, hca, 1)
            for j, spine in enumerate(spines):
                builder.cable(leaf, half + 1 + j, spine, leaf_index + 1)
            leaf_index += 1
    return builder.fabric()
