"""KV flows on the fabric's link pools, and the placement of prefill/decode instances on a small tree."""

from __future__ import annotations

import pytest

from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.rates import LinkSpeed
from gpupool.core.scheduling.topology import FabricView
from gpupool.errors import InvalidInput
from gpupool.providers.nodespec import nodes_from_spec
from gpupool.sim.serving.network import KVNetwork, TrainingSpec
from gpupool.sim.serving.placement import InstanceSpec, Placement, place_instances

H100 = "H100-SXM-80GB"


def _tree_view(nodes_spec: str = "8x8xH100", oversubscription: float = 1.0) -> tuple[FabricView, list]:
    # 4-port switches, 2 levels: 4 leaves of 2 hosts (non-blocking: 2 uplinks each)
    nodes = nodes_from_spec(nodes_spec)
    fabric = fat_tree(4, levels=2, oversubscription=oversubscription, speed=LinkSpeed.HDR)
    return FabricView.from_fabric(fabric, nodes), nodes


def test_a_second_flow_on_a_link_halves_the_first_ones_bandwidth() -> None:
    net = KVNetwork(None, nic_gbps=400.0)
    net.start(0.0, 1, 0, 1, 50e9)  # 50 GB alone at 400 Gb/s: 1 s
    assert net.rate_bps(1) == pytest.approx(50e9)
    net.start(0.5, 2, 0, 2, 10e9)  # shares node 0's link from 0.5 s on
    assert net.rate_bps(1) == pytest.approx(25e9) and net.rate_bps(2) == pytest.approx(25e9)
    # flow 2 (10 GB at 25 GB/s) ends at 0.9 s; flow 1 has 25 - 10 GB left, at full speed again
    at, fid = net.next_finish()  # type: ignore[misc]
    assert (fid, at) == (2, pytest.approx(0.9))
    net.finish(at, 2)
    assert net.rate_bps(1) == pytest.approx(50e9)
    at, fid = net.next_finish()  # type: ignore[misc]
    assert (fid, at) == (1, pytest.approx(0.9 + 15e9 / 50e9))


def test_flows_across_leaves_share_the_uplinks_and_are_counted() -> None:
    view, _ = _tree_view(oversubscription=1.0)
    net = KVNetwork(view)
    pools, cross_leaf, cross_spine = net.path(0, 2)  # hosts 0 and 2 sit under different leaves
    assert cross_leaf and not cross_spine and len(pools) == 4
    assert net.path(0, 1)[1] is False  # same leaf: HCA links only
    hdr = 4 * 50.0 * 64 / 66
    net.start(0.0, 1, 0, 2, 1e9)
    assert net.rate_bps(1) * 8 / 1e9 == pytest.approx(hdr)  # 2 uplinks: the HCA is the bottleneck
    net.add_training([(1, 3, 5, 7)])  # a ring over every leaf: one more flow on each uplink pool
    assert net.share_gbps(pools) == pytest.approx(hdr)  # leaf 0 uplinks: 2 x HDR over 2 flows
    assert net.cross_leaf_bytes == 1e9 and net.cross_spine_bytes == 0


def test_training_beside_kv_flows_slows_down() -> None:
    view, _ = _tree_view(oversubscription=3.0)  # 3 hosts, 1 uplink a leaf
    net = KVNetwork(view, training=TrainingSpec(gangs=1, nodes_per_gang=2, gradient_gib=1.0, compute_s=0.1))
    net.add_training([(0, 3)])  # hosts 0 and 3: leaves 0 and 1
    net.start(0.0, 1, 1, 4, 1e15)  # a KV flow over the same two uplinks for the whole run
    assert net.training_slowdown(10.0) > 1.2
    alone = KVNetwork(view, training=TrainingSpec(gangs=1, nodes_per_gang=2, gradient_gib=1.0, compute_s=0.1))
    alone.add_training([(0, 3)])
    assert alone.training_slowdown(10.0) == pytest.approx(1.0)


def _plan(prefill: int, decode: int) -> list[InstanceSpec]:
    return [InstanceSpec("prefill", H100, 8)] * prefill + [InstanceSpec("decode", H100, 8)] * decode


@pytest.mark.parametrize("policy", [Placement.NETWORK_AWARE, Placement.LEAF_PAIRED])
def test_fabric_aware_placement_keeps_each_pair_in_a_leaf(policy: Placement) -> None:
    view, nodes = _tree_view()
    placed = place_instances(nodes, view, _plan(4, 4), policy, seed=1)
    leaf = view.leaf_id
    for p in range(4):  # unit p: prefill p with decode 4 + p
        assert leaf[placed.instance_nodes[p]] == leaf[placed.instance_nodes[4 + p]]


def test_fabric_blind_best_fit_puts_the_pools_in_blocks_across_leaves() -> None:
    view, nodes = _tree_view()
    placed = place_instances(nodes, view, _plan(4, 4), Placement.BEST_FIT, seed=1)
    leaf = view.leaf_id
    prefill_leaves = {int(leaf[n]) for n in placed.instance_nodes[:4]}
    decode_leaves = {int(leaf[n]) for n in placed.instance_nodes[4:]}
    assert prefill_leaves.isdisjoint(decode_leaves)


def test_a_pool_too_small_for_the_instances_says_so() -> None:
    _, nodes = _tree_view("2x8xH100")
    with pytest.raises(InvalidInput, match="2 decode instance"):
        place_instances(nodes[:2], None, _plan(2, 2), Placement.BEST_FIT, seed=1)


def test_the_others_term_prices_a_flow_by_the_flows_it_slows() -> None:
    view, _ = _tree_view(oversubscription=1.0)
    net = KVNetwork(view)
    assert net.others_delay_s(0, 2, 1e9) == 0.0  # an empty fabric: nobody to slow
    net.add_training([(1, 3)])  # a ring over leaves 0 and 1: one flow on each's uplinks and HCAs
    uplinks = 2 * 4 * 50.0 * 64 / 66  # two HDR uplinks a leaf
    # from host 0 (leaf 0) to host 2 (leaf 1): the two uplink pools carry the ring, one flow each
    assert net.others_delay_s(0, 2, 1e9) == pytest.approx(2 * 1e9 * 8 / (uplinks * 1e9))
    # inside leaf 0 to host 1, a ring member: only its HCA's one flow is slowed
    assert net.others_delay_s(0, 1, 1e9) == pytest.approx(1e9 * 8 / (uplinks / 2 * 1e9))


def test_a_flow_held_back_elsewhere_leaves_its_share_to_the_others() -> None:
    # max-min fairness: flow 2 is held to 400/3 Gb/s on node 2's link (three flows there), so on
    # node 0's link flow 1 gets the rest (400 - 133), not an equal half (200)
    net = KVNetwork(None, nic_gbps=400.0)
    net.start(0.0, 1, 0, 1, 1e12)
    net.start(0.0, 2, 0, 2, 1e12)
    net.start(0.0, 3, 2, 3, 1e12)
    net.start(0.0, 4, 2, 4, 1e12)
    third = 400.0 / 3
    assert net.rate_bps(2) * 8 / 1e9 == pytest.approx(third)
    assert net.rate_bps(3) * 8 / 1e9 == pytest.approx(third)
    assert net.rate_bps(1) * 8 / 1e9 == pytest.approx(400.0 - third)
    net.finish(0.0, 3)  # node 2's link now holds two: flow 2 rises to 200, flow 1 falls to 200
    assert net.rate_bps(2) * 8 / 1e9 == pytest.approx(200.0)
    assert net.rate_bps(1) * 8 / 1e9 == pytest.approx(200.0)


def test_rails_stripe_a_flow_over_every_hca_and_plane() -> None:
    view, _ = _tree_view(oversubscription=3.0)  # 1 HDR uplink a leaf
    one = KVNetwork(view)
    eight = KVNetwork(view, rails=8)
    for net in (one, eight):
        net.start(0.0, 1, 0, 3, 1e12)  # across leaves
        net.start(0.0, 2, 1, 4, 1e12)  # the same two uplinks
    hdr = 50.0 * 64 / 66 * 4
    assert one.rate_bps(1) * 8 / 1e9 == pytest.approx(hdr / 2)
    assert eight.rate_bps(1) * 8 / 1e9 == pytest.approx(8 * hdr / 2)
