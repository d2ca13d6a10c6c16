"""gpu-clustering: keep pods of one kind together (share / 1 / 2 / 4 / 8 devices) on the same nodes.

Integer scores as in the FGD paper's simulator: a node that holds only pods of the pod's kind
scores 75-100, one holding that kind among others 50-75, an idle node 25-50 and a node holding
other kinds 0-25; within each band, the fuller the node's devices the higher. CPU-only pods score
0 everywhere (the first node that fits).
"""

from __future__ import annotations

import numpy as np

from gpupool.core.model import PodRequest
from gpupool.core.scheduling.policies._common import (
    DeviceChoice,
    FloatArray,
    ScoredPolicy,
    cap_device_milli,
    free_device_milli,
)
from gpupool.core.scheduling.policies.base import register_policy
from gpupool.core.state import BoolArray, ClusterState
from gpupool.core.units import MILLI


def pod_kind(pod: PodRequest) -> str:
    """The kind label a placed pod gets in ClusterState.node_pod_kinds."""
    if not pod.num_devices:
        return "cpu"
    if pod.num_devices == 1 and pod.device_milli < MILLI:
        return "share"
    return f"{pod.num_devices}-dev"


@register_policy
class GpuClustering(ScoredPolicy):
    name = "gpu-clustering"
    summary = "Put a pod with pods of the same device kind (share, 1, 2, 4, 8 devices)."
    device_choice = DeviceChoice.BEST

    def scores(self, pod: PodRequest, state: ClusterState, feasible: BoolArray) -> FloatArray:
        n = len(state.nodes)
        out = np.zeros(n, dtype=np.float64)
        if not pod.num_devices:
            return out
        spec = max(int(cap_device_milli(state).max(initial=0)), 1)
        fullness = 25 * (spec - free_device_milli(state)) // spec
        kind = pod_kind(pod)
        for node in np.flatnonzero(feasible):
            kinds = [k for k in state.node_pod_kinds[node] if k != "cpu"]
            out[node] = _band(kind, kinds) + fullness[node]
        return out


def _band(kind: str, kinds: list[str]) -> int:
    if kind in kinds:
        return 75 if len(kinds) == 1 else 50
    return 0 if kinds else 25
