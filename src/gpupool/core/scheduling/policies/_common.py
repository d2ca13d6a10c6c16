"""Shared building blocks of the placement policies: device choice inside a node and tie-breaking."""

from __future__ import annotations

import random
from abc import abstractmethod
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from gpupool.core.model import PodRequest
from gpupool.core.scheduling.policies.base import Choice, NoFit, PlacementPolicy, fits_or_nofit
from gpupool.core.state import BoolArray, ClusterState, IntArray, row_sums
from gpupool.core.units import MILLI

FloatArray = npt.NDArray[np.float64]


class DeviceChoice(StrEnum):
    """How a fractional pod's device is picked on the chosen node (whole devices: lowest free ones)."""

    BEST = "best"  # the fitting device with the least free share (ties: lowest index)
    WORST = "worst"  # the fitting device with the most free share (ties: lowest index)
    FIRST = "first"  # the lowest-numbered fitting device
    RANDOM = "random"  # a uniformly random fitting device


def choose_devices(
    pod: PodRequest, state: ClusterState, node: int, how: DeviceChoice, rng: random.Random
) -> Choice:
    """The Choice for `pod` on `node` (which must fit it) with devices picked by `how`."""
    if not pod.num_devices:
        return Choice(node)
    slots = np.flatnonzero(state.device_fits_at(pod, node))
    if pod.device_milli >= MILLI or how is DeviceChoice.FIRST:
        return Choice(node, tuple(int(s) for s in slots[: pod.num_devices]))
    free = state.dev_milli_free[node, slots]
    if how is DeviceChoice.BEST:
        pick = int(slots[int(np.argmin(free))])
    elif how is DeviceChoice.WORST:
        pick = int(slots[int(np.argmax(free))])
    else:
        pick = int(slots[rng.randrange(len(slots))])
    return Choice(node, (pick,))


def pick_best(scores: FloatArray, feasible: BoolArray, first: bool, rng: random.Random) -> int:
    """Index of the highest score among feasible nodes: the first such node, or a seeded random one."""
    masked = np.where(feasible, scores, -np.inf)
    if first:
        return int(np.argmax(masked))
    top = np.flatnonzero(masked == masked.max())
    return int(top[rng.randrange(len(top))])


def free_device_milli(state: ClusterState) -> IntArray:
    """[node] total free device milli."""
    return row_sums(state.dev_milli_free)


def cap_device_milli(state: ClusterState) -> IntArray:
    """[node] total device milli capacity."""
    return row_sums(state.dev_milli_cap)


def safe_ratio(num: npt.ArrayLike, den: npt.ArrayLike) -> FloatArray:
    """num / den elementwise, 0 where den is 0."""
    num_a = np.asarray(num, dtype=np.float64)
    den_a = np.asarray(den, dtype=np.float64)
    out = np.zeros(np.broadcast(num_a, den_a).shape, dtype=np.float64)
    np.divide(num_a, den_a, out=out, where=den_a != 0)
    return out


class ScoredPolicy(PlacementPolicy):
    """A policy that scores every feasible node at once, takes the best and then picks devices.

    Subclasses implement `scores`; `device_choice` and `first_on_ties` set the rest.
    """

    device_choice: DeviceChoice = DeviceChoice.BEST
    first_on_ties: bool = True

    def is_repeatable(self) -> bool:
        return self.first_on_ties and self.device_choice is not DeviceChoice.RANDOM

    @abstractmethod
    def scores(self, pod: PodRequest, state: ClusterState, feasible: BoolArray) -> FloatArray:
        """[node] scores (higher is better); only entries of feasible nodes are read."""

    def place(self, pod: PodRequest, state: ClusterState, rng: random.Random) -> Choice | NoFit:
        feasible = fits_or_nofit(pod, state)
        if isinstance(feasible, NoFit):
            return feasible
        node = pick_best(self.scores(pod, state, feasible), feasible, self.first_on_ties, rng)
        return choose_devices(pod, state, node, self.device_choice, rng)
