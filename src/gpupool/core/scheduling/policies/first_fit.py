"""first-fit: the first node (in node order) that fits, and its first fitting devices."""

from __future__ import annotations

import random

import numpy as np

from gpupool.core.model import PodRequest
from gpupool.core.scheduling.policies.base import (
    Choice,
    NoFit,
    PlacementPolicy,
    fits_or_nofit,
    register_policy,
)
from gpupool.core.state import ClusterState


@register_policy
class FirstFit(PlacementPolicy):
    name = "first-fit"
    summary = "First node in node order that fits; its lowest-numbered fitting devices."

    def is_repeatable(self) -> bool:
        return True

    def place(self, pod: PodRequest, state: ClusterState, rng: random.Random) -> Choice | NoFit:
        fits = fits_or_nofit(pod, state)
        if isinstance(fits, NoFit):
            return fits
        candidates = np.flatnonzero(fits)
        node = int(candidates[0])
        if not pod.num_devices:
            return Choice(node)
        slots = np.flatnonzero(state.device_fits_at(pod, node))[: pod.num_devices]
        return Choice(node, tuple(int(s) for s in slots))
