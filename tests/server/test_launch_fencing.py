"""A launch decided under one leadership is not begun, or is stopped at once, by a server that lost
the leadership before or during the provider's call (loops/launches.py, `may_launch`)."""

from __future__ import annotations

import time

from factories import node
from gpupool.pods import PodLaunch
from gpupool.providers.fake import FakeProvider
from gpupool.server.loops.launches import NOT_LEADER, LaunchWorkers, Outcome


class _Provider(FakeProvider):
    """Fake pods; `during` runs inside each launch call (the leadership lost meanwhile)."""

    def __init__(self) -> None:
        super().__init__([node("n0", devices=2)])
        self.during = lambda: None
        self.launched: list[str] = []
        self.stopped: list[str] = []

    def launch(self, pod: PodLaunch) -> None:
        self.during()
        super().launch(pod)
        self.launched.append(pod.pod_id)

    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        self.stopped.append(pod_id)
        super().stop(pod_id, grace_s)


def _launch(pod_id: str) -> PodLaunch:
    return PodLaunch(pod_id=pod_id, workload_id="w", node="n0", command=("true",), env={})


def _outcomes(workers: LaunchWorkers, n: int) -> list[Outcome]:
    got: list[Outcome] = []
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        got += workers.collect()
        time.sleep(0.01)
    return got


def test_a_launch_is_not_begun_and_one_in_flight_is_stopped_once_leadership_is_lost() -> None:
    provider = _Provider()
    leading = [True]
    workers = LaunchWorkers(provider, time.time)
    workers.may_launch = lambda: leading[0]
    workers.submit([_launch("p1")])
    (first,) = _outcomes(workers, 1)
    assert first.started_s is not None and provider.stopped == []
    provider.during = lambda: leading.__setitem__(0, False)  # lost while the provider launches
    workers.submit([_launch("p2")])
    (second,) = _outcomes(workers, 1)
    assert second.started_s is None and second.why == NOT_LEADER
    assert provider.stopped == ["p2"]  # started by the call, stopped at once
    provider.during = lambda: None
    workers.submit([_launch("p3")])  # lost before: never begun
    (third,) = _outcomes(workers, 1)
    assert third.why == NOT_LEADER and "p3" not in provider.launched


def test_each_launch_carries_the_epoch_it_was_decided_under() -> None:
    provider = _Provider()
    seen: list[int | None] = []
    provider.during = lambda: None
    original = provider.launch

    def launch(pod: PodLaunch) -> None:
        seen.append(pod.epoch)
        original(pod)

    provider.launch = launch  # type: ignore[method-assign]
    workers = LaunchWorkers(provider, time.time)
    workers.submit([_launch("single")])  # a single server: no epoch, the node never fences
    assert len(_outcomes(workers, 1)) == 1
    workers.launch_epoch = lambda: 7
    workers.submit([_launch("led")])
    assert len(_outcomes(workers, 1)) == 1
    assert seen == [None, 7]
