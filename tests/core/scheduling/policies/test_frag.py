"""FGD's shape mix and fragment measure (the four documented details)."""

from __future__ import annotations

import numpy as np

from factories import node, pod
from gpupool.core.scheduling.policies._frag import FragModel, estimate_mix, shape_of
from gpupool.core.state import ClusterState


def test_mix_keeps_the_popular_shapes_that_cover_the_share_and_reweights() -> None:
    pods = [pod(1, name=f"a{i}") for i in range(6)] + [pod(0.5, name=f"b{i}") for i in range(3)]
    pods.append(pod(2, name="c"))
    mix = estimate_mix(pods, coverage=0.9)
    assert mix.shapes == (shape_of(pods[0]), shape_of(pods[6]))
    assert np.isclose(sum(mix.weights), 1.0)
    assert mix.weights == (6 / 9, 3 / 9)
    assert len(estimate_mix(pods, coverage=1.0).shapes) == 3


def test_fragment_counts_devices_a_shape_cannot_use() -> None:
    state = ClusterState([node("n0", devices=2)])
    state.allocate(state.make_alloc(pod(0.5), 0, (1,)))
    whole = FragModel(state, estimate_mix([pod(1)]))
    assert whole.frag[0] == 500.0  # the half-free device is useless to whole-GPU pods
    half = FragModel(state, estimate_mix([pod(0.5)]))
    assert half.frag[0] == 0.0


def test_cpu_only_shape_counts_all_free_devices_unless_disabled() -> None:
    state = ClusterState([node("n0", devices=2)])
    mix = estimate_mix([pod(0)])
    assert FragModel(state, mix, cpu_only_counts_all=True).frag[0] == 2000.0
    assert FragModel(state, mix, cpu_only_counts_all=False).frag[0] == 0.0


def test_shape_that_lacks_cpu_sees_everything_as_fragment() -> None:
    state = ClusterState([node("n0", devices=2, cpu_milli=4_000)])
    model = FragModel(state, estimate_mix([pod(1, cpu_milli=8_000)]))
    assert model.frag[0] == 2000.0


def test_hypothetical_placements_match_a_real_one() -> None:
    state = ClusterState([node("n0", devices=4), node("n1", devices=4)])
    state.allocate(state.make_alloc(pod(0.3), 1, (2,)))
    mix = estimate_mix([pod(1), pod(0.5), pod(0.3), pod(2), pod(0)])
    model = FragModel(state, mix)
    nodes = np.array([0, 1])
    predicted = model.after_fraction(pod(0.5), nodes)[1, 2]
    state.allocate(state.make_alloc(pod(0.5), 1, (2,)))
    model.refresh()
    assert np.isclose(model.frag[1], predicted)
    fits = state.device_fits(pod(2))[nodes]
    chosen = fits & (np.cumsum(fits, axis=1) <= 2)
    predicted_whole = model.after_whole(pod(2), nodes, chosen)[0]
    state.allocate(state.make_alloc(pod(2), 0, (0, 1)))
    model.refresh()
    assert np.isclose(model.frag[0], predicted_whole)
