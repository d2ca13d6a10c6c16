"""worst-fit: the node left with the most cpu and device capacity after placement (spreading)."""

from __future__ import annotations

from gpupool.core.model import PodRequest
from gpupool.core.scheduling.policies._common import DeviceChoice, FloatArray, ScoredPolicy
from gpupool.core.scheduling.policies.base import register_policy
from gpupool.core.scheduling.policies.best_fit import quantize, remaining_share
from gpupool.core.state import BoolArray, ClusterState


@register_policy
class WorstFit(ScoredPolicy):
    """Most remaining resources first (the mirror of best-fit); the device with the most free share."""

    name = "worst-fit"
    summary = "Node left with the most cpu+devices (each over node capacity); emptiest device."
    device_choice = DeviceChoice.WORST

    def __init__(self, score_levels: int = 100, first_on_ties: bool = True) -> None:
        self.score_levels = score_levels
        self.first_on_ties = first_on_ties

    def scores(self, pod: PodRequest, state: ClusterState, feasible: BoolArray) -> FloatArray:
        return quantize(remaining_share(pod, state), self.score_levels)
