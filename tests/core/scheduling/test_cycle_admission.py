"""run_cycle's admission steps: quota rejections, unknown names, evictions from a snapshot, overcommit."""

from __future__ import annotations

import random
from dataclasses import replace

from factories import cluster, pod, workload
from gpupool.core.model import Allocation, ClusterSnapshot, Reason
from gpupool.core.overcommit import ModelRatio, OvercommitConfig
from gpupool.core.quota import DEVICE_MILLI, ClusterQueue, QuotaConfig, ResourceQuota
from gpupool.core.scheduling.cycle import EventKind, Policies, run_cycle

FF = Policies(placement="first-fit")
QUOTA = QuotaConfig(cluster_queues=(ClusterQueue("t", {DEVICE_MILLI: ResourceQuota(2000)}),))


def _cycle(snapshot: ClusterSnapshot, pending: list, policies: Policies = FF):  # type: ignore[no-untyped-def]
    return run_cycle(snapshot, pending, policies, 100.0, random.Random(0))


def test_quota_caps_admission_and_refuses_what_never_fits() -> None:
    snap = ClusterSnapshot(tuple(cluster(1, devices=8)))
    ws = [workload(pod(1), wid=f"w{i}", submit_s=i, tenant="t") for i in range(3)]
    ws.append(workload(pod(3), wid="huge", tenant="t"))
    result = _cycle(snap, ws, replace(FF, quota=QUOTA))
    assert [a.workload_id for a in result.admitted] == ["w0", "w1"]
    reasons = {r.workload_id: (r.reason, r.final) for r in result.rejected}
    assert reasons["w2"] == (Reason.QUOTA_EXCEEDED, False)
    assert reasons["huge"] == (Reason.QUOTA_EXCEEDED, True)


def test_unknown_queue_and_priority_class_are_final() -> None:
    snap = ClusterSnapshot(tuple(cluster(1)))
    lost = workload(wid="lost", tenant="nobody")
    odd = replace(workload(wid="odd", tenant="t"), priority_class="urgent!!")
    result = _cycle(snap, [lost, odd], replace(FF, quota=QUOTA))
    reasons = {r.workload_id: (r.reason, r.final) for r in result.rejected}
    assert reasons == {
        "lost": (Reason.UNKNOWN_QUEUE, True),
        "odd": (Reason.UNKNOWN_PRIORITY_CLASS, True),
    }


def test_work_on_an_unhealthy_device_is_evicted_and_requeued() -> None:
    nodes = cluster(2, devices=1)
    w = replace(workload(pod(1), wid="victim"), checkpoint_interval_s=30.0)
    placed = run_cycle(ClusterSnapshot(tuple(nodes)), [w], FF, 0.0, random.Random(0)).admitted[0]
    broken = replace(nodes[0], devices=(replace(nodes[0].devices[0], healthy=False),))
    assert placed.placements[0].node == nodes[0].name
    snap = ClusterSnapshot((broken, nodes[1]), (Allocation(w, placed.placements, 0.0),))
    result = _cycle(snap, [])
    stop = result.preempted[0]
    assert (stop.kind, stop.reason, stop.lost_work_s) == (EventKind.EVICT, Reason.EVICTED_UNHEALTHY, 10.0)
    assert result.requeued[0].resume_progress_s == 90.0
    again = _cycle(ClusterSnapshot((broken, nodes[1])), [w])
    assert again.admitted[0].placements[0].node == nodes[1].name  # placed elsewhere


def test_overcommit_reserves_guaranteed_parts() -> None:
    snap = ClusterSnapshot(tuple(cluster(1, devices=1)))
    ws = [workload(pod(0.6), wid=f"w{i}") for i in range(3)]
    plain = _cycle(snap, ws)
    both = OvercommitConfig({"*": ModelRatio(compute=2.0, memory=2.0)})
    over = _cycle(snap, ws, replace(FF, overcommit=both))
    assert len(plain.admitted) == 1
    assert len(over.admitted) == 3
    held = over.admitted[0].placements[0].slices[0]
    assert (held.compute_milli, held.memory_mib) == (300, 32_768 * 300 // 1000)


def test_overcommitted_compute_leaves_default_memory_whole() -> None:
    # Compute oversubscribed, memory not: each 0.6 slice still holds 0.6 of the device's memory
    # (its default share), so a second one does not fit although its compute would.
    snap = ClusterSnapshot(tuple(cluster(1, devices=1)))
    ws = [workload(pod(0.6), wid=f"w{i}") for i in range(3)]
    over = _cycle(snap, ws, replace(FF, overcommit=OvercommitConfig({"*": ModelRatio(compute=2.0)})))
    assert len(over.admitted) == 1
    held = over.admitted[0].placements[0].slices[0]
    assert (held.compute_milli, held.memory_mib) == (300, 32_768 * 600 // 1000)
