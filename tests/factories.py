"""Builders for the tests: small clusters, pods and workloads with sensible defaults."""

from __future__ import annotations

import itertools

from gpupool.core.model import Device, Node, PodRequest, Workload

ISSUE_CONFIG = """\
scheduling:
  placement: fgd-strand
  ordering: drf
  preemption: true
  backfill: true
priority_classes:
  - {name: low, value: 0, preemptible: true, grace: 5s}
  - {name: high, value: 1000}
"""
"""The pool configuration the live-scheduler issue requires be accepted as written."""


_ids = itertools.count()

POLICY_NAMES = (
    "random",
    "first-fit",
    "best-fit",
    "worst-fit",
    "dot-product",
    "gpu-packing",
    "gpu-clustering",
    "fgd",
    "fgd-balance",
    "fgd-strand",
    "fgd-plan",
    "network-aware",
)
"""Every built-in placement policy; the policy tests run each of them."""


def node(
    name: str = "",
    *,
    devices: int = 8,
    model: str = "V100M32",
    cpu_milli: int = 64_000,
    memory_mib: int = 262_144,
    device_memory_mib: int = 32_768,
) -> Node:
    name = name or f"node-{next(_ids)}"
    devs = tuple(
        Device(uuid=f"{name}-dev{i}", model=model, index=i, memory_mib=device_memory_mib)
        for i in range(devices)
    )
    return Node(name=name, cpu_milli=cpu_milli, memory_mib=memory_mib, devices=devs)


def cluster(count: int, **kwargs: object) -> list[Node]:
    return [node(f"n{i:03d}", **kwargs) for i in range(count)]  # type: ignore[arg-type]


def pod(
    gpus: float = 1,
    *,
    cpu_milli: int = 1000,
    memory_mib: int = 1024,
    device_memory_mib: int = 0,
    models: frozenset[str] = frozenset(),
    name: str = "",
) -> PodRequest:
    if gpus <= 0:
        num, milli = 0, 0
    elif gpus < 1:
        num, milli = 1, round(gpus * 1000)
    else:
        num, milli = int(gpus), 1000
    return PodRequest(
        name=name or f"pod-{next(_ids)}",
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        num_devices=num,
        device_milli=milli,
        device_memory_mib=device_memory_mib,
        allowed_models=models,
    )


def workload(*pods: PodRequest, wid: str = "", priority: int = 0, submit_s: float = 0.0,
             tenant: str = "default") -> Workload:
    return Workload(
        id=wid or f"w-{next(_ids)}",
        pods=pods or (pod(),),
        priority=priority,
        submit_time_s=submit_s,
        tenant=tenant,
    )


def pod_python() -> str:
    """A Python a pod can run: the system's (pods may run as other accounts, and this test run's
    interpreter may live in a directory only its owner can enter), else this one."""
    import shutil
    import sys

    from gpupool.agent.identity import BASE_PATH

    return shutil.which("python3", path=BASE_PATH) or sys.executable
