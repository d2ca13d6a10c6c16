"""FGD's fragmentation model of a backfill shadow carried from the live state's
(`FragModel.carried_to`, `_frag.carry_models`): a node keeps its values where it has the free amounts
they were computed from, whatever its version says. The same values as a model built afresh, so
the same decisions."""

from __future__ import annotations

import random

import numpy as np
import pytest
from bench_loop import assert_same_cycles, config_loop

from factories import node, pod
from gpupool.core.model import PodRequest, SliceDefaults
from gpupool.core.scheduling.policies import _frag
from gpupool.core.scheduling.policies._frag import FragModel, estimate_mix
from gpupool.core.state import ClusterState, PodAlloc, clone_state

SHAPES = [pod(1), pod(0.5), pod(0.3), pod(2), pod(0.25, cpu_milli=8000), pod(0)]


def _churn(state: ClusterState, held: list[PodAlloc], rng: random.Random, steps: int) -> None:
    """Random placements and releases (each bumps its node's version by one)."""
    for _ in range(steps):
        if held and rng.random() < 0.4:
            state.release(held.pop(rng.randrange(len(held))))
            continue
        p = rng.choice(SHAPES)
        fits = np.flatnonzero(state.node_fits(p))
        if not fits.size:
            continue
        n = int(rng.choice(fits))
        slots: list[int] = np.flatnonzero(state.device_fits(p)[n])[: p.num_devices].tolist()
        record = state.make_alloc(p, n, slots)
        state.allocate(record)
        held.append(record)


def _assert_equal(model: FragModel, state: ClusterState) -> None:
    fresh = FragModel(state, model.mix)
    model.refresh()
    assert (model.version == state.node_version).all()
    assert (model.cnt == fresh.cnt).all() and (model.usum == fresh.usum).all()
    assert np.array_equal(model.frag, fresh.frag)


def test_a_carried_model_equals_a_fresh_one_after_both_pools_changed() -> None:
    """The live state and its copy both change after the copy is made, so a node can reach the same
    version on both sides with other free amounts: only the amounts decide what is kept."""
    kept_nodes = collisions = 0
    for seed in range(30):
        rng = random.Random(seed)
        live = ClusterState([node(f"n{i}", devices=rng.choice([4, 8])) for i in range(6)])
        mix = estimate_mix(SHAPES, coverage=1.0)
        held: list[PodAlloc] = []
        _churn(live, held, rng, 30)
        model = FragModel(live, mix)
        shadow = clone_state(live)
        shadow_held = list(held)
        _churn(live, held, rng, 6)
        model.refresh()  # the live model follows its own state, its versions now past the copy's
        _churn(shadow, shadow_held, rng, 6)
        carried = model.carried_to(shadow)
        assert carried is not None
        kept = carried.version >= 0
        same = (live.dev_milli_free == shadow.dev_milli_free).all(axis=1) \
            & (live.cpu_free == shadow.cpu_free) & (live.mem_free == shadow.mem_free)
        assert (kept == same).all()  # every node with the same amounts kept, every other one not
        kept_nodes += int(kept.sum())
        collisions += int(((live.node_version == shadow.node_version) & ~same).sum())
        _assert_equal(carried, shadow)
        _assert_equal(model, live)  # the source is left as it was
    assert kept_nodes and collisions, "the cases do not test what they name"


def test_a_version_collision_is_recomputed() -> None:
    """One allocation on each side, of other sizes, on the same node: equal versions, other amounts."""
    live = ClusterState([node("a", devices=4), node("b", devices=4)])
    model = FragModel(live, estimate_mix(SHAPES, coverage=1.0))
    shadow = clone_state(live)
    live.allocate(live.make_alloc(pod(0.5), 0, (0,)))
    shadow.allocate(shadow.make_alloc(pod(0.3), 0, (0,)))
    model.refresh()
    assert live.node_version[0] == shadow.node_version[0]
    carried = model.carried_to(shadow)
    assert carried is not None and carried.version[0] == -1 and carried.version[1] >= 0
    _assert_equal(carried, shadow)


def test_other_defaults_or_another_pool_build_afresh() -> None:
    live = ClusterState([node("a", devices=4)])
    model = FragModel(live, estimate_mix(SHAPES))
    other = clone_state(live)
    other.set_defaults(SliceDefaults(cpu_milli_per_device=4000))
    assert model.carried_to(other) is None
    assert model.carried_to(ClusterState([node("a", devices=4)])) is None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_frag, "carry_models", False)
        assert model.carried_to(clone_state(live)) is None


@pytest.mark.parametrize("config", ["default", "bench/configs/full.yaml"])
def test_the_bench_loop_decides_the_same_with_carried_models(config: str) -> None:
    """Every decision of every cycle and the rng after it equal with every model built afresh; and
    the loop did carry models, keeping nodes."""
    carried: list[int] = []
    original = FragModel.carried_to

    def counted(self: FragModel, state: ClusterState) -> FragModel | None:
        found = original(self, state)
        if found is not None:
            carried.append(int((found.version >= 0).sum()))
        return found

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FragModel, "carried_to", counted)
        on = config_loop(config)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_frag, "carry_models", False)
        off = config_loop(config)
    assert len(carried) >= 3 and sum(carried) > 100, "the loop never carried a model"
    assert_same_cycles(on, off)


def test_a_nodes_fragment_does_not_depend_on_the_nodes_computed_beside_it() -> None:
    """Each node computed alone gives the bits the whole pool computed at once gives (a matrix
    product's rounding depends on the rows beside: a carried or lazily refreshed model recomputes
    other groups of nodes than a model built afresh)."""
    rng = random.Random(7)
    state = ClusterState([node(f"n{i}", devices=8) for i in range(40)])
    _churn(state, [], rng, 150)
    shapes = [pod(rng.choice([0.1, 0.2, 0.25, 0.3, 0.5, 0.7, 1, 2, 4]), cpu_milli=rng.choice([500, 3000]))
              for _ in range(60)]
    whole = FragModel(state, estimate_mix(shapes, coverage=1.0))
    alone = FragModel(state, whole.mix)
    alone.version[:] = -1
    for i in range(len(state.nodes)):
        alone.refresh_at(np.array([i]))
    assert whole.p.size >= 8
    assert np.array_equal(alone.frag, whole.frag)


@pytest.mark.parametrize("taken", [pod(0, cpu_milli=60_000, memory_mib=0),
                                   pod(0, cpu_milli=0, memory_mib=260_000)])
def test_a_node_whose_cpu_or_memory_alone_changed_is_recomputed(taken: PodRequest) -> None:
    live = ClusterState([node("a", devices=4), node("b", devices=4)])
    model = FragModel(live, estimate_mix([pod(1, cpu_milli=8000, memory_mib=8192), pod(0.5)], coverage=1.0))
    shadow = clone_state(live)
    shadow.allocate(shadow.make_alloc(taken, 0, ()))
    carried = model.carried_to(shadow)
    assert carried is not None and carried.version[0] == -1 and carried.version[1] >= 0
    _assert_equal(carried, shadow)
    assert carried.frag[0] != model.frag[0]
