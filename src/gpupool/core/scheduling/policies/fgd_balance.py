"""fgd-balance: FGD's fragmentation growth first, then keep each node's cpu in step with its devices.

On OpenB, what FGD leaves unallocated is mostly device capacity stranded on nodes whose cpu is
gone (8-GPU nodes hold about 12 cores per GPU) while cpu-rich nodes (2-GPU T4 nodes, 52 cores per
GPU) still have cores to spare. fgd-balance ranks candidates lexicographically:

1. the FGD score, `int(score_levels * sigmoid(-dF / 1000))` (dF: fragmentation growth in
   milli-device, as in `fgd`), with coarser steps than FGD's 100 so that the balance below decides
   between candidates FGD can barely tell apart;
2. cpu/device balance after placement. With R the cpu the workload asks per milli-device
   (from the same shape mix, times `ratio_scale`), a node's surplus is
   (free cpu - R x free device milli) / cpu capacity. A CPU-only pod goes where the surplus is
   largest (cpu nobody's devices will need); a device pod goes where the surplus stays closest
   to 0 (neither cores nor devices stranded);
   Within the same step, a node whose devices are all free and that is large enough for the
   biggest multi-device pod of the workload loses `empty_penalty` (on the balance's 0-1 scale),
   so such nodes are broken up only when that buys a clearly better balance;
3. on a node, the fitting device with the least free share; then node order (first wins).

Measured on the OpenB default trace (seeds 42-51, see docs/experiments/packing.md) it allocates more than
FGD at 100 % arrived demand.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpupool.core.model import PodRequest
from gpupool.core.scheduling.policies._common import FloatArray
from gpupool.core.scheduling.policies.base import register_policy
from gpupool.core.scheduling.policies.fgd import Fgd, sigmoid
from gpupool.core.state import ClusterState, IntArray, at_nodes
from gpupool.core.units import MILLI


@register_policy
class FgdBalance(Fgd):
    name = "fgd-balance"
    summary = "FGD's fragmentation score (coarser), ties broken by cpu/device balance of the node."

    def __init__(
        self,
        coverage: float = 0.95,
        cpu_only_counts_all: bool = True,
        score_levels: int = 25,
        balance: bool = True,
        ratio_scale: float = 1.15,
        empty_penalty: float = 0.2,
        first_on_ties: bool = True,
    ) -> None:
        super().__init__(coverage, cpu_only_counts_all, True, first_on_ties)
        self.score_levels = score_levels
        self.balance = balance
        self.ratio_scale = ratio_scale
        self.empty_penalty = empty_penalty
        self._largest_gang = 0

    def prepare(self, state: ClusterState, pods: Sequence[PodRequest]) -> None:
        super().prepare(state, pods)
        self._largest_gang = max((p.num_devices for p in pods), default=0)

    def observe(self, pod: PodRequest) -> None:
        super().observe(pod)
        self._largest_gang = max(self._largest_gang, pod.num_devices)

    def cpu_per_device_milli(self) -> float:
        """cpu milli the workload asks per device milli, over the device shapes of the mix."""
        if self._mix is None:
            return 0.0
        pairs = list(zip(self._mix.shapes, self._mix.weights, strict=True))
        cpu = sum(w * s.cpu_milli for s, w in pairs if s.num_devices)
        dev = sum(w * s.num_devices * s.device_milli for s, w in pairs)
        return cpu / dev if dev else 0.0

    def rank(self, pod: PodRequest, state: ClusterState, nodes: IntArray, growth: FloatArray) -> FloatArray:
        primary = np.floor(self.score_levels * sigmoid(-growth / 1000.0))
        tie = np.zeros(nodes.size, dtype=np.float64)
        if self.balance:
            ratio = self.cpu_per_device_milli() * self.ratio_scale
            cpu_left = (state.cpu_free[nodes] - at_nodes(state.cpu_need(pod), nodes)).astype(np.float64)
            dev_left = (state.dev_milli_free[nodes].sum(axis=1) - pod.total_device_milli).astype(np.float64)
            surplus = (cpu_left - ratio * dev_left) / np.maximum(state.cpu_cap[nodes], 1)
            if pod.num_devices:
                tie += 1.0 - np.minimum(np.abs(surplus), 1.0)
            else:
                tie += 0.5 + 0.5 * np.tanh(surplus)
        if self.empty_penalty and self._largest_gang > 1:
            big = state.dev_count[nodes] >= max(self._largest_gang, pod.num_devices + 1)
            empty = (state.dev_milli_free[nodes] == state.dev_milli_cap[nodes]).all(axis=1)
            tie -= np.where(big & empty, self.empty_penalty, 0.0)
        if growth.ndim == 2:
            tightness = 1.0 - state.dev_milli_free[nodes] / MILLI
            tie = tie[:, None] + tightness * 1e-3
        return np.asarray(primary * 10.0 + tie, dtype=np.float64)
