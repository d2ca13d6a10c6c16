"""ibnetdiscover / ibsim net / node-name-map parsing against real files and their quirks."""

from __future__ import annotations

import pytest

from core.fabric.conftest import load
from gpupool.core.fabric.generate import fat_tree, rail_optimized
from gpupool.core.fabric.model import NodeKind
from gpupool.core.fabric.parse import apply_node_names, parse_node_name_map, parse_topology
from gpupool.core.fabric.rates import LinkSpeed, data_rate_gbps, parse_width_speed, signal_rate_gbps
from gpupool.core.fabric.write import to_ibnetdiscover, to_ibsim_net
from gpupool.errors import InvalidInput, TopologyError


def test_psmn_counts_levels_and_degraded_links(psmn):
    assert len(psmn.switches) == 11
    assert len(psmn.cas) == 89
    # 318 port lines: 89 CA cables seen from both ends + 70 switch-to-switch cables seen twice.
    assert len(psmn.links) == 159
    assert psmn.norm == (4, LinkSpeed.QDR)
    # 46 port lines read 4xDDR: 23 cables, each listed from both of its ends.
    assert len(psmn.degraded_links) == 23
    assert all(link.speed is LinkSpeed.DDR for link in psmn.degraded_links)
    leaves = {sw for sw, level in psmn.levels.items() if level == 0}
    assert len(leaves) == 6
    assert psmn.roots == ["S-0008f105001086a2"]


def test_manpage_example_lmc_dual_port_and_slower_end_wins():
    fabric = load("rdma-core-manpage-example.topo")
    assert len(fabric.switches) == 2 and len(fabric.cas) == 4
    assert fabric.lmc["H-0008f10403960558"] == 1
    assert fabric.port_lids[("H-0008f10403960558", 2)] == 14
    assert fabric.port_guids[("H-0008f10403960558", 1)] == 0x8F10403960559
    degraded = {(link.a, link.a_port) for link in fabric.degraded_links}
    assert degraded == {("H-0008f10403960558", 1), ("S-0008f10400410015", 1)}
    assert all(link.width == 1 for link in fabric.degraded_links)


def test_stderr_line_single_spaces_self_loops_and_guid_equal_to_node_guid():
    fabric = load("ibtopotool-3-mixed-speeds.topo")
    loops = [link for link in fabric.links if link.a == link.b]
    assert len(loops) == 3
    assert fabric.port_guids[("H-e41d2d030061f957", 1)] == fabric.nodes["H-e41d2d030061f957"].guid
    speeds = {link.speed for link in fabric.links}
    assert speeds == {LinkSpeed.EDR, LinkSpeed.FDR, LinkSpeed.QDR, LinkSpeed.SDR}
    assert fabric.nodes["S-f4521403005764b0"].desc == "MF0;switch-de779e:SX6012/U1"


def test_ibsim_net_format():
    fabric = load("ibsim-net.2sw2path4hca")
    assert fabric.switches == ["Switch1", "Switch2"]
    assert fabric.nodes["Hca1"].kind is NodeKind.CA
    assert len(fabric.links) == 6


def test_width_option_in_ibsim_net():
    text = 'Switch 8 "S1"\n[1] "H1"[1] w=12\n\nHca 1 "H1"\n[1] "S1"[1] w=12\n'
    fabric = parse_topology(text)
    assert fabric.links[0].width == 12


@pytest.mark.parametrize(
    ("token", "gbps", "data"),
    [
        ("4xSDR", 10.0, 8.0),
        ("4xQDR", 40.0, 32.0),
        ("4xFDR10", 40.0, 40.0 * 64 / 66),
        ("4xFDR", 56.0, 56.0 * 64 / 66),
        ("4xEDR", 100.0, 100.0 * 64 / 66),
        ("4xHDR", 200.0, 200.0 * 64 / 66),
        ("2xNDR", 200.0, 200.0 * 64 / 66),
        ("4xXDR", 800.0, 800.0 * 64 / 66),
        ("1xDDR", 5.0, 4.0),
    ],
)
def test_rates(token, gbps, data):
    width, speed = parse_width_speed(token)
    assert signal_rate_gbps(width, speed) == pytest.approx(gbps)
    assert data_rate_gbps(width, speed) == pytest.approx(data)


def test_bad_speed_names_file_and_line():
    text = 'Switch 8 "S-01"\n[1] "H-02"[1](3) # "h" lid 4 4xWARP\n'
    with pytest.raises(TopologyError, match=r"fab\.topo, line 2: Unknown link speed 'WARP'"):
        parse_topology(text, source="fab.topo")


def test_garbage_after_header_is_an_error():
    text = 'Switch 8 "S-01"\nthis is not a port line\n'
    with pytest.raises(TopologyError, match="line 2"):
        parse_topology(text, source="x")


def test_empty_file_is_an_error():
    with pytest.raises(TopologyError, match="no Switch or Ca records"):
        parse_topology("# nothing\n", source="empty")


def test_width_speed_errors():
    with pytest.raises(InvalidInput):
        parse_width_speed("3xQDR")
    with pytest.raises(InvalidInput):
        parse_width_speed("QDR")


def test_node_name_map_renames(psmn):
    names = parse_node_name_map('# map\n0x0008f10500108bba "spine-bba"\n78e7d1030022cae4 "sl390lin1"\n')
    renamed = apply_node_names(psmn, names)
    assert renamed.nodes["S-0008f10500108bba"].label == "spine-bba"
    assert renamed.find("spine-bba") == "S-0008f10500108bba"
    with pytest.raises(TopologyError, match=r"map\.txt, line 1"):
        parse_node_name_map("nonsense\n", source="map.txt")


def test_round_trip_ibnetdiscover_and_net(psmn):
    again = parse_topology(to_ibnetdiscover(psmn))
    assert again.links == psmn.links
    assert again.port_guids == psmn.port_guids
    net = parse_topology(to_ibsim_net(psmn))
    assert len(net.links) == len(psmn.links)


def test_round_trip_keeps_self_loops():
    fabric = load("ibtopotool-3-mixed-speeds.topo")
    assert parse_topology(to_ibnetdiscover(fabric)).links == fabric.links


@pytest.mark.parametrize(
    ("ports", "levels", "ratio", "pods", "hosts", "switches"),
    [
        (8, 2, 1.0, None, 32, 12),
        (8, 2, 3.0, None, 48, 10),
        (8, 3, 1.0, None, 128, 80),
        (8, 3, 1.0, 2, 32, 32),
        (36, 3, 1.0, 4, 1296, 468),
    ],
)
def test_fat_tree_sizes(ports, levels, ratio, pods, hosts, switches):
    fabric = fat_tree(ports, levels, ratio, pods=pods)
    assert len(fabric.cas) == hosts
    assert len(fabric.switches) == switches
    assert max(fabric.levels.values()) == levels - 1
    assert not fabric.degraded_links
    for switch in fabric.switches:
        assert len(fabric.links_by_node[switch]) <= ports
    assert parse_topology(to_ibnetdiscover(fabric)).links == fabric.links


def test_rail_optimised():
    fabric = rail_optimized(16, rails=8, ports=32)
    assert len(fabric.cas) == 128
    rail0 = [ca for ca in fabric.cas if fabric.nodes[ca].desc.endswith("mlx5_0")]
    assert len({fabric.ca_leaf[ca][0] for ca in rail0}) == 1
    with pytest.raises(InvalidInput):
        rail_optimized(1000, rails=8, ports=32)


def test_generator_rejects_bad_shapes():
    with pytest.raises(InvalidInput):
        fat_tree(7)
    with pytest.raises(InvalidInput):
        fat_tree(8, levels=4)
    with pytest.raises(InvalidInput):
        fat_tree(8, oversubscription=0.5)
