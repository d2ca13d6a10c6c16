"""best-fit: the node left with the least cpu and device capacity after placement (normalised)."""

from __future__ import annotations

import numpy as np

from gpupool.core.model import PodRequest
from gpupool.core.scheduling.policies._common import (
    DeviceChoice,
    FloatArray,
    ScoredPolicy,
    cap_device_milli,
    free_device_milli,
    safe_ratio,
)
from gpupool.core.scheduling.policies.base import register_policy
from gpupool.core.state import BoolArray, ClusterState


def remaining_share(pod: PodRequest, state: ClusterState) -> FloatArray:
    """[node] 0.5 x cpu + 0.5 x devices left after placing `pod`, each over the node's capacity."""
    cpu = safe_ratio(state.cpu_free - state.cpu_need(pod), state.cpu_cap)
    dev = safe_ratio(free_device_milli(state) - pod.total_device_milli, cap_device_milli(state))
    return 0.5 * cpu + 0.5 * dev


def quantize(score: FloatArray, levels: int) -> FloatArray:
    """Cut a [0, 1] score to `levels` integer steps (0 keeps it continuous), as integer node scores do."""
    return np.floor(score * levels) if levels else score


@register_policy
class BestFit(ScoredPolicy):
    """Least remaining resources first; the fitting device with the least free share.

    Options: `score_levels` (0 = continuous; 100 = integer scores 0-100, where nodes within one
    step tie) and `first_on_ties` (True: the first node in node order wins a tie; False: random).
    """

    name = "best-fit"
    summary = "Node left with the least cpu+devices (each over node capacity); tightest device."
    device_choice = DeviceChoice.BEST

    def __init__(self, score_levels: int = 100, first_on_ties: bool = True) -> None:
        self.score_levels = score_levels
        self.first_on_ties = first_on_ties

    def scores(self, pod: PodRequest, state: ClusterState, feasible: BoolArray) -> FloatArray:
        return quantize(1.0 - remaining_share(pod, state), self.score_levels)
