"""gpu-packing: share a used device first, then free devices of a used node, then an empty node.

Integer scores as in the FGD paper's simulator: (1) the pod fits on devices already in use:
100 - (their free percent)/10, at least 50; (2) it needs fully free devices of a node that is
partly used: 50 - that number, at least 33; (3) every device of the node is free: 33 - device
count. CPU-only pods score 0 everywhere (the first node that fits).
"""

from __future__ import annotations

import numpy as np

from gpupool.core.model import PodRequest
from gpupool.core.scheduling.policies._common import DeviceChoice, FloatArray, ScoredPolicy
from gpupool.core.scheduling.policies.base import register_policy
from gpupool.core.state import BoolArray, ClusterState
from gpupool.core.units import MILLI


@register_policy
class GpuPacking(ScoredPolicy):
    name = "gpu-packing"
    summary = "Prefer used devices, then free devices on used nodes, then empty nodes."
    device_choice = DeviceChoice.BEST

    def scores(self, pod: PodRequest, state: ClusterState, feasible: BoolArray) -> FloatArray:
        n = len(state.nodes)
        out = np.zeros(n, dtype=np.float64)
        if not pod.num_devices:
            return out
        full = (state.dev_milli_free == state.dev_milli_cap) & state.dev_valid
        fully_free = full.sum(axis=1)
        empty_node = fully_free == state.dev_count
        out[empty_node] = np.maximum(33 - fully_free[empty_node], fully_free[empty_node])
        fits = state.device_fits(pod)
        for node in np.flatnonzero(feasible & ~empty_node):
            out[node] = self._partly_used_score(pod, state, int(node), fits[node])
        return out

    @staticmethod
    def _partly_used_score(pod: PodRequest, state: ClusterState, node: int, fits: BoolArray) -> float:
        slots = np.flatnonzero(fits)
        free = state.dev_milli_free[node, slots]
        chosen = slots[np.argsort(free, kind="stable")][: pod.num_devices]
        chosen_free = state.dev_milli_free[node, chosen]
        whole = int((chosen_free == MILLI).sum())
        if whole:
            return float(max(50 - whole, 33))
        percent = int((chosen_free * 100 // MILLI).sum())
        return float(max(100 - percent // 10, 50))
