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
- with `reserve_expected` (off here, on in `fgd-plan`), the reserve is per shape and demand-aware:
  it counts the nodes that can hold the shape *now* (devices, cpu and memory free), keeps them
  while there are no more than the larger of `reserve_empty` and the shape's expected arrivals
  still to come (its count in the workload scaled to one cluster's worth of device demand, minus
  those seen), and prices only a placement that would leave a kept node unable to hold its shape;
- an unconstrained pod placed on a device model that model-constrained pods depend on costs
  `model_pressure_weight * pressure * its device milli`, where pressure is the share of that
  model's capacity the constrained pods ask for (capped at 1), so the pods that may run anywhere
  leave scarce models to the pods that may not.

Candidates score `int(levels * sigmoid(-growth / 1000))` as in FGD (small differences tie); ties go
to the first node in node order, and on a node to the fitting device with the least free share.
Measured against `fgd` on the OpenB traces in docs/benchmarks.md.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence

import numpy as np

from gpupool.core.model import Labels, PodRequest, SliceDefaults
from gpupool.core.scheduling.policies._common import FloatArray
from gpupool.core.scheduling.policies.base import Choice, NoFit, fits_or_nofit, register_policy
from gpupool.core.scheduling.policies.fgd import Fgd, sigmoid
from gpupool.core.state import ClusterState, IntArray, Need, at_nodes, row_counts, row_sums, rows_all
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
        reserve_expected: bool = False,
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
        self._hosts_of: ClusterState | None = None
        self._hosts_for: SliceDefaults | None = None
        self._hosts: dict[GangKey, np.ndarray] = {}
        self._hosts_pool: tuple[tuple[object, ...], tuple[bytes, ...]] | None = None
        """What the host caches were computed from (`_pool_of`)."""
        self.reserve_expected = reserve_expected
        self._expected: dict[GangKey, float] = {}
        self._arrived: Counter[GangKey] = Counter()
        self._protect_for: dict[GangKey, np.ndarray] = {}
        self._whole: dict[tuple[frozenset[str], Labels], IntArray] = {}
        self._host_rows = np.zeros((0, 0), dtype=bool)
        self._shape_cpu = self._shape_mem = self._shape_devices = np.zeros((0, 1), dtype=np.int64)

    # ----------------------------------------------------------------- workload

    def prepare(self, state: ClusterState, pods: Sequence[PodRequest]) -> None:
        super().prepare(state, pods)
        self._largest_gang = max((p.num_devices for p in pods), default=0)
        self._gang_shapes = _gang_shapes(pods)
        cpu = sum(p.cpu_milli for p in pods if p.num_devices)
        milli = sum(p.total_device_milli for p in pods)
        self._cpu_per_milli = cpu / milli if milli else None
        self._pressure = model_pressure(state, pods)
        self._arrived = Counter()
        demand = sum(p.total_device_milli for p in pods)
        gangs = Counter(_gang_key(p) for p in pods if p.num_devices > 1)
        # How many of each gang shape one cluster's worth of this workload brings.
        scale = state.total_device_milli / demand if demand else 0.0
        self._expected = {k: n * scale for k, n in gangs.items()}

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
        if pod.num_devices > 1:
            self._arrived[_gang_key(pod)] += 1
        feasible = fits_or_nofit(pod, state)
        if isinstance(feasible, NoFit):
            # Fgd.place's answer, before the reserve rule: what that computes is read only by the
            # scores of feasible nodes, and the next call computes it again (the score cache is
            # dropped when the nodes it keeps differ from those the cache was made under).
            return feasible
        self._whole = {}
        protect = self._protected_nodes(state)
        key = None if protect is None else np.packbits(protect).tobytes()
        if key is not None and self.reserve_expected:
            key += b"".join(np.packbits(m).tobytes() for m in self._protect_for.values())
        if key != self._reserving:
            # Scores are cached per node; the reserve rule changes them all at once.
            self._cache = {}
            self._reserving = key
            self._protect = protect
        return self._place_feasible(pod, state, rng, feasible)

    def counts_failed_calls(self) -> bool:
        return self.reserve_expected  # every call with a gang pod counts as its arrival (see place)

    def is_repeatable(self) -> bool:
        return super().is_repeatable() and not self.reserve_expected

    def _protected_nodes(self, state: ClusterState) -> np.ndarray | None:
        """Empty nodes kept for multi-device shapes that have few left (see the module docstring)."""
        if self._largest_gang <= 1 or not self.reserve_penalty_milli or not self._gang_shapes:
            return None
        if self.reserve_expected:
            return self._protected_by_demand(state)
        untouched = rows_all(state.dev_milli_free == state.dev_milli_cap) & state.schedulable
        protect = np.zeros(len(state.nodes), dtype=bool)
        self._protect_for = {}
        if self._hosts_stale(state):  # which nodes could ever host a shape depends on capacity only
            self._new_hosts(state)
        for shape in self._gang_shapes:
            key = _gang_key(shape)
            hosts = self._hosts.get(key)
            if hosts is None:
                hosts = self._hosts[key] = self._could_host(state, shape)
            able = untouched & hosts
            if np.count_nonzero(able) <= self.reserve_empty:
                protect |= able
                self._protect_for[key] = able
        return protect if protect.any() else None

    def _protected_by_demand(self, state: ClusterState) -> np.ndarray | None:
        """Nodes that can hold a gang shape now (devices, cpu, memory), kept while no more of them
        are left than the larger of `reserve_empty` and the shape's expected arrivals still to come."""
        shapes = self._gang_shapes
        if self._hosts_stale(state) or len(self._host_rows) != len(shapes):
            self._new_hosts(state)
            self._host_rows = np.array([self._could_host(state, g) for g in shapes])
            n = len(state.nodes)
            self._shape_cpu = _rows([state.cpu_need(g) for g in shapes], n)
            self._shape_mem = _rows([state.mem_need(g) for g in shapes], n)
            self._shape_devices = np.array([g.num_devices for g in shapes], dtype=np.int64)[:, None]
        whole = np.array([self._whole_free(state, g.allowed_models, g.node_labels) for g in shapes])
        able = (
            self._host_rows
            & state.schedulable
            & (state.cpu_free >= self._shape_cpu)
            & (state.mem_free >= self._shape_mem)
            & (whole >= self._shape_devices)
        )
        to_come = [self._expected.get(_gang_key(g), 0.0) - self._arrived[_gang_key(g)] for g in shapes]
        keep = np.array([max(self.reserve_empty, math.ceil(n)) for n in to_come])
        kept = able.sum(axis=1) <= keep
        self._protect_for = {_gang_key(shapes[i]): able[i] for i in np.flatnonzero(kept)}
        protect = able[kept].any(axis=0)
        return protect if protect.any() else None

    def _new_hosts(self, state: ClusterState) -> None:
        """Empty the per-shape host caches, made from now on for `state`'s pool."""
        self._hosts_of, self._hosts_for, self._hosts = state, state.defaults, {}
        self._hosts_pool = _pool_of(state)

    def _hosts_stale(self, state: ClusterState) -> bool:
        """The per-shape host caches were built for another pool or other slice defaults. Another
        state object with the same pool (a copy: the shadow a reservation is searched on) keeps
        them: what they read is the same (`_pool_of`)."""
        if self._hosts_of is state and self._hosts_for is state.defaults:
            return False
        if self._hosts_pool is None or not keep_hosts or not _same_pool(self._hosts_pool, _pool_of(state)):
            return True
        self._hosts_of = state
        return False

    def _whole_free(
        self, state: ClusterState, models: frozenset[str], labels: Labels = frozenset()
    ) -> IntArray:
        """[node] whole free devices of the given models (all: empty set) on nodes with the labels;
        valid during one place()."""
        whole = self._whole.get((models, labels))
        if whole is None:
            free = (state.dev_milli_free == state.dev_milli_cap) & state.allowed_devices(models, labels)
            whole = self._whole[(models, labels)] = row_counts(free)
        return whole

    def _room_for(
        self, state: ClusterState, shape: PodRequest, nodes: IntArray | None, cpu: Need = 0, mem: Need = 0,
        devices: int = 0,
    ) -> np.ndarray:
        """[nodes] whether `shape` would still fit once cpu, memory and whole devices are taken."""
        whole = self._whole_free(state, shape.allowed_models, shape.node_labels)
        sel = slice(None) if nodes is None else nodes
        return np.asarray(
            (state.cpu_free[sel] - cpu >= at_nodes(state.cpu_need(shape), sel))
            & (state.mem_free[sel] - mem >= at_nodes(state.mem_need(shape), sel))
            & (whole[sel] - devices >= shape.num_devices)
        )

    @staticmethod
    def _could_host(state: ClusterState, shape: PodRequest) -> np.ndarray:
        allowed = state.allowed_devices(shape.allowed_models, shape.node_labels)
        devices = allowed.sum(axis=1) >= shape.num_devices
        cpu, mem = state.cpu_need(shape), state.mem_need(shape)
        return np.asarray(devices & (state.cpu_cap >= cpu) & (state.mem_cap >= mem))

    def rank(self, pod: PodRequest, state: ClusterState, nodes: IntArray, growth: FloatArray) -> FloatArray:
        extra = self.stranding_weight * self._stranding_growth(pod, state, nodes)
        if self._protect is not None and self.reserve_expected:
            # Priced only where the pod would leave a kept node unable to hold the shape kept for.
            own = _gang_key(pod) if pod.num_devices > 1 else None
            breaks = np.zeros(nodes.size, dtype=bool)
            for shape in self._gang_shapes:
                key = _gang_key(shape)
                kept = self._protect_for.get(key)
                if kept is None or key == own or not kept[nodes].any():
                    continue
                cpu, mem = at_nodes(state.cpu_need(pod), nodes), at_nodes(state.mem_need(pod), nodes)
                room = self._room_for(state, shape, nodes, cpu, mem, pod.num_devices)
                breaks |= kept[nodes] & ~room
            extra = extra + np.where(breaks, self.reserve_penalty_milli, 0.0)
        elif self._protect is not None and pod.num_devices < self._largest_gang:
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
        dev = row_sums(state.dev_milli_free[nodes]).astype(np.float64)
        before = np.maximum(0.0, dev - cpu / ratio)
        taken = at_nodes(state.cpu_need(pod), nodes)
        after = np.maximum(0.0, (dev - pod.total_device_milli) - (cpu - taken) / ratio)
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


def _rows(needs: list[Need], n: int) -> IntArray:
    """[shape, 1] when every need is a number, else [shape, node]."""
    if all(isinstance(x, int) for x in needs):
        return np.array(needs, dtype=np.int64)[:, None]
    return np.stack([np.broadcast_to(np.asarray(x, dtype=np.int64), (n,)) for x in needs])


GangKey = tuple[int, int, int, frozenset[str], Labels]


keep_hosts = True
"""Keep the per-shape host caches for a copy of the state they were made on (`_hosts_stale`);
False: made again for every other state object (the same masks, slower: kept to check that claim)."""


def _pool_of(state: ClusterState) -> tuple[tuple[object, ...], tuple[bytes, ...]]:
    """What `_could_host` and the slice defaults' needs read of a state: its nodes (their labels),
    devices (validity, models, counts: shared by every copy of a pool's state) and slice defaults,
    compared as objects; its cpu and memory capacity (copied with the state), by content."""
    return ((state.nodes, state.dev_valid, state.dev_model, state.dev_count, state.model_id, state.defaults),
            (state.cpu_cap.tobytes(), state.mem_cap.tobytes()))


def _same_pool(a: tuple[tuple[object, ...], tuple[bytes, ...]],
               b: tuple[tuple[object, ...], tuple[bytes, ...]]) -> bool:
    return all(x is y for x, y in zip(a[0], b[0], strict=True)) and a[1] == b[1]


def _gang_key(pod: PodRequest) -> GangKey:
    return (pod.num_devices, pod.cpu_milli, pod.memory_mib, pod.allowed_models, pod.node_labels)


def _gang_shapes(pods: Sequence[PodRequest]) -> list[PodRequest]:
    """One representative of each distinct multi-device pod shape of the workload."""
    seen: dict[GangKey, PodRequest] = {}
    for pod in pods:
        if pod.num_devices > 1:
            seen.setdefault(_gang_key(pod), pod)
    return list(seen.values())
