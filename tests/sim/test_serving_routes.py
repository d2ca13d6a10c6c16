"""KV flows on the static routes of the fabric's forwarding tables against the pooled-uplink model."""

from __future__ import annotations

import itertools

import pytest

from gpupool.core.fabric.forwarding import compute_tables
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.rates import LinkSpeed
from gpupool.core.scheduling.topology import FabricView
from gpupool.errors import InvalidInput
from gpupool.providers.nodespec import nodes_from_spec
from gpupool.sim.serving.network import KVNetwork

# 4-port switches, 2 levels: 4 leaves of 2 hosts, each leaf 2 uplinks (one to each spine)
FABRIC = fat_tree(4, levels=2, oversubscription=1.0, speed=LinkSpeed.HDR)
NODES = nodes_from_spec("8x8xH100")
VIEW = FabricView.from_fabric(FABRIC, NODES)
HDR = 4 * 50.0 * 64 / 66


def _ca(node: int) -> str:
    place = VIEW.places[node]
    assert place is not None
    return place.ports[0].ca


def _first_uplink(a: int, b: int) -> int:
    """The port a's leaf sends traffic for b out of, read straight from the tables."""
    tables = compute_tables(FABRIC)
    return tables.port(VIEW.places[a].ports[0].leaf, _ca(b))  # type: ignore[union-attr]


def _shared_and_apart() -> tuple[tuple[int, int], tuple[int, int]]:
    """Destinations d1, d2 outside leaf 0 whose traffic from hosts 0 and 1 (leaf 0) leaves on one
    uplink, and d1, d3 whose traffic leaves on two."""
    away = [n for n in range(len(NODES)) if VIEW.leaf_id[n] != VIEW.leaf_id[0]]
    assert VIEW.leaf_id[1] == VIEW.leaf_id[0]
    same = [(x, y) for x, y in itertools.permutations(away, 2) if _first_uplink(0, x) == _first_uplink(1, y)]
    apart = [(x, y) for x, y in itertools.permutations(away, 2) if _first_uplink(0, x) != _first_uplink(1, y)]
    assert same and apart  # the tables spread destinations over both uplinks
    return same[0], apart[0]


def test_the_route_taken_is_the_forwarding_tables_one() -> None:
    net = KVNetwork(VIEW, fabric=FABRIC, routing="static")
    tables = compute_tables(FABRIC)
    arrays = tables.arrays
    for a, b in itertools.permutations(range(len(NODES)), 2):
        cables = net.route_cables(a, b)
        if VIEW.leaf_id[a] == VIEW.leaf_id[b]:
            assert cables == ()
            continue
        switch = arrays.index[VIEW.places[a].ports[0].leaf]  # type: ignore[union-attr]
        for _, edge in cables:  # each cable leaves the switch the last one reached, by the table's port
            assert int(arrays.src[edge]) == switch
            assert int(arrays.port[edge]) == tables.port(arrays.switches[switch], _ca(b))
            switch = int(arrays.dst[edge])
        assert arrays.switches[switch] == VIEW.places[b].ports[0].leaf  # type: ignore[union-attr]
        assert len(cables) == tables.ca_hops(tables.cas.index(_ca(a)), tables.cas.index(_ca(b))) - 2


def _two_flows(routing: str, d1: int, d2: int) -> tuple[float, float]:
    net = KVNetwork(VIEW, fabric=FABRIC, routing=routing)
    net.start(0.0, 1, 0, d1, 10e9)
    net.start(0.0, 2, 1, d2, 10e9)
    at, _ = net.next_finish()  # type: ignore[misc]
    return at, net.rate_bps(1) * 8 / 1e9


def test_two_flows_on_one_static_uplink_take_twice_as_long_as_pooled() -> None:
    (d1, d2), (e1, e2) = _shared_and_apart()
    pooled_s, pooled_gbps = _two_flows("pooled", d1, d2)
    static_s, static_gbps = _two_flows("static", d1, d2)
    assert pooled_gbps == pytest.approx(HDR)  # the leaf's two uplinks pooled: each flow at its HCA's rate
    assert static_gbps == pytest.approx(HDR / 2)  # both on the one cable the tables give
    assert static_s == pytest.approx(2 * pooled_s)
    apart_s, apart_gbps = _two_flows("static", e1, e2)  # routed onto different uplinks: no sharing
    assert apart_gbps == pytest.approx(HDR) and apart_s == pytest.approx(pooled_s)


def test_the_fabric_router_prices_the_routes_own_load() -> None:
    (d1, d2), (_, e2) = _shared_and_apart()
    static = KVNetwork(VIEW, fabric=FABRIC, routing="static")
    pooled = KVNetwork(VIEW, fabric=FABRIC, routing="pooled")
    for net in (static, pooled):
        net.start(0.0, 1, 0, d1, 1e15)
    # a transfer from host 1 to d2 would share the busy uplink, to e2 it would not
    assert static.estimate_s(1, d2, 1e9) == pytest.approx(2 * static.estimate_s(1, e2, 1e9))
    assert static.others_delay_s(1, d2, 1e9) > static.others_delay_s(1, e2, 1e9)
    assert pooled.estimate_s(1, d2, 1e9) == pytest.approx(pooled.estimate_s(1, e2, 1e9))


def test_a_training_ring_loads_the_cables_of_its_routes() -> None:
    (d1, d2), _ = _shared_and_apart()
    rates = {}
    for routing in ("static", "pooled"):
        net = KVNetwork(VIEW, fabric=FABRIC, routing=routing)
        net.add_training([(0, d1)])  # a two-node ring: 0 -> d1 and back
        net.start(0.0, 1, 1, d2, 1e15)  # no HCA in common with the ring, the same uplink out of leaf 0
        rates[routing] = net.rate_bps(1) * 8 / 1e9
    assert rates == {"static": pytest.approx(HDR / 2), "pooled": pytest.approx(HDR)}


def test_unknown_routing_and_static_without_the_fabric_say_so() -> None:
    with pytest.raises(InvalidInput, match="static or pooled"):
        KVNetwork(VIEW, routing="ecmp")
    with pytest.raises(InvalidInput, match="needs the fabric"):
        KVNetwork(VIEW, routing="static")
