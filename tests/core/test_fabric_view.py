"""FabricView: nodes mapped onto a fabric's hosts, domains per tier, hops, link state in place, sharing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from factories import cluster, node
from gpupool.core.fabric.generate import fat_tree, rail_optimized
from gpupool.core.fabric.model import Fabric
from gpupool.core.fabric.telemetry import PortLoad
from gpupool.core.model import IbPort, Node
from gpupool.core.scheduling.topology import (
    LEAF_LABEL,
    SPINE_LABEL,
    FabricView,
    LinkHealth,
    hosts,
    map_hosts,
    topology_for,
)
from gpupool.core.topology_spec import Tier
from gpupool.errors import InvalidInput


def three_level() -> Fabric:
    """4 pods x 2 leaves x 2 hosts: node00001..node00016, two per leaf, four per pod."""
    return fat_tree(4, levels=3)


def uplinks(fabric: Fabric, leaf_desc: str) -> list[tuple[str, int, str, int]]:
    leaf = next(n.id for n in fabric.nodes.values() if n.desc == leaf_desc)
    return [lk.key for lk in fabric.links_by_node[leaf] if fabric.is_switch(lk.other(leaf))]


def test_domains_and_hops_of_a_three_level_fat_tree() -> None:
    view = FabricView.from_fabric(three_level(), cluster(16))
    assert view.leaf_id.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]
    assert view.spine_id.tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert [view.hops(0, b) for b in (0, 1, 2, 4)] == [0, 2, 4, 6]
    assert [d.tolist() for d in view.domains(Tier.SPINE)][1] == [4, 5, 6, 7]
    place = view.places[0]
    assert place is not None and place.host == "node00001" and len(place.ports) == 1


def test_rail_optimised_hosts_have_one_port_per_rail_and_share_rail_leaves() -> None:
    fabric = rail_optimized(16, rails=4, ports=16)
    view = FabricView.from_fabric(fabric, [node(f"gpu{i:04d}") for i in range(16)])
    place = view.places[0]
    assert place is not None and place.rails == (0, 1, 2, 3) and len(place.leaves) == 4
    assert view.leaf_id.tolist() == [0] * 8 + [1] * 8  # blocks of 8 hosts share their 4 rail leaves
    assert view.spine_id.tolist() == [0] * 16


def test_nodes_take_their_own_host_then_a_guid_match_then_natural_order() -> None:
    fabric = fat_tree(4, levels=2)  # node00001..node00008
    guid = next(g for (ca, port), g in fabric.port_guids.items()
                if port == 1 and fabric.nodes[ca].desc.startswith("node00007"))
    by_guid = dataclasses.replace(node("gpu-a"), ib_ports=(IbPort("mlx5_0", 1, guid=hex(guid)),))
    nodes = [node("node00003"), node("n10"), by_guid, node("n2")]
    mapping = map_hosts(fabric, nodes)
    assert mapping == {"node00003": "node00003", "gpu-a": "node00007", "n2": "node00001", "n10": "node00002"}


def test_a_fabric_with_fewer_hosts_than_nodes_is_refused_in_one_sentence() -> None:
    with pytest.raises(InvalidInput) as caught:
        FabricView.from_fabric(fat_tree(4, levels=2), cluster(9))
    assert "8 hosts for 9 nodes" in caught.value.message
    assert caught.value.message.count(". ") == 0


def test_without_a_fabric_labels_give_domains_and_no_labels_give_none() -> None:
    plain = cluster(4)
    assert topology_for(plain) is None  # no fabric known: placement as before
    labelled = [dataclasses.replace(n, labels={LEAF_LABEL: f"l{i // 2}", SPINE_LABEL: "s"})
                for i, n in enumerate(plain)]
    view = topology_for(labelled)
    assert view is not None and not view.fabric_known
    assert view.leaf_id.tolist() == [0, 0, 1, 1] and view.spine_id.tolist() == [0, 0, 0, 0]
    alone = FabricView.from_labels([*labelled[:2], *plain[2:]])
    assert len(set(alone.leaf_id.tolist())) == 3  # an unlabelled node is its own domain


def test_a_failed_uplink_updates_the_view_in_place() -> None:
    fabric = fat_tree(4, levels=2)  # 4 leaves of 2 hosts, 2 spines: 2 uplinks per leaf
    view = FabricView.from_fabric(fabric, cluster(8))
    before = view.avail[1][0]
    version = view.version
    first, second = uplinks(fabric, "leaf-0")
    assert view.set_link(first, healthy=False)
    assert view.avail[1][0] == pytest.approx(before / 2) and view.version > version
    assert view.reachable([0, 2])
    view.set_link(second, healthy=False)
    assert not view.reachable([0, 2]) and view.reachable([0, 1]) and view.reachable([2, 4])
    view.set_link(second, healthy=True)
    assert view.reachable([0, 2])
    view.set_link(second, data_rate_gbps=before / 8)  # retrained at a quarter of its rate
    assert view.avail[1][0] == pytest.approx(before / 8)


def test_penalty_has_hysteresis_on_load_and_errors() -> None:
    fabric = fat_tree(4, levels=2)
    health = LinkHealth(load_high=0.8, load_low=0.6, clean_samples=3)
    view = FabricView.from_fabric(fabric, cluster(8), health)
    key = uplinks(fabric, "leaf-0")[0]
    view.set_link(key, utilization=0.85)
    assert view.link_state(key) == (True, 0.85, True)
    view.set_link(key, utilization=0.7)  # between the thresholds: still penalised
    assert view.link_state(key) == (True, 0.7, True)
    view.set_link(key, utilization=0.5)
    assert view.link_state(key) == (True, 0.5, False)
    view.set_link(key, utilization=0.1, errors=2)
    assert view.link_state(key) == (True, 0.1, True)
    view.set_link(key, utilization=0.1)
    view.set_link(key, utilization=0.1)
    assert view.link_state(key) == (True, 0.1, True)  # two clean samples are not enough
    view.set_link(key, utilization=0.1)
    assert view.link_state(key) == (True, 0.1, False)


def test_telemetry_loads_penalise_and_fail_links() -> None:
    fabric = fat_tree(4, levels=2)
    view = FabricView.from_fabric(fabric, cluster(8))
    a, b = uplinks(fabric, "leaf-1")
    loads = {
        (a[0], a[1]): PortLoad(a[0], a[1], 180.0, 10.0, 0.9),
        (b[0], b[1]): PortLoad(b[0], b[1], 0.0, 0.0, 0.0, errors={"link_downed": 1}),
    }
    assert view.apply_loads(loads) == 2
    assert view.link_state(a) == (True, 0.9, True)
    state = view.link_state(b)
    assert state is not None and state[0] is False


def test_gangs_share_the_links_they_cross() -> None:
    view = FabricView.from_fabric(fat_tree(4, levels=2), cluster(8))
    alone = view.share_gbps([0, 2])
    assert view.share_gbps([0]) == np.inf  # one node: no fabric traffic
    view.add_gang("a", [0, 2], weight_gpu_s=100.0)
    view.add_gang("a", [0, 2], weight_gpu_s=100.0)  # idempotent by id
    assert view.share_gbps([0, 2]) == pytest.approx(alone / 2)  # both access links now shared
    assert view.share_gbps([1, 3]) == pytest.approx(alone)  # own access links, uplinks to spare
    assert sorted(view.sharing([1, 3])) == sorted(
        [(alone, 0, 0.0), (alone, 0, 0.0), (view.avail[1][0], 1, 100.0), (view.avail[1][1], 1, 100.0)])
    view.remove_gang("a")
    assert view.share_gbps([0, 2]) == pytest.approx(alone) and not view.gangs


def test_hosts_group_cas_by_the_first_word_of_their_description() -> None:
    fabric = rail_optimized(4, rails=2, ports=8)
    grouped = hosts(fabric)
    assert list(grouped) == ["gpu0000", "gpu0001", "gpu0002", "gpu0003"]
    assert all(len(cas) == 2 for cas in grouped.values())


def test_nodes_for_a_view_keep_node_order() -> None:
    nodes: list[Node] = cluster(8)
    view = FabricView.from_fabric(fat_tree(4, levels=2), nodes)
    assert view.node_names == tuple(n.name for n in nodes)
