"""FGD's fragmentation measure: a workload's shape mix and each node's expected unusable devices.

For a pod shape m, node n's fragment F_n(m) is the free device capacity that m cannot use: all of
it when m does not fit on n at all (cpu, memory, device model, device count), otherwise the free
capacity of every device whose free share is below what m needs from one device. With shape
popularities p_m, F_n(M) = sum_m p_m F_n(m) = free_n - sum_m p_m U_n(m), where U_n(m) is the free
capacity m can use. `FragModel` keeps the per-shape counts and sums behind U for every node and
updates only the nodes whose `ClusterState.node_version` changed, and evaluates the fragment a node
would have after a hypothetical placement without copying the state. Cpu and memory are the
effective amounts (`ClusterState.cpu_need`): a shape that names none needs its default share, which
may differ per node.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpupool.core.model import Labels, PodRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray, Need, at_nodes, row_sums, rows_all

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Shape:
    """What a pod asks for, without its name: the unit FGD's workload distribution counts."""

    cpu_milli: int
    memory_mib: int
    num_devices: int
    device_milli: int
    allowed_models: frozenset[str] = frozenset()
    node_labels: Labels = frozenset()


def shape_of(pod: PodRequest) -> Shape:
    return Shape(
        pod.cpu_milli, pod.memory_mib, pod.num_devices, pod.device_milli, pod.allowed_models, pod.node_labels
    )


def pod_of(shape: Shape) -> PodRequest:
    """A pod of the shape (to ask the state what it needs)."""
    return PodRequest(
        "shape", shape.cpu_milli, shape.memory_mib, shape.num_devices, shape.device_milli,
        allowed_models=shape.allowed_models, node_labels=shape.node_labels,
    )


@dataclass(frozen=True, slots=True)
class ShapeMix:
    """Pod shapes and their popularity (weights sum to 1)."""

    shapes: tuple[Shape, ...]
    weights: tuple[float, ...]


def estimate_mix(pods: Iterable[PodRequest], coverage: float = 0.95) -> ShapeMix:
    """The most popular shapes that together cover `coverage` of the pods, re-weighted to sum to 1.

    Shapes are taken in decreasing count (ties: first seen first) until the covered share reaches
    `coverage`; coverage >= 1 keeps every shape.
    """
    counts = Counter(shape_of(p) for p in pods)
    total = sum(counts.values())
    if not total:
        return ShapeMix((), ())
    kept: list[tuple[Shape, int]] = []
    covered = 0
    for shape, count in counts.most_common():
        kept.append((shape, count))
        covered += count
        if covered >= coverage * total:
            break
    return ShapeMix(tuple(s for s, _ in kept), tuple(c / covered for _, c in kept))


class FragModel:
    """Per-node fragmentation of one ClusterState under one ShapeMix, kept up to date incrementally."""

    def __init__(self, state: ClusterState, mix: ShapeMix, cpu_only_counts_all: bool = True) -> None:
        self.state = state
        self.mix = mix
        shapes = mix.shapes
        self.need = np.array([s.device_milli for s in shapes], dtype=np.int64)
        self.num = np.array([s.num_devices for s in shapes], dtype=np.int64)
        self.defaults = state.defaults
        self.cpu = _per_shape([state.cpu_need(pod_of(s)) for s in shapes], len(state.nodes))
        self.mem = _per_shape([state.mem_need(pod_of(s)) for s in shapes], len(state.nodes))
        """[S], or [node, S] where some shape's default share differs per node."""
        self.p = np.array(mix.weights, dtype=np.float64)
        self.cpu_only = self.num == 0
        self.cpu_only_counts_all = cpu_only_counts_all
        n, g = state.dev_valid.shape
        if shapes:
            elig = [state.allowed_devices(s.allowed_models, s.node_labels) for s in shapes]
            self.elig = np.stack(elig, axis=2)
        else:
            self.elig = np.zeros((n, g, 0), dtype=bool)
        self.version = np.full(n, -1, dtype=np.int64)
        self.cnt = np.zeros((n, len(shapes)), dtype=np.int64)
        self.usum = np.zeros((n, len(shapes)), dtype=np.int64)
        self.frag = np.zeros(n, dtype=np.float64)
        self.seen_milli = np.zeros((n, g), dtype=np.int64)
        self.seen_cpu = np.zeros(n, dtype=np.int64)
        self.seen_mem = np.zeros(n, dtype=np.int64)
        """The free amounts each node's values were computed from (where `version` >= 0)."""
        self.refresh()

    def carried_to(self, state: ClusterState) -> FragModel | None:
        """This model for another state of the same pool (a copy of the one it models, as a backfill
        shadow is), without computing every node again: a node keeps its values where they were
        computed from the free amounts it has in `state` (a node's values are a function of its free
        device shares, cpu and memory, given the pool's devices, the slice defaults and the mix);
        every other node is stale there, for `refresh` or `refresh_at`. None where the pools differ
        in what the model reads besides the free amounts (then a new model is built)."""
        src = self.state
        if not carry_models or state.nodes is not src.nodes or state.dev_valid is not src.dev_valid \
                or state.dev_model is not src.dev_model or state.defaults is not self.defaults:
            return None
        new = copy.copy(self)  # shares what is fixed per pool and mix: needs, weights, eligibility
        new.state = state
        kept = (self.version >= 0) & (self.seen_cpu == state.cpu_free) & (self.seen_mem == state.mem_free)
        kept &= rows_all(self.seen_milli == state.dev_milli_free)
        new.version = np.where(kept, state.node_version, -1)
        new.cnt, new.usum, new.frag = self.cnt.copy(), self.usum.copy(), self.frag.copy()
        new.seen_milli, new.seen_cpu, new.seen_mem = self.seen_milli.copy(), self.seen_cpu.copy(), \
            self.seen_mem.copy()
        return new

    def refresh(self) -> None:
        """Recompute the nodes whose capacity changed since the last call."""
        stale = np.flatnonzero(self.version != self.state.node_version)
        if stale.size:
            self._recompute(stale)

    def refresh_at(self, nodes: IntArray) -> None:
        """`refresh` of `nodes` alone: those of them whose capacity changed are recomputed (a
        node's values depend on its own capacity only, so the others may wait until they are read)."""
        stale = nodes[self.version[nodes] != self.state.node_version[nodes]]
        if stale.size:
            self._recompute(stale)

    def _recompute(self, stale: IntArray) -> None:
        s = self.state
        free = s.dev_milli_free[stale]
        ge = (free[:, :, None] >= self.need) & self.elig[stale]
        self.cnt[stale] = ge.sum(axis=1)
        self.usum[stale] = (free[:, :, None] * ge).sum(axis=1)
        cpu, mem = s.cpu_free[stale], s.mem_free[stale]
        self.frag[stale] = self.fragment(row_sums(free), self.cnt[stale], self.usum[stale], cpu, mem, stale)
        self.version[stale] = s.node_version[stale]
        self.seen_milli[stale], self.seen_cpu[stale], self.seen_mem[stale] = free, cpu, mem

    def fragment(
        self,
        total: npt.ArrayLike,
        cnt: IntArray,
        usum: IntArray,
        cpu: npt.ArrayLike,
        mem: npt.ArrayLike,
        nodes: IntArray,
    ) -> FloatArray:
        """F(M) from free totals [...], per-shape counts/sums [..., S] and free cpu/memory [...] of
        `nodes` ([K]; `...` is [K] or [K, slot])."""
        total_a = np.asarray(total, dtype=np.float64)
        cpu_a = np.asarray(cpu)[..., None]
        mem_a = np.asarray(mem)[..., None]
        host = (cpu_a >= self._rows(self.cpu, nodes, cpu_a.ndim)) & (
            mem_a >= self._rows(self.mem, nodes, mem_a.ndim)
        )
        usable = np.where(host & (cnt >= self.num), usum, 0).astype(np.float64)
        if self.cpu_only.any():
            if self.cpu_only_counts_all:
                usable[..., self.cpu_only] = 0.0
            else:
                whole = np.broadcast_to(total_a[..., None], usable.shape)
                usable[..., self.cpu_only] = np.where(host, whole, 0.0)[..., self.cpu_only]
        return np.asarray(total_a - (usable * self.p).sum(axis=-1), dtype=np.float64)

    @staticmethod
    def _rows(need: IntArray, nodes: IntArray, ndim: int) -> IntArray:
        """The shapes' needs on `nodes`, shaped to broadcast against [K, S] or [K, slot, S]."""
        if need.ndim == 1:
            return need
        rows = need[nodes]
        return rows[:, None, :] if ndim == 3 else rows

    def after_fraction(self, pod: PodRequest, nodes: IntArray) -> FloatArray:
        """[K, slot] fragment of each node after putting the fractional `pod` on each slot."""
        s = self.state
        milli = pod.device_milli
        v = s.dev_milli_free[nodes]
        v2 = v - milli
        elig = self.elig[nodes]
        ge1 = (v[:, :, None] >= self.need) & elig
        ge2 = (v2[:, :, None] >= self.need) & elig
        cnt = self.cnt[nodes][:, None, :] - ge1 + ge2
        usum = self.usum[nodes][:, None, :] - v[:, :, None] * ge1 + v2[:, :, None] * ge2
        total = (row_sums(v) - milli)[:, None]
        cpu = (s.cpu_free[nodes] - at_nodes(s.cpu_need(pod), nodes))[:, None]
        mem = (s.mem_free[nodes] - at_nodes(s.mem_need(pod), nodes))[:, None]
        return self.fragment(np.broadcast_to(total, v.shape), cnt, usum, cpu, mem, nodes)

    def after_whole(self, pod: PodRequest, nodes: IntArray, chosen: BoolArray) -> FloatArray:
        """[K] fragment of each node after `pod` takes the whole devices marked in chosen [K, slot]."""
        s = self.state
        v = s.dev_milli_free[nodes] * chosen
        taken = (v[:, :, None] >= self.need) & self.elig[nodes] & chosen[:, :, None]
        left = (self.need <= 0) & self.elig[nodes] & chosen[:, :, None]
        cnt = self.cnt[nodes] - taken.sum(axis=1) + left.sum(axis=1)
        usum = self.usum[nodes] - (v[:, :, None] * taken).sum(axis=1)
        total = row_sums(s.dev_milli_free[nodes]) - row_sums(v)
        cpu = s.cpu_free[nodes] - at_nodes(s.cpu_need(pod), nodes)
        mem = s.mem_free[nodes] - at_nodes(s.mem_need(pod), nodes)
        return self.fragment(total, cnt, usum, cpu, mem, nodes)


def _per_shape(needs: list[Need], n: int) -> IntArray:
    """The shapes' needs as [S] when every one is a number, else as [node, S]."""
    if all(isinstance(x, int) for x in needs):
        return np.array(needs, dtype=np.int64)
    if not needs:
        return np.zeros(0, dtype=np.int64)
    return np.stack([np.broadcast_to(np.asarray(x, dtype=np.int64), (n,)) for x in needs], axis=1)


def first_whole_devices(fits: BoolArray, count: int) -> BoolArray:
    """[K, slot] mask of the first `count` fitting slots of each row (the devices a whole pod takes)."""
    return fits & (np.cumsum(fits, axis=1) <= count)


carry_models = True
"""Build a shadow's model from the live state's (`FragModel.carried_to`); False builds every model
from scratch (the same values, slower: kept to check that claim)."""
