"""Topology constraints on gangs (required, preferred, slice), fullest domain first; no fabric, no change."""

from __future__ import annotations

import dataclasses
import random

import pytest
from net_helpers import busy, gang, leaves_of, nodes_of, run, two_level, view_on

from factories import cluster
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.model import Allocation, ClusterSnapshot, Reason
from gpupool.core.scheduling.cycle import Policies
from gpupool.core.scheduling.keeper import ViewKeeper
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.topology_spec import Tier, TopologySpec

POLICIES = ("fgd-strand", "network-aware", "best-fit")
"""The default pod-by-pod policy, the network-aware one, and a plain one: constraints bind them all."""

ONE_PER_LEAF_BUSY = [busy(n, 8, f"r{n}") for n in ("n000", "n002", "n004", "n006")]
"""Every leaf has one of its two nodes full: no leaf can take a 2-node gang, the spine can."""


@pytest.mark.parametrize("policy", POLICIES)
def test_required_leaf_keeps_the_gang_in_one_leaf(policy: str) -> None:
    view = view_on()
    result = run(view, [gang(2, 8, "required=leaf")], placement=policy)
    assert len(leaves_of(view, nodes_of(result, "g"))) == 1


@pytest.mark.parametrize("policy", POLICIES)
def test_required_leaf_waits_when_no_leaf_has_room_and_preferred_widens(policy: str) -> None:
    view = view_on(running=ONE_PER_LEAF_BUSY)
    result = run(view, [gang(2, 8, "required=leaf", wid="req"), gang(2, 8, "preferred=leaf", wid="pref")],
                 placement=policy)
    waiting = {r.workload_id: r for r in result.rejected}
    assert waiting["req"].reason is Reason.NO_DOMAIN_FITS and not waiting["req"].final
    assert len(leaves_of(view, nodes_of(result, "pref"))) == 2  # widened to the spine


@pytest.mark.parametrize("policy", POLICIES)
def test_a_gang_larger_than_any_leaf_never_fits_required_leaf_but_fits_the_spine(policy: str) -> None:
    view = view_on()
    result = run(view, [gang(3, 8, "required=leaf", wid="leaf"), gang(3, 8, "required=spine", wid="spine")],
                 placement=policy)
    refused = {r.workload_id: r for r in result.rejected}
    assert refused["leaf"].reason is Reason.NEVER_FITS and refused["leaf"].final
    assert "No leaf has room for the whole 3-pod gang" in refused["leaf"].message
    assert len(nodes_of(result, "spine")) == 3


@pytest.mark.parametrize("policy", POLICIES)
def test_slices_keep_each_group_of_pods_in_one_leaf(policy: str) -> None:
    view = view_on(running=[busy("n000", 8, "r0")])  # leaf 0 has one node left
    result = run(view, [gang(4, 8, "slice=2@leaf")], placement=policy)
    placed = nodes_of(result, "g")
    assert len(leaves_of(view, placed[:2])) == 1 and len(leaves_of(view, placed[2:])) == 1
    assert "n001" not in placed  # a lone node cannot hold a pair


@pytest.mark.parametrize("policy", POLICIES)
def test_the_fullest_leaf_that_fits_is_chosen(policy: str) -> None:
    # 8 leaves of 4 nodes: leaf 2 (n008-n011) is the fullest that still holds two whole nodes,
    # leaf 3 (n012-n015) is too full, the others are empty.
    running = [busy(n, 8, f"r{n}") for n in ("n008", "n009", "n012", "n013", "n014")]
    view = view_on(cluster(32), running, fat_tree(8, levels=2))
    result = run(view, [gang(2, 8, "required=leaf")], placement=policy)
    assert leaves_of(view, nodes_of(result, "g")) == {2}


def test_the_default_constraint_applies_to_multi_pod_gangs_only() -> None:
    view = view_on()
    default = TopologySpec(required=Tier.LEAF)
    result = run(view, [gang(3, 8, wid="big"), gang(1, 8, wid="single")], topology_default=default)
    refused = {r.workload_id: r.reason for r in result.rejected}
    assert refused == {"big": Reason.NEVER_FITS}
    assert nodes_of(result, "single")


@pytest.mark.parametrize("policy", POLICIES)
def test_without_a_fabric_constraints_change_nothing(policy: str) -> None:
    """No fabric known: gangs with or without a constraint are placed exactly as before."""
    def decisions(spec: str | None) -> list[tuple[str, tuple[str, ...]]]:
        view = ClusterView.empty(cluster(8))
        pending = [gang(n, 8, spec, wid=f"g{n}") for n in (3, 2, 2)]
        pending = [dataclasses.replace(w, id=f"{w.id}-{i}") for i, w in enumerate(pending)]
        result = run(view, pending, placement=policy)
        return [(a.workload_id, tuple(p.node for p in a.placements)) for a in result.admitted]

    assert decisions("required=leaf") == decisions(None) == decisions("slice=1@leaf")
    assert len(decisions(None)) == 3


def test_the_view_keeper_places_by_its_fabric_across_rebuilds() -> None:
    keeper = ViewKeeper()
    keeper.set_fabric(two_level())
    nodes = tuple(cluster(8))
    pending = [gang(2, 8, "required=leaf")]
    result = keeper.cycle(ClusterSnapshot(nodes), pending, Policies(), 0.0, random.Random(0))
    (admitted,) = result.admitted
    assert keeper.view is not None and keeper.topology is not None
    assert len(leaves_of(keeper.view, [p.node for p in admitted.placements])) == 1
    assert set(keeper.topology.gangs) == {"g"}
    running = Allocation(gang(2, 8, "required=leaf"), admitted.placements)
    cordoned = (dataclasses.replace(nodes[0], cordoned=True), *nodes[1:])  # a node change: rebuilt
    keeper.cycle(ClusterSnapshot(cordoned, (running,)), [], Policies(), 1.0, random.Random(0))
    assert keeper.rebuilds == 2 and keeper.view.topology is keeper.topology
    assert set(keeper.topology.gangs) == {"g"}
