"""Parse fabric text: ibnetdiscover output, ibsim's "net" format and node-name-map files."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpupool.core.fabric.model import Fabric, FabricNode, Link, NodeKind
from gpupool.core.fabric.rates import SPEED_ORDER, LinkSpeed, parse_width_speed
from gpupool.errors import InvalidInput, TopologyError

_HEADER = re.compile(r'^(Switch|Ca|Hca|Rt)\s+(\d+)\s+"([^"]+)"\s*(?:#\s*(.*))?$')
_GUID_LINE = re.compile(r"^(switchguid|caguid|rtguid)=(?:0x)?([0-9a-fA-F]+)")
_IGNORED = re.compile(
    r"^(?:vendid=|devid=|sysimgguid=|Chassis\b|Non-Chassis|Non-Spine|Spine\b|Line\b|ibwarn:|"
    r"ibnetdiscover:|\S+\.c:\d+;|do\s)"
)
_PORT = re.compile(
    r'^\[(\d+)\](?:\[ext \d+\])?\s*(?:\(([0-9a-fA-F]+)\))?\s*"([^"]+)"\[(\d+)\](?:\[ext \d+\])?'
    r"\s*(?:\(([0-9a-fA-F]+)\))?\s*(.*)$"
)
_SWITCH_COMMENT = re.compile(r'^"(.*)"\s+(?:base|enhanced)\s+port\s+\d+\s+lid\s+(\d+)\s+lmc\s+(\d+)')
_PORT_COMMENT = re.compile(
    r'^(?:lid\s+(\d+)\s+lmc\s+(\d+)\s+)?"(.*)"\s+lid\s+(\d+)\s+(\d+[xX][A-Za-z]+\d*)\s*$'
)
_WIDTH_OPT = re.compile(r"\bw=(\d+)")
_KINDS = {"Switch": NodeKind.SWITCH, "Ca": NodeKind.CA, "Hca": NodeKind.CA, "Rt": NodeKind.ROUTER}


@dataclass
class _State:
    source: str
    nodes: dict[str, FabricNode] = field(default_factory=dict)
    remote_hints: dict[str, tuple[str, int | None, int]] = field(default_factory=dict)
    cables: dict[tuple[str, int, str, int], tuple[int, LinkSpeed]] = field(default_factory=dict)
    max_port: dict[str, int] = field(default_factory=dict)
    token_cache: dict[str, tuple[int, LinkSpeed]] = field(default_factory=dict)
    port_guids: dict[tuple[str, int], int] = field(default_factory=dict)
    port_lids: dict[tuple[str, int], int] = field(default_factory=dict)
    lmc: dict[str, int] = field(default_factory=dict)
    pending_guid: int | None = None
    current: FabricNode | None = None
    seen_header: bool = False

    def fail(self, number: int, line: str, expected: str) -> TopologyError:
        return TopologyError(
            f"{self.source}, line {number}: expected {expected}, got {line.strip()[:80]!r}.",
            source=self.source,
            line=number,
        )


def parse_topology(
    text: str,
    source: str = "<topology>",
    node_names: dict[int, str] | None = None,
    default_speed: LinkSpeed = LinkSpeed.SDR,
) -> Fabric:
    """Parse ibnetdiscover output or an ibsim net file into a Fabric.

    Tolerates a tool's stderr lines before the first record, single spaces for tabs, switch ports
    cabled to their own switch and chassis grouping lines. Links without a speed (ibsim net format)
    get `default_speed` and width `w=` or 4x. Raises TopologyError naming the source and line.
    """
    state = _State(source)
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        if line[0] == "[":
            if state.current is None:
                raise state.fail(number, line, "a node header (Switch/Ca/Hca) before port lines")
            _parse_port(state, number, line, default_speed)
            continue
        if _IGNORED.match(line):
            continue
        if line.startswith("include"):
            raise state.fail(number, line, "no 'include' (inline the included file first)")
        if _parse_guid(state, line) or _parse_header(state, number, line):
            continue
        if not state.seen_header:
            continue  # stderr noise a tool printed before the topology
        raise state.fail(number, line, "a node header, a port line '[N] \"remote\"[M]' or a comment")
    if not state.nodes:
        raise TopologyError(f"{source}: no Switch or Ca records found; is this ibnetdiscover output?")
    _add_remote_only_nodes(state)
    links = [
        Link(a, a_port, b, b_port, width, speed)
        for (a, a_port, b, b_port), (width, speed) in state.cables.items()
    ]
    fabric = Fabric.build(state.nodes.values(), links, state.port_guids, state.port_lids, state.lmc)
    return apply_node_names(fabric, node_names) if node_names else fabric


def _parse_guid(state: _State, line: str) -> bool:
    match = _GUID_LINE.match(line)
    if match:
        state.pending_guid = int(match.group(2), 16)
    return match is not None


def _parse_header(state: _State, number: int, line: str) -> bool:
    match = _HEADER.match(line)
    if not match:
        return False
    kind_text, ports, node_id, comment = match.groups()
    desc, lid = node_id, None
    if comment:
        sw = _SWITCH_COMMENT.match(comment)
        if sw:
            desc, lid = sw.group(1), int(sw.group(2))
            state.lmc[node_id] = int(sw.group(3))
        elif comment.startswith('"') and comment.rfind('"') > 0:
            desc = comment[1 : comment.rfind('"')]
    if node_id in state.nodes:
        raise state.fail(number, line, f"each node once, but {node_id!r} appears again")
    node = FabricNode(node_id, _KINDS[kind_text], int(ports), state.pending_guid, desc, lid)
    state.nodes[node_id] = node
    state.current = node
    state.pending_guid = None
    state.seen_header = True
    return True


def _parse_port(state: _State, number: int, line: str, default_speed: LinkSpeed) -> None:
    match = _PORT.match(line)
    if not match:
        raise state.fail(number, line, "a port line like '[1] \"S-...\"[2] # \"desc\" lid 3 4xQDR'")
    lport, lguid, remote, rport, rguid, rest = match.groups()
    node = state.current
    assert node is not None
    width, speed = _WIDTH_DEFAULT, default_speed
    remote_desc, remote_lid = remote, None
    comment = rest.split("#", 1)[1].strip() if "#" in rest else ""
    if comment:
        info = _PORT_COMMENT.match(comment)
        if not info:
            raise state.fail(number, line, "a port comment ending in 'lid N <width>x<speed>'")
        local_lid, local_lmc, remote_desc, remote_lid_text, token = info.groups()
        remote_lid = int(remote_lid_text)
        cached = state.token_cache.get(token)
        if cached is None:
            try:
                cached = state.token_cache[token] = parse_width_speed(token)
            except InvalidInput as exc:
                raise TopologyError(
                    f"{state.source}, line {number}: {exc.message}", source=state.source, line=number
                ) from None
        width, speed = cached
        if local_lid is not None:
            state.port_lids[(node.id, int(lport))] = int(local_lid)
            state.lmc[node.id] = int(local_lmc)
    else:
        opt = _WIDTH_OPT.search(rest)
        if opt:
            width = int(opt.group(1))
    if lguid:
        state.port_guids[(node.id, int(lport))] = int(lguid, 16)
    if rguid:
        state.port_guids[(remote, int(rport))] = int(rguid, 16)
    if remote_lid is not None and not node_is_switch_name(remote):
        state.port_lids.setdefault((remote, int(rport)), remote_lid)
    if remote not in state.remote_hints:
        state.remote_hints[remote] = (remote_desc, remote_lid, int(rport))
    _add_cable(state, node.id, int(lport), remote, int(rport), width, speed)


def _add_cable(
    state: _State, a: str, a_port: int, b: str, b_port: int, width: int, speed: LinkSpeed
) -> None:
    """Record a cable once, in canonical end order; two ends that disagree keep the slower."""
    key = (a, a_port, b, b_port) if (a, a_port) <= (b, b_port) else (b, b_port, a, a_port)
    prior = state.cables.get(key)
    if prior is not None:
        slower = speed if SPEED_ORDER[speed] < SPEED_ORDER[prior[1]] else prior[1]
        width, speed = min(width, prior[0]), slower
    state.cables[key] = (width, speed)
    if state.max_port.get(b, 0) < b_port:
        state.max_port[b] = b_port


_WIDTH_DEFAULT = 4


def node_is_switch_name(node_id: str) -> bool:
    return node_id.startswith("S-")


def _add_remote_only_nodes(state: _State) -> None:
    """A node seen only as the far end of a cable still gets a record (kind guessed from its id)."""
    max_port = state.max_port
    for node_id, (desc, lid, _) in state.remote_hints.items():
        if node_id in state.nodes:
            continue
        kind = NodeKind.SWITCH if node_is_switch_name(node_id) else NodeKind.CA
        state.nodes[node_id] = FabricNode(node_id, kind, max_port.get(node_id, 1), None, desc, lid)


_MAP_LINE = re.compile(r'^(?:0x)?([0-9a-fA-F]+)\s+"([^"]*)"')


def parse_node_name_map(text: str, source: str = "<node-name-map>") -> dict[int, str]:
    """Parse `<guid> "<name>"` lines (the ibnetdiscover --node-name-map format) into guid -> name."""
    names: dict[int, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _MAP_LINE.match(line)
        if not match:
            raise TopologyError(
                f"{source}, line {number}: expected '<guid> \"<name>\"', got {line[:80]!r}.",
                source=source,
                line=number,
            )
        names[int(match.group(1), 16)] = match.group(2)
    return names


def apply_node_names(fabric: Fabric, names: dict[int, str]) -> Fabric:
    """Give nodes whose GUID is in `names` that name (the id stays the file's id)."""
    from dataclasses import replace

    renamed = {
        node_id: replace(node, name=names[node.guid])
        if node.guid is not None and node.guid in names
        else node
        for node_id, node in fabric.nodes.items()
    }
    return replace(fabric, nodes=renamed)
