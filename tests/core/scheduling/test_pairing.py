"""Prefill/decode pairs: a service's replicas prefer the leaf, then the spine, of its partner's
replicas on the fabric; without a fabric, or without a running partner, placement is as before."""

from __future__ import annotations

import random
from dataclasses import replace

from factories import cluster, pod, workload
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.model import Allocation, ClusterSnapshot, Node, Workload
from gpupool.core.scheduling.cycle import Policies, cycle_on, run_cycle
from gpupool.core.scheduling.topology import FabricView
from gpupool.core.scheduling.view import ClusterView

FF = Policies(placement="first-fit")  # first-fit would put everything on the first node
NODES = tuple(cluster(16, devices=1))
"""fat_tree(4, levels=3): 8 leaves of 2 nodes (n000-n001, n002-n003, ...), 4 spines of 4 nodes."""


def replica(wid: str, key: str, pair: str = "", gpus: float = 0.25, at: float = 0.0) -> Workload:
    return replace(workload(pod(gpus), wid=wid, submit_s=at), spread_key=key, pair_key=pair)


def running(w: Workload, node: str) -> Allocation:
    """`w` admitted on `node` (placed there by a cycle on that node alone)."""
    only = tuple(n for n in NODES if n.name == node)
    admitted = run_cycle(ClusterSnapshot(only), [w], FF, 0.0, random.Random(0)).admitted[0]
    return Allocation(w, admitted.placements, 0.0)


def place(allocs: tuple[Allocation, ...], pending: list[Workload], fabric: bool = True,
          nodes: tuple[Node, ...] = NODES) -> dict[str, str]:
    snapshot = ClusterSnapshot(nodes, allocs)
    view = ClusterView.from_snapshot(snapshot, FF.quota, FF.priority_classes, FF.defaults)
    if fabric:
        view.set_topology(FabricView.from_fabric(fat_tree(4, levels=3), list(nodes)))
    result = cycle_on(view, pending, FF, 0.0, random.Random(0))
    return {a.workload_id: a.placements[0].node for a in result.admitted}


DECODE = replica("d0", "t/dec", "t/pre")


def test_a_prefill_replica_goes_to_its_decode_partners_leaf() -> None:
    allocs = (running(DECODE, "n005"),)
    assert place(allocs, [replica("p0", "t/pre", "t/dec")]) == {"p0": "n004"}


def test_inside_the_leaf_replicas_still_spread_then_share() -> None:
    allocs = (running(DECODE, "n005"),)
    pending = [replica(f"p{i}", "t/pre", "t/dec", at=i) for i in range(3)]
    placed = place(allocs, pending)
    assert placed["p0"] == "n004" and placed["p1"] == "n005"  # the leaf's two nodes, one each
    assert placed["p2"] in {"n004", "n005"}  # the leaf still has room: nearer beats spread


def test_a_full_leaf_sends_it_under_the_partners_spine() -> None:
    filler = workload(pod(1.0), wid="batch")
    allocs = (running(replica("d0", "t/dec", "t/pre", gpus=1.0), "n005"), running(filler, "n004"))
    assert place(allocs, [replica("p0", "t/pre", "t/dec")]) == {"p0": "n006"}  # spine 1: n004-n007


def test_with_no_room_under_the_spine_it_goes_anywhere() -> None:
    full = tuple(running(workload(pod(1.0), wid=f"b{i}"), f"n{i:03d}") for i in range(4, 8) if i != 5)
    allocs = (running(replica("d0", "t/dec", "t/pre", gpus=1.0), "n005"), *full)
    assert place(allocs, [replica("p0", "t/pre", "t/dec")]) == {"p0": "n000"}


def test_without_a_fabric_or_a_partner_placement_is_as_before() -> None:
    allocs = (running(DECODE, "n005"),)
    assert place(allocs, [replica("p0", "t/pre", "t/dec")], fabric=False) == {"p0": "n000"}
    assert place((), [replica("p0", "t/pre", "t/dec")]) == {"p0": "n000"}
    other = replica("p0", "u/pre", "u/dec")  # another tenant's key: its partners are not these
    assert place(allocs, [other]) == {"p0": "n000"}


def test_the_same_inputs_give_the_same_placements() -> None:
    allocs = (running(DECODE, "n010"),)
    pending = [replica(f"p{i}", "t/pre", "t/dec", at=i) for i in range(4)]
    assert place(allocs, pending) == place(allocs, pending)
    assert set(place(allocs, pending).values()) <= {"n010", "n011"}
