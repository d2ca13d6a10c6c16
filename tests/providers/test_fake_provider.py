"""The fake provider: pods follow the injected clock; the registry names providers and suggests."""

from __future__ import annotations

import pytest

from gpupool.errors import InvalidInput, UnknownName
from gpupool.pods import PodLaunch, PodPhase
from gpupool.providers.fake import FakeProvider
from gpupool.providers.registry import make_provider, provider_names


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pod(pod_id: str, node: str, **env: str) -> PodLaunch:
    return PodLaunch(pod_id=pod_id, workload_id="w", node=node, command=("x",), env=env)


def test_pods_follow_the_injected_clock() -> None:
    clock = Clock()
    fake = FakeProvider("1x2xT4", clock=clock, duration_s=10, startup_s=1)
    node = fake.nodes()[0].name
    fake.launch(pod("a", node))
    fake.launch(pod("b", node, GPUPOOL_FAKE_DURATION_S="3", GPUPOOL_FAKE_EXIT_CODE="2"))
    assert {s.pod_id: s.phase for s in fake.poll()} == {"a": PodPhase.STARTING, "b": PodPhase.STARTING}
    clock.now = 102
    assert {s.pod_id: s.phase for s in fake.poll()} == {"a": PodPhase.RUNNING, "b": PodPhase.RUNNING}
    clock.now = 104
    b = {s.pod_id: s for s in fake.poll()}["b"]
    assert (b.phase, b.exit_code, b.finished_at_s) == (PodPhase.FAILED, 2, 104)
    clock.now = 111
    a = {s.pod_id: s for s in fake.poll()}["a"]
    assert (a.phase, a.exit_code, a.finished_at_s) == (PodPhase.SUCCEEDED, 0, 111)


def test_stop_respects_the_grace_period_for_term_ignoring_pods() -> None:
    clock = Clock()
    fake = FakeProvider("1x1xT4", clock=clock, duration_s=100)
    node = fake.nodes()[0].name
    fake.launch(pod("stubborn", node, GPUPOOL_FAKE_IGNORE_TERM="1"))
    fake.stop("stubborn", grace_s=5)
    clock.now += 4
    assert fake.poll()[0].phase is PodPhase.RUNNING
    clock.now += 1
    status = fake.poll()[0]
    assert (status.phase, status.exit_code) == (PodPhase.STOPPED, 137)


def test_bad_override_is_explained() -> None:
    fake = FakeProvider("1x1xT4")
    with pytest.raises(InvalidInput, match="GPUPOOL_FAKE_DURATION_S"):
        fake.launch(pod("a", fake.nodes()[0].name, GPUPOOL_FAKE_DURATION_S="soon"))


def test_openb_style_nodes_and_unknown_provider() -> None:
    assert {"fake", "local"} <= set(provider_names())
    fake = make_provider("fake", nodes="3x8xV100M32")
    assert len(fake.nodes()) == 3
    with pytest.raises(UnknownName, match="Did you mean 'local'"):
        make_provider("lcoal")


def test_checkpoints_every_interval_of_running_and_kept_across_attempts() -> None:
    clock = Clock()
    fake = FakeProvider("1x2xT4", clock=clock, duration_s=35, startup_s=1)
    node = fake.nodes()[0].name
    fake.launch(pod("a1", node, GPUPOOL_FAKE_CHECKPOINT_S="10"))  # runs from 101
    clock.now = 110.5
    assert fake.checkpoint_s("w") is None
    clock.now = 126
    assert fake.checkpoint_s("w") == 121
    fake.stop("a1", grace_s=0)
    clock.now = 200
    assert fake.checkpoint_s("w") == 121  # the stop at 126 came before the mark at 131
    fake.launch(pod("a2", node, GPUPOOL_FAKE_CHECKPOINT_S="10"))  # the next attempt, from 201
    clock.now = 205
    assert fake.checkpoint_s("w") == 121
    clock.now = 500
    assert fake.checkpoint_s("w") == 231  # ended at 236 having run 35 s
    fake.forget_workload("w")
    assert fake.checkpoint_s("w") is None
    fake.launch(pod("plain", node))
    assert fake.checkpoint_s("w") is None
    with pytest.raises(InvalidInput, match="GPUPOOL_FAKE_CHECKPOINT_S"):
        fake.launch(pod("bad", node, GPUPOOL_FAKE_CHECKPOINT_S="often"))


def test_exec_into_a_fake_pod_says_why_it_cannot() -> None:
    from gpupool.errors import ProviderError

    with pytest.raises(ProviderError, match="not processes, so nothing can run inside them"):
        FakeProvider("1x1xT4").exec("n0", "p-1", ["true"])
