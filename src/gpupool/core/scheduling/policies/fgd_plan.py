"""fgd-plan: fgd-strand whose fractional pods fill devices along LP-optimal fill patterns.

What fgd-strand leaves free at full load is almost all holes: the part of a device that fractional
pods opened and that no later slice fits (on OpenB, 0.81-GPU pods leave 0.19 that only the rare
pods of 0.16 GPU or less can use; two 0.47s leave 0.06). How much is left is a bin-packing
question, and an online rule that only looks at the device in front of it (best fit, or FGD's
fragmentation growth) opens more devices than needed. fgd-plan plans instead:

- `prepare` counts the slice sizes of the expected workload and solves the cutting-stock LP of
  `_patterns` for the fill patterns that cover those slices with the fewest devices (e.g. one 0.65
  with one 0.32; one 0.81 with one 0.16; three 0.32s);
- a fractional pod goes, in this order of preference, to: a device that has a planned, still open
  slot of its size; a partly used device that has no plan (filled outside it: before a restart,
  by a departure, by a fallback placement), so existing holes are filled first; an empty device,
  which is given the pattern (among those holding this size) that has been opened least relative
  to its LP weight, so patterns are opened in the LP's proportions; and only then a device whose
  plan has no slot for this size;
- within each of those tiers, nodes and devices are ranked exactly as by fgd-strand
  (fragmentation growth, stranded devices, reserved nodes, model pressure), and fgd-plan turns on
  fgd-strand's demand-aware reserve (`reserve_expected`): a node is kept for a gang shape while
  no more nodes can hold it (devices, cpu and memory free now) than the larger of `reserve_empty`
  and the shape's expected arrivals still to come (its share of one cluster's worth of the
  workload), and only placements that would take that room away are priced.

A device's plan is valid only while its free share is what the plan expects: anything else that
changes it (a departure, a rolled-back gang, another scheduler) turns the device back into an
unplanned one, so a stale plan can cost packing quality but never correctness. Pods with sizes
the plan does not know are placed by fgd-strand alone.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import numpy as np

from gpupool.core.model import PodRequest
from gpupool.core.scheduling.policies._common import FloatArray
from gpupool.core.scheduling.policies._patterns import FillPlan, plan_patterns
from gpupool.core.scheduling.policies.base import Choice, NoFit, register_policy
from gpupool.core.scheduling.policies.fgd_strand import FgdStrand
from gpupool.core.state import ClusterState, IntArray
from gpupool.core.units import MILLI

_PLANNED = 3000.0
_UNPLANNED = 2000.0
_EMPTY = 1000.0


@register_policy
class FgdPlan(FgdStrand):
    name = "fgd-plan"
    summary = "fgd-strand that fills devices with fractional pods along LP-optimal fill patterns."

    def __init__(self, *, plan: bool = True, reserve_expected: bool = True, **strand_options: object) -> None:
        super().__init__(reserve_expected=reserve_expected, **strand_options)  # type: ignore[arg-type]
        self.plan = plan
        self._plan: FillPlan | None = None
        self._index: dict[int, int] = {}
        self._opened: np.ndarray = np.zeros(0, dtype=np.float64)
        self._left: IntArray | None = None  # [size, node, slot] planned slots still open
        self._expect: IntArray | None = None  # [node, slot] free milli the plan expects; -1: no plan
        self._size: int | None = None  # index of the size being placed, for rank()

    def prepare(self, state: ClusterState, pods: Sequence[PodRequest]) -> None:
        super().prepare(state, pods)
        self._plan = None
        self._left = self._expect = None
        if not self.plan:
            return
        demand = Counter(p.device_milli for p in pods if p.num_devices == 1 and p.device_milli < MILLI)
        self._plan = plan_patterns(demand)
        if self._plan is not None:
            self._index = {s: i for i, s in enumerate(self._plan.sizes)}
            self._opened = np.zeros(len(self._plan.weight), dtype=np.float64)

    def _arrays(self, state: ClusterState) -> tuple[IntArray, IntArray]:
        assert self._plan is not None
        shape = state.dev_milli_free.shape
        if self._expect is None or self._left is None or self._expect.shape != shape:
            self._left = np.zeros((len(self._plan.sizes), *shape), dtype=np.int64)
            self._expect = np.full(shape, -1, dtype=np.int64)
        return self._left, self._expect

    def is_repeatable(self) -> bool:
        return False  # a placement advances the device's fill plan

    def place(self, pod: PodRequest, state: ClusterState, rng: random.Random) -> Choice | NoFit:
        fractional = pod.num_devices == 1 and pod.device_milli < MILLI
        size = self._index.get(pod.device_milli) if (self._plan is not None and fractional) else None
        self._size = size
        try:
            choice = super().place(pod, state, rng)
        finally:
            self._size = None
        if size is not None and isinstance(choice, Choice) and choice.devices:
            self._record(size, pod.device_milli, state, choice.node, choice.devices[0])
        return choice

    def _record(self, size: int, milli: int, state: ClusterState, node: int, slot: int) -> None:
        """Update the device's plan for a slice of `milli` about to be placed on it."""
        assert self._plan is not None
        left, expect = self._arrays(state)
        free = int(state.dev_milli_free[node, slot])
        if expect[node, slot] == free and left[size, node, slot] > 0:
            left[size, node, slot] -= 1
        elif free == int(state.dev_milli_cap[node, slot]):
            holding = np.flatnonzero(self._plan.counts[:, size] > 0)
            k = int(holding[np.argmin(self._opened[holding] / self._plan.weight[holding])])
            self._opened[k] += 1
            left[:, node, slot] = self._plan.counts[k]
            left[size, node, slot] -= 1
        else:
            left[:, node, slot] = 0  # an unplanned device: tracked, with no open slot
        expect[node, slot] = free - milli

    def rank(self, pod: PodRequest, state: ClusterState, nodes: IntArray, growth: FloatArray) -> FloatArray:
        score = super().rank(pod, state, nodes, growth)
        if self._size is None or growth.ndim != 2:
            return score
        left, expect = self._arrays(state)
        free = state.dev_milli_free[nodes]
        valid = expect[nodes] == free
        planned = valid & (left[self._size][nodes] > 0)
        empty = free == state.dev_milli_cap[nodes]
        tier = np.where(planned, _PLANNED, np.where(empty, _EMPTY, np.where(valid, 0.0, _UNPLANNED)))
        return np.asarray(score + tier, dtype=np.float64)
