"""Services' replicas packed onto nodes already in use, so whole nodes stay free for wide gangs
(`Policies.pack_classes`, core/scheduling/packing.py), and the replica on the emptiest node removed
first at scale-down (`emptiest_first`)."""

from __future__ import annotations

import random
from dataclasses import replace

from factories import cluster, pod, workload
from gpupool.config import PoolConfig
from gpupool.core.model import Allocation, ClusterSnapshot, Workload
from gpupool.core.scheduling.cycle import Policies, run_cycle
from gpupool.core.scheduling.packing import emptiest_first

SERVICE = "high"
PACKED = Policies(placement="first-fit", pack_classes=frozenset({SERVICE}))
PLAIN = Policies(placement="first-fit")  # first-fit takes the first node: n000, free in every test


def replica(wid: str, key: str = "", gpus: float = 1) -> Workload:
    return replace(workload(pod(gpus), wid=wid), priority_class=SERVICE, spread_key=key)


def running(nodes: tuple, placed: dict[str, tuple[Workload, str]]) -> ClusterSnapshot:
    """A snapshot with each workload running on its node (placed there by first-fit on that node alone)."""
    allocs = []
    for w, name in placed.values():
        only = tuple(n for n in nodes if n.name == name)
        result = run_cycle(ClusterSnapshot(only), [w], PLAIN, 0.0, random.Random(0))
        allocs.append(Allocation(w, result.admitted[0].placements, 0.0))
    return ClusterSnapshot(nodes, tuple(allocs))


def node_of(snapshot: ClusterSnapshot, w: Workload, policies: Policies) -> str:
    result = run_cycle(snapshot, [w], policies, 0.0, random.Random(0))
    assert len(result.admitted) == 1
    return result.admitted[0].placements[0].node


def test_a_replica_goes_to_a_node_holding_services_not_to_a_free_one() -> None:
    nodes = tuple(cluster(3, devices=4))
    snap = running(nodes, {"s": (replica("s0"), "n002"), "b": (workload(pod(1), wid="b0"), "n001")})
    assert node_of(snap, replica("r1"), PACKED) == "n002"  # the services' node before batch's
    assert node_of(snap, replica("r1"), PLAIN) == "n000"  # without the rule: the free first node


def test_a_node_in_use_comes_before_a_free_one() -> None:
    nodes = tuple(cluster(3, devices=4))
    snap = running(nodes, {"b": (workload(pod(1), wid="b0"), "n002")})
    assert node_of(snap, replica("r1"), PACKED) == "n002"


def test_a_replica_that_fits_only_on_a_free_node_goes_there() -> None:
    nodes = tuple(cluster(2, devices=2))
    snap = running(nodes, {"s": (replica("s0", gpus=2), "n001")})  # n001 full
    assert node_of(snap, replica("r1"), PACKED) == "n000"


def test_spreading_a_service_stays_the_stronger_preference() -> None:
    nodes = tuple(cluster(4, devices=4))
    snap = running(nodes, {"sib": (replica("a0", key="t/a"), "n003"),
                           "other": (replica("b0", key="t/b"), "n002"),
                           "batch": (workload(pod(1), wid="x0"), "n001")})
    # away from its sibling: the other service's node first, before batch's and the free one
    assert node_of(snap, replica("a1", key="t/a"), PACKED) == "n002"
    alone = running(nodes, {"sib": (replica("a0", key="t/a"), "n003")})
    # the only node in use holds its sibling: a free node away from it wins over packing beside it
    assert node_of(alone, replica("a1", key="t/a"), PACKED) == "n000"


def test_batch_is_placed_as_before() -> None:
    nodes = tuple(cluster(3, devices=4))
    snap = running(nodes, {"s": (replica("s0"), "n002")})
    assert node_of(snap, workload(pod(1), wid="b1"), PACKED) == "n000"


def test_packing_keeps_a_whole_node_for_a_gang() -> None:
    """Two nodes, a replica on each side of the pool: with packing the second replica joins the first,
    and an 4-device gang arriving after them still finds a whole node."""
    nodes = tuple(cluster(2, devices=4))
    snap = running(nodes, {"s": (replica("s0"), "n001")})
    gang = workload(pod(4), wid="g")
    for policies, fits in ((PACKED, True), (PLAIN, False)):
        result = run_cycle(snap, [replica("r1"), replace(gang, submit_time_s=1.0)], policies, 0.0,
                           random.Random(0))
        assert ("g" in {a.workload_id for a in result.admitted}) is fits


def test_emptiest_node_first_then_fewer_replicas_then_given_order() -> None:
    replicas = [("a", "n1"), ("b", "n2"), ("c", "n3"), ("d", "n3"), ("e", "n4")]
    used = {"n1": 6.0, "n2": 2.0, "n3": 2.0, "n4": 2.0}
    assert emptiest_first(replicas, used) == ["b", "e", "c", "d", "a"]


def test_the_configuration_packs_the_services_classes_unless_told_not_to() -> None:
    assert PoolConfig().policies().pack_classes == frozenset({"serving"})
    off = PoolConfig.model_validate({"serving": {"pack_replicas": False}})
    assert off.policies().pack_classes == frozenset()
