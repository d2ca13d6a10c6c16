"""Replicas of one service spread over nodes by preference: away from their siblings where they fit,
beside them where nothing else fits; other work is placed as before."""

from __future__ import annotations

import random
from dataclasses import replace

from factories import cluster, pod, workload
from gpupool.core.model import Allocation, ClusterSnapshot, Workload
from gpupool.core.scheduling.cycle import Policies, run_cycle

FF = Policies(placement="first-fit")  # first-fit would stack them all on the first node


def replica(i: int, key: str = "t/web") -> Workload:
    return replace(workload(pod(0.25), wid=f"r{i}", submit_s=i), spread_key=key)


def nodes_of(snapshot: ClusterSnapshot, pending: list[Workload]) -> dict[str, str]:
    result = run_cycle(snapshot, pending, FF, 0.0, random.Random(0))
    return {a.workload_id: a.placements[0].node for a in result.admitted}


def test_replicas_admitted_together_land_on_different_nodes() -> None:
    placed = nodes_of(ClusterSnapshot(tuple(cluster(3, devices=1))), [replica(i) for i in range(3)])
    assert sorted(placed.values()) == ["n000", "n001", "n002"]


def test_a_replica_avoids_the_node_of_a_running_sibling() -> None:
    nodes = tuple(cluster(2, devices=1))
    sibling = replica(0)
    first = run_cycle(ClusterSnapshot(nodes), [sibling], FF, 0.0, random.Random(0)).admitted[0]
    running = ClusterSnapshot(nodes, (Allocation(sibling, first.placements, 0.0),))
    assert first.placements[0].node == "n000"
    assert nodes_of(running, [replica(1)]) == {"r1": "n001"}
    other = nodes_of(running, [replica(1, key="t/other")])
    assert other == {"r1": "n000"}  # another service's replica is not held apart from it


def test_with_one_node_replicas_share_it() -> None:
    placed = nodes_of(ClusterSnapshot(tuple(cluster(1, devices=1))), [replica(i) for i in range(3)])
    assert set(placed.values()) == {"n000"} and len(placed) == 3


def test_work_without_a_key_is_placed_as_before() -> None:
    batch = [workload(pod(0.25), wid=f"b{i}", submit_s=i) for i in range(3)]
    assert set(nodes_of(ClusterSnapshot(tuple(cluster(3, devices=1))), batch).values()) == {"n000"}
