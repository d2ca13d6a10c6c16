"""The fake provider's incremental poll reports what working out every pod's status afresh reports,
through random launches, stops (with and without a grace period honoured), clock moves and a clock
that goes back."""

from __future__ import annotations

import random

import pytest

from gpupool.core.model import Slice
from gpupool.pods import PodLaunch, PodStatus
from gpupool.providers.fake import FakeProvider


def _afresh(provider: FakeProvider) -> dict[str, PodStatus]:
    return {pod_id: provider._status(pod) for pod_id, pod in provider._pods.items()}


@pytest.mark.parametrize("seed", range(5))
def test_poll_matches_every_status_worked_out_afresh(seed: int) -> None:
    rng = random.Random(seed)
    clock = {"now": 100.0}
    provider = FakeProvider("2x8xH100", clock=lambda: clock["now"], duration_s=30.0, startup_s=2.0)
    nodes = [n.name for n in provider.nodes()]
    launched: list[str] = []
    for step in range(300):
        action = rng.random()
        if action < 0.35:
            pod_id = f"p{step}"
            env = {"GPUPOOL_FAKE_DURATION_S": str(rng.choice([0, 1, 5, 50]))}
            if rng.random() < 0.3:
                env["GPUPOOL_FAKE_IGNORE_TERM"] = "1"
            provider.launch(PodLaunch(pod_id=pod_id, workload_id=pod_id, node=rng.choice(nodes),
                                      command=("x",), slices=(Slice(0, 100, 0),), env=env))
            launched.append(pod_id)
        elif action < 0.5 and launched:
            provider.stop(rng.choice(launched), grace_s=rng.choice([0.0, 3.0, 10.0]))
        elif action < 0.95:
            clock["now"] += rng.choice([0.0, 0.5, 1.0, 2.0, 7.0])
        else:
            clock["now"] -= rng.uniform(0, 5)  # an injected clock may step back
        polled = {s.pod_id: s for s in provider.poll()}
        assert polled == _afresh(provider)
    phases = {s.phase for s in provider.poll()}
    assert len(phases) >= 3  # the walk reached starting/running pods and ended ones alike


@pytest.mark.parametrize("seed", range(5))
def test_a_forgotten_pod_never_comes_back_and_the_rest_match_afresh(seed: int) -> None:
    """forget_pods (poll's acknowledgement) drops ended pods only, and for good: not when a stopped
    pod's natural end comes round later, nor when the clock steps back."""
    rng = random.Random(seed)
    clock = {"now": 100.0}
    provider = FakeProvider("2x8xH100", clock=lambda: clock["now"], duration_s=30.0, startup_s=2.0)
    nodes = [n.name for n in provider.nodes()]
    launched: list[str] = []
    forgotten: set[str] = set()
    for step in range(300):
        action = rng.random()
        if action < 0.3:
            pod_id = f"p{step}"
            env = {"GPUPOOL_FAKE_DURATION_S": str(rng.choice([0, 1, 5, 50]))}
            provider.launch(PodLaunch(pod_id=pod_id, workload_id=pod_id, node=rng.choice(nodes),
                                      command=("x",), slices=(Slice(0, 100, 0),), env=env))
            launched.append(pod_id)
        elif action < 0.45 and launched:
            provider.stop(rng.choice(launched), grace_s=rng.choice([0.0, 3.0]))
        elif action < 0.9:
            clock["now"] += rng.choice([0.0, 1.0, 2.0, 7.0, 60.0])
        else:
            clock["now"] -= rng.uniform(0, 5)
        polled = {s.pod_id: s for s in provider.poll()}
        assert polled == {p: s for p, s in _afresh(provider).items() if p not in forgotten}
        if rng.random() < 0.5 and launched:
            asked = rng.sample(launched, min(len(launched), 4))
            provider.forget_pods(asked)
            forgotten |= {p for p in asked if p in polled and polled[p].phase.is_final}
            assert not forgotten & {s.pod_id for s in provider.poll()}
    assert forgotten and len(forgotten) < len(launched)
