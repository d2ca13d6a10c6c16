"""fgd-strand: FGD's fragmentation growth plus the growth of devices stranded without cpu.

FGD (see `fgd`) measures how much device capacity a placement makes unusable for the expected
pod shapes, but only through each shape's all-or-nothing fit on a node *now*. On heterogeneous
clusters the loss that FGD leaves is capacity stranded *later*: OpenB's 8-GPU nodes carry about
12 cores per GPU while the workload asks for about 14, so nodes that take cpu-heavy pods run out
of cores with devices still free, while cpu-rich nodes (2-GPU T4 nodes, 52 cores per GPU) keep
cores nobody will use.

fgd-strand prices both losses in the same unit, milli-device, and adds them:

    growth = dF + stranding_weight * dS

- dF: FGD's fragmentation growth of the node (options (a) and (b) of `fgd` apply);
- S_n = max(0, free_device_milli_n - free_cpu_milli_n / R): the device capacity node n cannot
  serve with the cpu it has left, where R is the cpu the workload asks per milli-device
  (estimated from the pods given to `prepare`, or seen so far); dS is its growth under the
  placement, so cpu-heavy pods go where cores are plentiful and cpu-light pods where they are
  scarce;
- for each multi-device pod shape of the workload (devices, cpu, memory, models), while no more
  than `reserve_empty` empty nodes could host it, breaking one of those nodes up with a smaller
  pod costs `reserve_penalty_milli` more, so the rare big gangs (e.g. 8 GPUs with 120 cores,
  which only OpenB's G3 nodes can hold) still find a node late in a run;
- an unconstrained pod placed on a device model that model-constrained pods depend on costs
  `model_pressure_weight * pressure * its device milli`, where pressure is the share of that
  model's capacity the constrained pods ask for (capped at 1), so the pods that may run anywhere
  leave scarce models to the pods that may not.

Candidates score `int(levels * sigmoid(-growth / 1000))` as in FGD (small differences tie); ties go
to the first node in node order, and on a node to the fitting device with the least free share.
Measured against `fgd` on the OpenB traces in docs/benchmarks.md.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from gpupool.core.model import PodRequest
from gpupool.core.scheduling.policies._common import FloatArray
from gpupool.core.scheduling.policies.base import Choice, NoFit, register_policy
from gpupool.core.scheduling.policies.fgd import Fgd, sigmoid
from gpupool.core.state import ClusterState, IntArray
from gpupool.core.units import MILLI


@register_policy
class FgdStrand(Fgd):
    name = "fgd-strand"
    summary = "FGD plus the growth of devices stranded without cpu; keeps a few empty nodes for big gangs."

    def __init__(
        self,
        coverage: float = 0.95,
        cpu_only_counts_all: bool = True,
        stranding_weight: float = 0.5,
        reserve_empty: int = 6,
        reserve_penalty_milli: float = 1000.0,
        levels: int = 100,
        first_on_ties: bool = True,
        model_pressure_weight: float = 1.0,
    ) -> None:
        super().__init__(coverage, cpu_only_counts_all, True, first_on_ties)
        self.stranding_weight = stranding_weight
        self.reserve_empty = reserve_empty
        self.reserve_penalty_milli = reserve_penalty_milli
        self.levels = levels
        self.model_pressure_weight = model_pressure_weight
        self._pressure: FloatArray | None = None
        self._largest_gang = 0
        self._cpu_per_milli: float | None = None
        self._seen_cpu = 0
        self._seen_milli = 0
        self._reserving: bytes | None = None
        self._protect: np.ndarray | None = None
        self._gang_shapes: list[PodRequest] = []

    # ----------------------------------------------------------------- workload

    def prepare(self, state: ClusterState, pods: Sequence[PodRequest]) -> None:
        super().prepare(state, pods)
        self._largest_gang = max((p.num_devices for p in pods), default=0)
        self._gang_shapes = _gang_shapes(pods)
        cpu = sum(p.cpu_milli for p in pods if p.num_devices)
        milli = sum(p.total_device_milli for p in pods)
        self._cpu_per_milli = cpu / milli if milli else None
        self._pressure = model_pressure(state, pods)

    def observe(self, pod: PodRequest) -> None:
        super().observe(pod)
        if pod.num_devices > 1:
            self._gang_shapes = _gang_shapes([*self._gang_shapes, pod])
        self._largest_gang = max(self._largest_gang, pod.num_devices)
        if pod.num_devices:
            self._seen_cpu += pod.cpu_milli
            self._seen_milli += pod.total_device_milli

    def cpu_per_device_milli(self) -> float | None:
        """R: cpu milli the workload asks per device milli (None before any device pod is known)."""
        if self._cpu_per_milli is not None:
            return self._cpu_per_milli
        return self._seen_cpu / self._seen_milli if self._seen_milli else None

    # ----------------------------------------------------------------- placement

    def place(self, pod: PodRequest, state: ClusterState, rng: random.Random) -> Choice | NoFit:
        protect = self._protected_nodes(state)
        key = None if protect is None else np.packbits(protect).tobytes()
        if key != self._reserving:
            # Scores are cached per node; the reserve rule changes them all at once.
            self._cache = {}
            self._reserving = key
            self._protect = protect
        return super().place(pod, state, rng)

    def _protected_nodes(self, state: ClusterState) -> np.ndarray | None:
        """Empty nodes kept for a multi-device shape that has `reserve_empty` or fewer left."""
        if self._largest_gang <= 1 or not self.reserve_penalty_milli or not self._gang_shapes:
            return None
        untouched = (state.dev_milli_free == state.dev_milli_cap).all(axis=1) & state.schedulable
        protect = np.zeros(len(state.nodes), dtype=bool)
        for shape in self._gang_shapes:
            able = untouched & self._could_host(state, shape)
            if int(able.sum()) <= self.reserve_empty:
                protect |= able
        return protect if protect.any() else None

    @staticmethod
    def _could_host(state: ClusterState, shape: PodRequest) -> np.ndarray:
        devices = state.allowed_devices(shape.allowed_models).sum(axis=1) >= shape.num_devices
        return np.asarray(devices & (state.cpu_cap >= shape.cpu_milli) & (state.mem_cap >= shape.memory_mib))

    def rank(self, pod: PodRequest, state: ClusterState, nodes: IntArray, growth: FloatArray) -> FloatArray:
        extra = self.stranding_weight * self._stranding_growth(pod, state, nodes)
        if self._protect is not None and pod.num_devices < self._largest_gang:
            extra = extra + np.where(self._protect[nodes], self.reserve_penalty_milli, 0.0)
        if self._pressure is not None and not pod.allowed_models and pod.num_devices:
            # Unconstrained pods keep off the models that model-constrained pods depend on.
            models = state.dev_model[nodes, 0]
            pressure = np.where(models >= 0, self._pressure[np.maximum(models, 0)], 0.0)
            extra = extra + self.model_pressure_weight * pressure * pod.total_device_milli
        total = growth + (extra[:, None] if growth.ndim == 2 else extra)
        score = np.floor(self.levels * sigmoid(-total / 1000.0))
        if growth.ndim == 2:
            # On a node, prefer the fitting device with the least free share (a tiny tie-break).
            score = score + 1e-6 * (1.0 - state.dev_milli_free[nodes] / MILLI)
        return np.asarray(score, dtype=np.float64)

    def _stranding_growth(self, pod: PodRequest, state: ClusterState, nodes: IntArray) -> FloatArray:
        """dS per node: growth of device milli that the node's remaining cpu cannot serve."""
        ratio = self.cpu_per_device_milli()
        if not ratio:
            return np.zeros(nodes.size, dtype=np.float64)
        cpu = state.cpu_free[nodes].astype(np.float64)
        dev = state.dev_milli_free[nodes].sum(axis=1).astype(np.float64)
        before = np.maximum(0.0, dev - cpu / ratio)
        after = np.maximum(0.0, (dev - pod.total_device_milli) - (cpu - pod.cpu_milli) / ratio)
        return np.asarray(after - before, dtype=np.float64)


def model_pressure(state: ClusterState, pods: Sequence[PodRequest]) -> FloatArray | None:
    """Per model id: the share of its capacity that model-constrained pods ask for (0..1).

    A pod allowed on k models counts 1/k of its device demand against each; None when no pod of
    the workload is constrained.
    """
    demand = np.zeros(len(state.models), dtype=np.float64)
    constrained = False
    for pod in pods:
        ids = [state.model_id[m] for m in pod.allowed_models if m in state.model_id]
        if pod.num_devices and ids:
            constrained = True
            demand[ids] += pod.total_device_milli / len(ids)
    if not constrained:
        return None
    capacity = np.array(
        [state.dev_milli_cap[state.dev_model == i].sum() for i in range(len(state.models))], dtype=np.float64
    )
    return np.asarray(np.minimum(1.0, demand / np.maximum(capacity, 1.0)), dtype=np.float64)


def _gang_shapes(pods: Sequence[PodRequest]) -> list[PodRequest]:
    """One representative of each distinct multi-device pod shape of the workload."""
    seen: dict[tuple[int, int, int, frozenset[str]], PodRequest] = {}
    for pod in pods:
        if pod.num_devices > 1:
            seen.setdefault((pod.num_devices, pod.cpu_milli, pod.memory_mib, pod.allowed_models), pod)
    return list(seen.values())
