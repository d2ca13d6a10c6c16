"""random: a uniformly random feasible node and a random fitting device (seeded by the rng)."""

from __future__ import annotations

import random

import numpy as np

from gpupool.core.model import PodRequest
from gpupool.core.scheduling.policies._common import DeviceChoice, choose_devices
from gpupool.core.scheduling.policies.base import (
    Choice,
    NoFit,
    PlacementPolicy,
    fits_or_nofit,
    register_policy,
)
from gpupool.core.state import ClusterState


@register_policy
class RandomFit(PlacementPolicy):
    name = "random"
    summary = "A uniformly random node that fits; a random fitting device for a fraction."

    def place(self, pod: PodRequest, state: ClusterState, rng: random.Random) -> Choice | NoFit:
        fits = fits_or_nofit(pod, state)
        if isinstance(fits, NoFit):
            return fits
        candidates = np.flatnonzero(fits)
        node = int(candidates[rng.randrange(candidates.size)])
        return choose_devices(pod, state, node, DeviceChoice.RANDOM, rng)
