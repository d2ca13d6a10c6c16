"""Turn a submitted spec into the core's Workload (the one model the scheduler understands)."""

from __future__ import annotations

from gpupool.core.model import PodRequest, Workload
from gpupool.core.units import parse_cpu_milli, parse_devices, parse_memory_mib
from gpupool.server.schemas.workloads import WorkloadSpec


def pod_requests(spec: WorkloadSpec) -> tuple[PodRequest, ...]:
    """One PodRequest per replica, named by rank; raises InvalidInput for an impossible ask."""
    res = spec.resources
    count, milli = parse_devices(res.gpus)
    gpu_memory = 0 if res.gpu_memory is None else parse_memory_mib(res.gpu_memory)
    base = {
        "cpu_milli": parse_cpu_milli(res.cpu),
        "memory_mib": parse_memory_mib(res.memory),
        "num_devices": count,
        "device_milli": milli,
        "device_memory_mib": gpu_memory if count else 0,
        "allowed_models": frozenset(res.models),
    }
    return tuple(PodRequest(name=f"r{rank}", **base) for rank in range(spec.replicas))  # type: ignore[arg-type]


def to_workload(
    workload_id: str, spec: WorkloadSpec, tenant: str, priority: int, submit_s: float
) -> Workload:
    return Workload(
        id=workload_id,
        pods=pod_requests(spec),
        tenant=tenant,
        queue=spec.queue,
        priority=priority,
        submit_time_s=submit_s,
        name=spec.name,
        runtime_estimate_s=spec.runtime_estimate_s,
    )
