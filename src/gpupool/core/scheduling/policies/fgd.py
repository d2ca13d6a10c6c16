"""fgd: Fragmentation Gradient Descent (Weng et al., ATC'23): place where fragmentation grows least.

For every feasible node (and, for a fractional pod, every fitting device on it) FGD computes how
much the node's expected fragment F_n(M) (see `_frag`) would change, dF, and takes the smallest
growth. Four details of the paper's own simulator carry its published numbers; each is an option
of the constructor and on by default:

(a) ``coverage=0.95``: the shape mix M keeps only the most popular shapes that together cover
    95 % of the pods, re-weighted to sum to 1 (1.0 keeps all shapes);
(b) ``cpu_only_counts_all=True``: for a CPU-only shape all of a node's free device capacity is
    fragment (False: none of it is, when the shape fits the node's cpu and memory);
(c) ``integer_sigmoid=True``: a candidate scores ``int(100 * sigmoid(-dF / 1000))`` with dF in
    milli-device, so small differences tie (False: the exact -dF is the score);
(d) ``first_on_ties=True``: among equal scores the first node in node order wins, which acts as a
    first-fit packing rule (False: a seeded random node among the tied ones); on a node, the
    first fitting device with the top score wins.

Scores are cached per pod shape and node and recomputed only for nodes whose capacity changed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.model import PodRequest
from gpupool.core.scheduling.policies._common import FloatArray, pick_best
from gpupool.core.scheduling.policies._frag import (
    FragModel,
    Shape,
    ShapeMix,
    estimate_mix,
    first_whole_devices,
    shape_of,
)
from gpupool.core.scheduling.policies.base import (
    Choice,
    NoFit,
    PlacementPolicy,
    fits_or_nofit,
    register_policy,
)
from gpupool.core.state import ClusterState, IntArray
from gpupool.core.units import MILLI


@dataclass(slots=True)
class _Scores:
    """Cached best score and device slot of every node for one pod shape, valid at `version`."""

    version: IntArray
    score: FloatArray
    slot: IntArray


@register_policy
class Fgd(PlacementPolicy):
    name = "fgd"
    summary = "Fragmentation Gradient Descent (ATC'23): least growth of expected fragmentation."

    def __init__(
        self,
        coverage: float = 0.95,
        cpu_only_counts_all: bool = True,
        integer_sigmoid: bool = True,
        first_on_ties: bool = True,
    ) -> None:
        self.coverage = coverage
        self.cpu_only_counts_all = cpu_only_counts_all
        self.integer_sigmoid = integer_sigmoid
        self.first_on_ties = first_on_ties
        self._mix: ShapeMix | None = None
        self._observed: list[PodRequest] = []
        self._model: FragModel | None = None
        self._cache: dict[Shape, _Scores] = {}
        self._other: tuple[FragModel, dict[Shape, _Scores]] | None = None
        """The model and scores of the state used before the current one (a backfill shadow and the
        live state take turns: each keeps its own instead of being rebuilt at every turn)."""

    # ----------------------------------------------------------------- workload

    def prepare(self, state: ClusterState, pods: Sequence[PodRequest]) -> None:
        self._mix = estimate_mix(pods, self.coverage)
        self._model = None

    def observe(self, pod: PodRequest) -> None:
        self._observed.append(pod)
        self._mix = None

    def _model_for(self, state: ClusterState, pod: PodRequest, refresh: bool = True) -> FragModel:
        """The fragmentation model of `state`; `refresh`: every node brought up to date (False: the
        caller refreshes the nodes it reads, `FragModel.refresh_at`)."""
        if self._mix is None:
            self._mix = estimate_mix([*self._observed, pod], self.coverage)
            self._model = None
        model = self._model
        if model is None or model.state is not state or model.defaults is not state.defaults:
            other = self._other
            self._other = (model, self._cache) if model is not None and model.mix is self._mix else None
            if other is not None and other[0].state is state and other[0].defaults is state.defaults \
                    and other[0].mix is self._mix:
                model, self._cache = other
            else:
                carried = model.carried_to(state) if model is not None and model.mix is self._mix else None
                model = carried or FragModel(state, self._mix, self.cpu_only_counts_all)
                self._cache = {}
            self._model = model
        if refresh:
            model.refresh()
        return model

    # ----------------------------------------------------------------- placement

    def is_repeatable(self) -> bool:
        return self.first_on_ties  # (the score and slot caches are kept per node version)

    def place(self, pod: PodRequest, state: ClusterState, rng: random.Random) -> Choice | NoFit:
        feasible = fits_or_nofit(pod, state)
        if isinstance(feasible, NoFit):
            return feasible
        return self._place_feasible(pod, state, rng, feasible)

    def _place_feasible(
        self, pod: PodRequest, state: ClusterState, rng: random.Random, feasible: np.ndarray
    ) -> Choice:
        """`place` once some node is known to fit the pod (`feasible`: `state.node_fits(pod)`)."""
        model = self._model_for(state, pod, refresh=not lazy_refresh)
        entry = self._entry(pod, state)
        node = -1
        if sole_unscored and self.first_on_ties and (not pod.num_devices or pod.device_milli >= MILLI):
            # the first best of one feasible node is that node, and a pod of whole devices (or of
            # none) takes the first that fit there whatever the scores: none is computed (the
            # node's cached score stays stale, so the next placement that reads it computes it)
            only = np.flatnonzero(feasible)
            if only.size == 1:
                node = int(only[0])
        if node < 0:
            stale = np.flatnonzero(feasible & (entry.version != state.node_version))
            if stale.size:
                if lazy_refresh:  # only these nodes' fragments are read (`_evaluate`)
                    model.refresh_at(stale)
                entry.score[stale], entry.slot[stale] = self._evaluate(pod, state, model, stale)
                entry.version[stale] = state.node_version[stale]
            node = pick_best(entry.score, feasible, self.first_on_ties, rng)
        if not pod.num_devices:
            return Choice(node)
        if pod.device_milli < MILLI:
            return Choice(node, (int(entry.slot[node]),))
        slots = np.flatnonzero(state.device_fits_at(pod, node))[: pod.num_devices]
        return Choice(node, tuple(int(s) for s in slots))

    def _entry(self, pod: PodRequest, state: ClusterState) -> _Scores:
        key = shape_of(pod)
        entry = self._cache.get(key)
        if entry is None:
            n = len(state.nodes)
            entry = _Scores(
                np.full(n, -1, dtype=np.int64),
                np.full(n, -np.inf, dtype=np.float64),
                np.full(n, -1, dtype=np.int64),
            )
            self._cache[key] = entry
        return entry

    def _evaluate(
        self, pod: PodRequest, state: ClusterState, model: FragModel, nodes: IntArray
    ) -> tuple[FloatArray, IntArray]:
        """Best score and device slot on each of `nodes` (all of which fit the pod)."""
        before = model.frag[nodes]
        fits = state.device_fits_at(pod, nodes) if pod.num_devices else None
        if fits is not None and pod.device_milli < MILLI:
            after = model.after_fraction(pod, nodes)
            per_slot = np.where(fits, self.rank(pod, state, nodes, after - before[:, None]), -np.inf)
            slot = np.argmax(per_slot, axis=1)
            return per_slot[np.arange(nodes.size), slot], slot.astype(np.int64)
        chosen = first_whole_devices(fits, pod.num_devices) if fits is not None else None
        if chosen is None:
            chosen = np.zeros((nodes.size, state.dev_valid.shape[1]), dtype=bool)
        after = model.after_whole(pod, nodes, chosen)
        return self.rank(pod, state, nodes, after - before), np.full(nodes.size, -1, dtype=np.int64)

    def rank(self, pod: PodRequest, state: ClusterState, nodes: IntArray, growth: FloatArray) -> FloatArray:
        """Score of each candidate from its fragmentation growth dF (higher is better).

        `growth` is [K] for whole-device and CPU-only pods and [K, slot] for fractional ones.
        """
        if self.integer_sigmoid:
            return np.floor(100.0 * sigmoid(-growth / 1000.0))
        return np.asarray(-growth, dtype=np.float64)


sole_unscored = True
"""Where one node alone fits a pod of whole devices (or of none) and ties go to the first node, the
pod is placed there without scoring it (the choice does not read the score); False: scored first
(the same choice; a victim search's trims and final placement fit one node, its freed one)."""

lazy_refresh = True
"""A placement brings the fragmentation model up to date on the nodes it scores alone (feasible,
their cached scores stale); False: on every node whose capacity changed (the same scores, slower:
a victim search frees and takes back capacity on dozens of nodes the pod fits none of)."""


def sigmoid(x: FloatArray) -> FloatArray:
    return np.asarray(1.0 / (1.0 + np.exp(-x)), dtype=np.float64)

