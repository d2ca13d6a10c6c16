"""Oversubscription of shared devices: guaranteed part, burst limit and the slowdown it causes.

An operator sets, per device model, a compute ratio (time-sharing) and a device-memory ratio
(spill to host memory), both >= 1. A fractional pod's request is its *burst limit*; the scheduler
reserves only its *guaranteed part* = ceil(request / ratio), so up to `ratio` times more requested
work fits on a device. Whole-device pods are never oversubscribed (they keep the device). A
fractional pod without device memory holds its compute share of the device's memory by default
(`SliceDefaults`); that share is its memory request here, reserved divided by the memory ratio.

Slowdown of a device d holding slices s with burst compute b_s and burst memory m_s, physical
memory M_d (docs/admission.md has the derivation):

    compute_factor(d) = max(1, sum_s b_s / 1000)
    memory_factor(d)  = 1 + spill_penalty * max(0, sum_s m_s - M_d) / sum_s m_s
    slowdown(d)       = compute_factor(d) * memory_factor(d)

A workload runs at the pace of its slowest device: rate = 1 / max over its devices of slowdown(d).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpupool.core.model import PodRequest, Workload
from gpupool.core.units import MILLI
from gpupool.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class ModelRatio:
    """Oversubscription ratios of one device model (1.0 = no oversubscription)."""

    compute: float = 1.0
    memory: float = 1.0

    def __post_init__(self) -> None:
        if self.compute < 1.0 or self.memory < 1.0:
            raise InvalidInput("Oversubscription ratios must be >= 1.0 (1.0 means none).")


@dataclass(frozen=True, slots=True)
class OvercommitConfig:
    """Ratios per device model ('*' applies to models not named) and the host-spill penalty."""

    ratios: Mapping[str, ModelRatio] = field(default_factory=dict)
    spill_penalty: float = 4.0

    def ratio(self, model: str) -> ModelRatio:
        return self.ratios.get(model) or self.ratios.get("*") or ModelRatio()

    def pod_ratio(self, pod: PodRequest, models: Iterable[str]) -> ModelRatio:
        """The most conservative ratio among the models the pod may land on."""
        allowed = [m for m in models if pod.allows(m)]
        if not allowed:
            return ModelRatio()
        ratios = [self.ratio(m) for m in allowed]
        return ModelRatio(min(r.compute for r in ratios), min(r.memory for r in ratios))


def guaranteed_pod(pod: PodRequest, config: OvercommitConfig, models: Iterable[str]) -> PodRequest:
    """The pod the scheduler reserves: a fractional pod shrinks to its guaranteed part."""
    if not pod.is_fractional:
        return pod
    r = config.pod_ratio(pod, models)
    if r.compute == 1.0 and r.memory == 1.0:
        return pod
    milli = max(1, math.ceil(pod.device_milli / r.compute))
    # A slice with the default (proportional) memory keeps its memory share divided by the memory
    # ratio, not by the compute ratio its compute share shrank with.
    share = math.ceil((pod.memory_share_milli or pod.device_milli) / r.memory)
    return replace(
        pod,
        device_milli=milli,
        device_memory_mib=math.ceil(pod.device_memory_mib / r.memory),
        memory_share_milli=0 if pod.device_memory_mib or share == milli else share,
    )


def guaranteed_workload(w: Workload, config: OvercommitConfig, models: Iterable[str]) -> Workload:
    models = tuple(models)
    pods = tuple(guaranteed_pod(p, config, models) for p in w.pods)
    return w if pods == w.pods else replace(w, pods=pods)


def device_slowdown(
    burst_milli: Iterable[int],
    burst_memory_mib: Iterable[int],
    physical_memory_mib: int,
    spill_penalty: float,
) -> float:
    """The slowdown of one device given the burst compute and memory of the slices on it."""
    compute = max(1.0, sum(burst_milli) / MILLI)
    mem = sum(burst_memory_mib)
    memory = 1.0
    if physical_memory_mib > 0 and mem > physical_memory_mib:
        memory = 1.0 + spill_penalty * (mem - physical_memory_mib) / mem
    return compute * memory
