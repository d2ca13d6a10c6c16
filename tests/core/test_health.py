"""Eviction candidates: pods on unhealthy devices or nodes, with machine-readable reasons."""

from __future__ import annotations

from dataclasses import replace

from factories import node, pod, workload
from gpupool.core.health import unhealthy_evictions
from gpupool.core.model import Allocation, ClusterSnapshot, PodPlacement, Reason, Slice


def test_only_pods_on_unhealthy_hardware_are_listed() -> None:
    sick_device = node("a", devices=2)
    sick_device = replace(sick_device, devices=(sick_device.devices[0],
                                                replace(sick_device.devices[1], healthy=False)))
    sick_node = replace(node("b", devices=2), healthy=False)
    w1, w2, w3 = workload(pod(0.5), wid="w1"), workload(pod(0.5), wid="w2"), workload(pod(0), wid="w3")
    allocations = (
        Allocation(w1, (PodPlacement(w1.pods[0].name, "a", (Slice(1, 500),)),)),
        Allocation(w2, (PodPlacement(w2.pods[0].name, "a", (Slice(0, 500),)),)),
        Allocation(w3, (PodPlacement(w3.pods[0].name, "b", ()),)),
    )
    evictions = unhealthy_evictions(ClusterSnapshot((sick_device, sick_node), allocations))
    assert [(e.workload_id, e.node, e.reason) for e in evictions] == [
        ("w1", "a", Reason.EVICTED_UNHEALTHY), ("w3", "b", Reason.EVICTED_UNHEALTHY)]
    assert evictions[0].device_uuids == (sick_device.devices[1].uuid,)
    assert "unhealthy" in evictions[0].message and "node b" in evictions[1].message


def test_healthy_cluster_evicts_nothing() -> None:
    w = workload(pod(1), wid="w")
    placed = Allocation(w, (PodPlacement(w.pods[0].name, "a", (Slice(0, 1000),)),))
    snapshot = ClusterSnapshot((node("a"),), (placed,))
    assert unhealthy_evictions(snapshot) == []
