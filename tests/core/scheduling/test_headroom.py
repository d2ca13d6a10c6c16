"""Serving headroom in admission: batch is admitted only while room for N more replicas of the
largest service stays free; the services' own classes use the room; headroom 0 is the cycle of before."""

from __future__ import annotations

import random
from dataclasses import replace

from factories import cluster, pod, workload
from gpupool.core.model import Allocation, ClusterSnapshot, Reason
from gpupool.core.priority import PriorityClass, PriorityClasses
from gpupool.core.scheduling.cycle import Policies, run_cycle
from gpupool.core.scheduling.headroom import Headroom, room
from gpupool.core.state import ClusterState

CLASSES = PriorityClasses((PriorityClass("normal", 0), PriorityClass("serving", 500)))
FF = Policies(placement="first-fit", priority_classes=CLASSES)
QUARTER = Headroom(replicas=2, num_devices=1, device_milli=250, exempt_classes=frozenset({"serving"}))


def _admitted(headroom: Headroom | None, *workloads: object) -> tuple[list[str], dict[str, Reason]]:
    snap = ClusterSnapshot(tuple(cluster(1, devices=2)))
    result = run_cycle(snap, list(workloads), replace(FF, headroom=headroom), 0.0,  # type: ignore[arg-type]
                       random.Random(0))
    return [a.workload_id for a in result.admitted], {r.workload_id: r.reason for r in result.rejected}


def test_room_counts_slices_by_free_compute_and_whole_devices_by_free_devices() -> None:
    state = ClusterState(cluster(2, devices=2))
    assert room(state, 1, 250) == 16
    assert room(state, 2, 1000) == 2
    assert room(state, 1, 1000) == 4


def test_batch_leaves_room_for_two_quarter_replicas() -> None:
    """Two devices: a whole-device batch fits (1.0 left, room for 4 quarters); a second would leave none."""
    first = workload(pod(1), wid="b1", submit_s=0)
    second = workload(pod(1), wid="b2", submit_s=1)
    admitted, refused = _admitted(QUARTER, first, second)
    assert admitted == ["b1"]
    assert refused == {"b2": Reason.SERVING_HEADROOM}


def test_small_batch_may_take_what_is_beyond_the_room() -> None:
    """Room for 2 quarters is 0.5 of a device: batch may take the other 1.5."""
    ws = [workload(pod(0.5), wid=f"b{i}", submit_s=i) for i in range(4)]
    admitted, refused = _admitted(QUARTER, *ws)
    assert admitted == ["b0", "b1", "b2"]
    assert refused == {"b3": Reason.SERVING_HEADROOM}


def test_the_services_class_uses_the_room_and_batch_waits_beside_it() -> None:
    replicas = [replace(workload(pod(1), wid=f"r{i}", submit_s=i), priority_class="serving") for i in (1, 2)]
    assert _admitted(QUARTER, *replicas) == (["r1", "r2"], {})
    batch = workload(pod(0.25), wid="b1", submit_s=0)
    admitted, refused = _admitted(QUARTER, batch, replicas[0])
    assert admitted == ["r1", "b1"] and refused == {}  # 0.75 left: room for 3 quarters


def test_batch_does_not_preempt_its_way_into_the_room() -> None:
    """With preemption on, the refused batch neither takes the room nor preempts lower work for it."""
    snap = ClusterSnapshot(tuple(cluster(1, devices=2)))
    low = replace(workload(pod(1), wid="low", submit_s=0), priority=-5)
    placed = run_cycle(snap, [low], FF, 0.0, random.Random(0)).admitted[0]
    running = ClusterSnapshot(snap.nodes, (Allocation(low, placed.placements, 0.0),))
    high = replace(workload(pod(1), wid="high", submit_s=1), priority=5)
    result = run_cycle(running, [high], replace(FF, preemption=True, headroom=QUARTER), 1.0, random.Random(0))
    assert (result.admitted, result.preempted) == ((), ())
    assert [(r.workload_id, r.reason) for r in result.rejected] == [("high", Reason.SERVING_HEADROOM)]


def test_batch_that_must_preempt_does_not_take_the_room_with_its_victims_devices() -> None:
    """A gang that does not fit may preempt lower batch, but not into the room: the victim's device and
    the free one together would leave no room for a whole-device replica."""
    whole = Headroom(replicas=1, num_devices=1, device_milli=1000, exempt_classes=frozenset({"serving"}))
    snap = ClusterSnapshot(tuple(cluster(1, devices=2)))
    low = replace(workload(pod(1), wid="low", submit_s=0), priority=-5)
    placed = run_cycle(snap, [low], FF, 0.0, random.Random(0)).admitted[0]
    running = ClusterSnapshot(snap.nodes, (Allocation(low, placed.placements, 0.0),))
    high = replace(workload(pod(2), wid="high", submit_s=1), priority=5)
    result = run_cycle(running, [high], replace(FF, preemption=True, headroom=whole), 1.0, random.Random(0))
    assert (result.admitted, result.preempted) == ((), ())
    [(wid, message)] = [(r.workload_id, r.message) for r in result.rejected]
    assert wid == "high" and "serving.headroom_replicas: 1" in message
    # without the headroom it preempts, as before
    result = run_cycle(running, [high], replace(FF, preemption=True), 1.0, random.Random(0))
    assert [a.workload_id for a in result.admitted] == ["high"] and len(result.preempted) == 1


def test_no_headroom_is_the_cycle_of_before() -> None:
    ws = [workload(pod(1), wid=f"b{i}", submit_s=i) for i in range(2)]
    assert _admitted(None, *ws) == (["b0", "b1"], {})
    assert _admitted(replace(QUARTER, replicas=0), *ws) == (["b0", "b1"], {})


def test_the_decision_is_deterministic() -> None:
    ws = [workload(pod(0.5), wid=f"b{i}", submit_s=i) for i in range(6)]
    assert len({repr(_admitted(QUARTER, *ws)) for _ in range(5)}) == 1
