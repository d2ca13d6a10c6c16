"""A job's own communication ratio in the scheduler: the same state, a light and a heavy gang, different
decisions from wait-or-spread and from the network-aware policy; unknown keeps the one assumption."""

from __future__ import annotations

import dataclasses

import pytest
from net_helpers import busy, gang, leaves_of, nodes_of, run, view_on
from test_wait_or_spread import FREE_N001_N003, congested

from gpupool.core.model import Reason
from gpupool.core.scheduling.comm_cost import CommModel
from gpupool.core.scheduling.topology import TopologyContext
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.topology_spec import Tier, TopologySpec, effective_spec, parse_topology_spec
from gpupool.errors import InvalidInput

HEAVY, LIGHT = 1.5, 0.1
"""A language-model-like ratio and one well below the default assumption's (0.08 at 200 Gb/s)."""


def told(view: ClusterView, ratios: dict[str, float | None]) -> ClusterView:
    view.comm_ratio = lambda w: ratios.get(w.id)
    return view


def test_for_ratio_sets_the_ratio_and_scales_every_slowdown() -> None:
    base = CommModel()
    assert base.ratio(200.0) == pytest.approx(0.08)
    heavy = base.for_ratio(1.6, 200.0)
    assert heavy.ratio(200.0) == pytest.approx(1.6)
    assert heavy.ratio(100.0) == pytest.approx(3.2)  # the same job on half the bandwidth
    for ranks, gbps, hops in ((2, 200.0, 2), (8, 50.0, 4), (64, 12.5, 6)):
        assert heavy.slowdown(ranks, gbps, hops) == pytest.approx(20 * base.slowdown(ranks, gbps, hops))
    assert base.for_ratio(0.0, 200.0).slowdown(8, 1.0, 6) == 0.0  # does not communicate


def test_a_user_states_the_ratio_in_the_topology_and_alone_it_keeps_the_pools_constraint() -> None:
    spec = parse_topology_spec("preferred=leaf,comm=1.5")
    assert spec == TopologySpec(preferred=Tier.LEAF, comm_ratio=1.5)
    assert str(spec) == "preferred=leaf,comm=1.5"
    alone = parse_topology_spec("comm=0.2")
    assert not alone.constrained and str(alone) == "comm=0.2"
    default = TopologySpec(preferred=Tier.LEAF)
    assert effective_spec(alone, default, pods=4, fractional=False) == TopologySpec(preferred=Tier.LEAF,
                                                                                    comm_ratio=0.2)
    assert effective_spec(parse_topology_spec("none"), default, pods=4, fractional=False) is None
    for bad in ("comm=heavy", "comm=-1", "comm=nan", "comm=inf"):
        with pytest.raises(InvalidInput, match="comm="):
            parse_topology_spec(bad)
    gang_of_two = gang(2, 8)
    assert TopologyContext(view_on().topology).comm_ratio(gang_of_two) is None  # type: ignore[arg-type]
    stated = dataclasses.replace(gang_of_two, topology=alone)
    assert TopologyContext(view_on().topology).comm_ratio(stated) == 0.2  # type: ignore[arg-type]


def test_the_view_binds_its_estimate_and_unknown_is_the_default() -> None:
    view = view_on()
    assert view.topology is not None
    assert TopologyContext(view.topology).comm_ratio(gang(2, 8)) is None
    policy = told(view, {"g": HEAVY}).placement_policy("network-aware", {})
    assert policy.topology is not None and policy.topology.comm_ratio(gang(2, 8, wid="g")) == HEAVY
    assert 190 < view.topology.ref_gbps <= 200  # HDR x4 as generated


def test_a_light_gang_spreads_at_once_where_a_heavy_one_waits_for_its_leaf() -> None:
    """Uplinks at 80 % load, a leaf of its own in 100 s: spreading costs a heavy job more than 100 s
    of its 100 s, a light one less; the uniform assumption (nothing told) spreads too."""
    decisions = {}
    for wid, ratio in (("light", LIGHT), ("heavy", HEAVY), ("unknown", None)):
        view = told(congested(view_on(running=FREE_N001_N003), load=0.8), {wid: ratio})
        result = run(view, [gang(2, 8, wid=wid, estimate_s=100.0)], placement="network-aware")
        if result.admitted:
            assert leaves_of(view, nodes_of(result, wid)) == {0, 1}
            decisions[wid] = "spread"
        else:
            (waiting,) = result.rejected
            assert waiting.reason is Reason.WAITING_FOR_LOCALITY and "expected in 100 s" in waiting.message
            assert view.locality_waits == {wid: 0.0}
            decisions[wid] = "wait"
    assert decisions == {"light": "spread", "heavy": "wait", "unknown": "spread"}


def test_a_light_gang_fills_fragments_across_leaves_where_a_heavy_one_packs_a_leaf() -> None:
    """Half of n005 (leaf 2) is free beside whole nodes: the light gang takes it (less fragmentation),
    the heavy one pays for no cross-leaf traffic by staying inside leaf 0."""
    running = [busy("n004", 8, "r4", estimate_s=1e6), busy("n005", 4, "r5", estimate_s=1e6)]
    placed = {}
    for wid, ratio in (("light", 0.001), ("heavy", 3.0)):
        view = told(congested(view_on(running=running), load=0.85), {wid: ratio})
        result = run(view, [gang(3, 4, spec="none", wid=wid, estimate_s=10_000.0)], placement="network-aware")
        placed[wid] = leaves_of(view, nodes_of(result, wid))
    assert placed == {"light": {0, 2}, "heavy": {0}}


def test_a_gang_that_does_not_communicate_loses_nothing() -> None:
    view = told(congested(view_on(running=FREE_N001_N003), load=0.95), {"g": 0.0})
    result = run(view, [gang(2, 8, wid="g", estimate_s=1e9)], placement="network-aware")
    assert leaves_of(view, nodes_of(result, "g")) == {0, 1}
