"""FGD places a pod of whole devices (or of none) that fits one node alone without scoring it
(`fgd.sole_unscored`): the first best of one feasible node is that node, and such a pod takes the
first devices that fit there whatever the scores. A victim search's trims and final placement are
such placements. Two nodes fitting, a fractional pod (its slot is the score's) and a policy that
draws among ties are scored as before; the same choices, so the same decisions."""

from __future__ import annotations

import random

import pytest
from bench_loop import assert_same_cycles, config_loop

from factories import node, pod
from gpupool.core.model import PodRequest
from gpupool.core.scheduling.policies import fgd
from gpupool.core.scheduling.policies.base import Choice, make_policy
from gpupool.core.scheduling.policies.fgd import Fgd
from gpupool.core.state import ClusterState


def _pool() -> ClusterState:
    """n0: four devices free; n1: one device free (three taken); n2: none free."""
    state = ClusterState([node(f"n{i}", devices=4) for i in range(3)])
    for n, taken in ((1, 3), (2, 4)):
        for d in range(taken):
            state.allocate(state.make_alloc(pod(1), n, (d,)))
    return state


def _place(p: PodRequest, state: ClusterState, unscored: bool, policy: object = None,
           seed: int = 1) -> tuple[Choice | object, int, object]:
    """The choice, how many nodes were scored, the rng's state after."""
    scored: list[int] = []
    policy = policy or make_policy("fgd-strand")
    assert isinstance(policy, Fgd)
    original = Fgd._evaluate

    def counted(self: Fgd, pod_: PodRequest, state_: ClusterState, model: object, nodes: object) -> object:
        scored.append(len(nodes))  # type: ignore[arg-type]
        return original(self, pod_, state_, model, nodes)  # type: ignore[arg-type]

    rng = random.Random(seed)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fgd, "sole_unscored", unscored)
        mp.setattr(Fgd, "_evaluate", counted)
        choice = policy.place(p, state, rng)
    return choice, sum(scored), rng.getstate()


def test_one_node_fitting_a_whole_device_pod_is_taken_unscored() -> None:
    three = pod(3)  # fits n0 alone
    assert _place(three, _pool(), False) == (Choice(0, (0, 1, 2)), 1, random.Random(1).getstate())
    assert _place(three, _pool(), True) == (Choice(0, (0, 1, 2)), 0, random.Random(1).getstate())
    cpu_only = pod(0, cpu_milli=64_000)  # a whole node's CPUs: n0 alone has them all free
    assert _place(cpu_only, _pool(), True)[:2] == (_place(cpu_only, _pool(), False)[0], 0)


def test_two_nodes_fitting_are_scored_and_the_best_is_taken() -> None:
    """n0 (three devices free) and n1 (two) both fit two devices: FGD takes n1, not the first."""
    def pool() -> ClusterState:
        state = ClusterState([node(f"n{i}", devices=4) for i in range(2)])
        for n, taken in ((0, 1), (1, 2)):
            for d in range(taken):
                state.allocate(state.make_alloc(pod(1), n, (d,)))
        return state

    off = _place(pod(2), pool(), False)
    assert off[:2] == (Choice(1, (2, 3)), 2)
    assert _place(pod(2), pool(), True) == off


def test_a_fractional_pod_on_one_node_is_scored_for_its_slot() -> None:
    state = _pool()
    state.allocate(state.make_alloc(pod(1), 1, (3,)))  # n0 alone has room now
    state.allocate(state.make_alloc(pod(0.5), 0, (2,)))
    half = pod(0.5)
    off = _place(half, state, False)
    assert off[0] == Choice(0, (2,)) and off[1] == 1  # the half-used device, by its score
    assert _place(half, state, True) == off


def test_a_policy_drawing_among_ties_draws_as_before() -> None:
    drawing = Fgd(first_on_ties=False)
    off = _place(pod(3), _pool(), False, Fgd(first_on_ties=False), seed=9)
    assert off[2] != random.Random(9).getstate()  # it drew
    assert _place(pod(3), _pool(), True, drawing, seed=9) == off


@pytest.mark.parametrize("config", ["default", "bench/configs/full.yaml"])
def test_the_bench_loop_decides_the_same_unscored(config: str) -> None:
    """Every decision of every cycle and the rng after it equal with every placement scored; and
    placements went unscored (as configured: the switch is on)."""
    calls = {"as configured": 0, "scored": 0}
    phase = "as configured"
    original = Fgd._evaluate

    def counted(self: Fgd, p: PodRequest, state: ClusterState, model: object, nodes: object) -> object:
        calls[phase] += 1
        return original(self, p, state, model, nodes)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Fgd, "_evaluate", counted)
        fast = config_loop(config)
        mp.setattr(fgd, "sole_unscored", False)
        phase = "scored"
        scored = config_loop(config)
    assert calls["scored"] - calls["as configured"] >= 10, calls
    assert_same_cycles(fast, scored)
