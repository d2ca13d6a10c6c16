"""A policy's refusal is worded from the checks its failed search made (`fits_or_nofit`): the same
reason and text as `explain_nofit` recomputing them, on every branch of the wording."""

from __future__ import annotations

import dataclasses
import random

import pytest

from factories import POLICY_NAMES, node, pod
from gpupool.core.model import Reason
from gpupool.core.scheduling.policies import base
from gpupool.core.scheduling.policies.base import Choice, NoFit, explain_nofit, make_policy
from gpupool.core.state import ClusterState


def _cluster(rng: random.Random) -> ClusterState:
    nodes = []
    for i in range(rng.randint(1, 6)):
        made = node(f"n{i}", devices=rng.choice([0, 2, 4, 8]), model=rng.choice(["A", "B"]),
                    cpu_milli=rng.choice([4, 8, 16]) * 1000, memory_mib=rng.choice([4096, 16384]),
                    device_memory_mib=rng.choice([8192, 32768]))
        if rng.random() < 0.5:
            made = dataclasses.replace(made, labels={"rack": rng.choice(["r1", "r2"])})
        nodes.append(made)
    return ClusterState(nodes)


def _pod(rng: random.Random, i: int):  # type: ignore[no-untyped-def]
    made = pod(rng.choice([0, 0.25, 0.5, 1, 2, 4, 8, 16]), cpu_milli=rng.choice([0, 1000, 6000, 20000]),
               memory_mib=rng.choice([0, 512, 8192, 30000]), device_memory_mib=rng.choice([0, 0, 16384]),
               models=rng.choice([frozenset(), frozenset({"A"}), frozenset({"C"})]), name=f"p{i}")
    if rng.random() < 0.3:
        made = dataclasses.replace(made, node_labels=frozenset({("rack", rng.choice(["r1", "r3"]))}))
    return made


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_refusal_reads_as_the_recomputed_explanation(name: str) -> None:
    reasons: set[Reason] = set()
    for seed in range(40):
        rng = random.Random(seed)
        state = _cluster(rng)
        policy = make_policy(name)
        stream = [_pod(rng, i) for i in range(30)]
        policy.prepare(state, stream)
        draws = random.Random(seed)
        for p in stream:
            choice = policy.place(p, state, draws)
            if isinstance(choice, Choice):
                state.allocate(state.make_alloc(p, choice.node, choice.devices))
                continue
            assert isinstance(choice, NoFit)
            assert not state.node_fits(p).any()
            assert choice == explain_nofit(p, state), (seed, p)
            reasons.add(choice.reason)
    # every branch of the wording was read (a wrong mask would change which one is taken)
    assert {Reason.NO_ALLOWED_MODEL, Reason.INSUFFICIENT_DEVICES, Reason.INSUFFICIENT_CPU,
            Reason.INSUFFICIENT_MEMORY} <= reasons


def test_the_switch_off_recomputes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways give the same refusal; the claim the first test checks is the one the switch keeps."""
    state = ClusterState([node("n0", devices=2, cpu_milli=4000)])
    wanted = pod(4, cpu_milli=8000, name="big")
    on = base.fits_or_nofit(wanted, state)
    monkeypatch.setattr(base, "worded_from_checks", False)
    off = base.fits_or_nofit(wanted, state)
    assert isinstance(on, NoFit) and on == off
    assert on.reason is Reason.INSUFFICIENT_DEVICES
