"""dot-product (Tetris, as the FGD paper's simulator scores it): least aligned free capacity first.

The node's free (cpu, device) vector and the pod's request are each divided by the largest node
capacity in the cluster; the node whose free vector has the smallest dot product with the request
(the tightest fit along the pod's own direction) gets the highest integer score.
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
from gpupool.core.scheduling.policies.best_fit import quantize
from gpupool.core.state import BoolArray, ClusterState


@register_policy
class DotProduct(ScoredPolicy):
    name = "dot-product"
    summary = "Tetris-style: smallest dot product of free (cpu, devices) with the request; tightest device."
    device_choice = DeviceChoice.BEST

    def __init__(self, score_levels: int = 100, first_on_ties: bool = True) -> None:
        self.score_levels = score_levels
        self.first_on_ties = first_on_ties

    def scores(self, pod: PodRequest, state: ClusterState, feasible: BoolArray) -> FloatArray:
        cpu_max = float(max(int(state.cpu_cap.max(initial=0)), 1))
        dev_max = float(max(int(cap_device_milli(state).max(initial=0)), 1))
        dot = (state.cpu_free / cpu_max) * (state.cpu_need(pod) / cpu_max) + (
            free_device_milli(state) / dev_max
        ) * (pod.total_device_milli / dev_max)
        return quantize(np.clip(1.0 - dot / 2.0, 0.0, 1.0), self.score_levels)
