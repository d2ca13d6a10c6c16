"""FGD's fragmentation model brought up to date only on the nodes a placement scores
(`fgd.lazy_refresh`, `FragModel.refresh_at`): a node's values depend on its own capacity alone, so
the others wait until they are read. The same scores, so the same decisions."""

from __future__ import annotations

import numpy as np
import pytest
from bench_loop import assert_same_cycles, config_loop

from factories import node, pod
from gpupool.core.scheduling.policies import fgd
from gpupool.core.scheduling.policies._frag import FragModel, estimate_mix
from gpupool.core.state import ClusterState


def _changed_pool() -> tuple[ClusterState, FragModel]:
    state = ClusterState([node(f"n{i}", devices=4) for i in range(3)])
    model = FragModel(state, estimate_mix([pod(1), pod(0.5), pod(0.3), pod(2)]))
    state.allocate(state.make_alloc(pod(0.5), 0, (1,)))
    state.allocate(state.make_alloc(pod(0.3), 2, (0,)))
    return state, model


def test_refresh_at_brings_the_nodes_named_up_to_date_and_leaves_the_others() -> None:
    state, model = _changed_pool()
    stale_frag = model.frag.copy()
    model.refresh_at(np.array([2]))
    fresh = FragModel(state, model.mix)
    assert model.frag[2] == fresh.frag[2] != stale_frag[2]
    assert (model.cnt[2] == fresh.cnt[2]).all() and (model.usum[2] == fresh.usum[2]).all()
    assert model.frag[0] == stale_frag[0] != fresh.frag[0]  # not read yet: not recomputed
    model.refresh_at(np.array([0, 1, 2]))  # node 2 is current: only node 0 is recomputed
    assert (model.frag == fresh.frag).all() and (model.version == state.node_version).all()


@pytest.mark.parametrize("config", ["default", "bench/configs/full.yaml"])
def test_the_bench_loop_decides_the_same_refreshing_lazily(config: str) -> None:
    """Every decision of every cycle and the rng after it equal with the model refreshed on every
    changed node; and the lazy refresh left nodes unrefreshed that a full one would have read."""
    skipped: list[int] = []
    original = FragModel.refresh_at

    def counted(self: FragModel, nodes: np.ndarray) -> None:
        skipped.append(int((self.version != self.state.node_version).sum()) - int(
            (self.version[nodes] != self.state.node_version[nodes]).sum()))
        original(self, nodes)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FragModel, "refresh_at", counted)
        lazy = config_loop(config)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fgd, "lazy_refresh", False)
        full = config_loop(config)
    assert sum(skipped) > 100, "the lazy refresh never left a changed node for later"
    assert_same_cycles(lazy, full)
