"""One launch that fails or raises fails its own workload alone: the rest of the batch starts and is
metered, the failed pod is final at once (its devices free), and a pod stopped while it was being
launched is stopped once the launch returns."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from storereads import StoreReads

from factories import ISSUE_CONFIG
from gpupool.api.workloads import WorkloadSpec
from gpupool.config import parse_config
from gpupool.pods import PodLaunch, PodPhase
from gpupool.providers.fake import FakeProvider
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops.control import ControlLoop
from gpupool.server.runtime import Runtime
from gpupool.server.services import workloads
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

ADMIN = Principal("admin", None)


class HookedProvider(FakeProvider):
    """A fake provider that runs `before_launch` (which may raise) before each launch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.before_launch: Callable[[PodLaunch], None] = lambda pod: None

    def launch(self, pod: PodLaunch) -> None:
        self.before_launch(pod)
        super().launch(pod)


class Pool(StoreReads):
    def __init__(self, tmp_path: Path) -> None:
        self.now = 1_000_000.0
        self.provider = HookedProvider("1x8xH100", clock=lambda: self.now, duration_s=10_000.0)
        url = f"sqlite:///{tmp_path / 'store.sqlite'}"
        settings = Settings(data_dir=tmp_path, database_url=url, cycle_interval_s=0.05)
        self.rt = Runtime(settings=settings, store=Store.open(url), provider=self.provider,
                          clock=lambda: self.now, config=parse_config(ISSUE_CONFIG))
        bootstrap(self.rt)
        self.loop = ControlLoop(self.rt)
        self.loop.recovered = self.loop.reconciler.recover()

    def submit(self, gpus: float, command: str = "train") -> str:
        spec = WorkloadSpec.model_validate({"command": [command], "resources": {"gpus": gpus}})
        return workloads.submit(self.rt, ADMIN, spec).id


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    made = Pool(tmp_path)
    yield made
    made.rt.store.close()


def _raise_for(command: str, error: Exception) -> Callable[[PodLaunch], None]:
    def hook(pod: PodLaunch) -> None:
        if pod.command[0] == command:
            raise error
    return hook


@pytest.mark.parametrize("error", [ValueError("embedded null byte"), KeyError("spec")])
def test_a_launch_that_raises_fails_its_workload_alone_and_frees_its_devices(pool: Pool,
                                                                             error: Exception) -> None:
    pool.provider.before_launch = _raise_for("poison", error)
    first = pool.submit(2)
    poisoned = pool.submit(4, command="poison")
    last = pool.submit(2)
    pool.loop.step()  # one cycle places all three (8 devices): one launch batch
    for good in (first, last):
        row = pool.row(good)
        assert row.status == "running" and row.started_s == pool.now, good
        [pod] = pool.pods(good)
        assert pod.status == "running" and pod.started_s == pool.now, "metered from its start"
    row = pool.row(poisoned)
    assert row.status == "failed" and row.finished_s == pool.now
    to_status, reason, message = pool.last_event(poisoned)
    assert (to_status, reason) == ("failed", "launch_failed")
    assert "internal error" in message and "server's log" in message
    [pod] = pool.pods(poisoned)
    assert pod.status == "failed" and pod.started_s is None and pod.message.startswith("Never started: ")
    # its four devices are free again: a workload that needs them starts at the next cycle
    after = pool.submit(4)
    pool.now += 1.0
    pool.loop.step()
    assert pool.row(after).status == "running"


def test_a_provider_error_is_the_reason_told(pool: Pool) -> None:
    from gpupool.errors import ProviderError

    pool.provider.before_launch = _raise_for("poison", ProviderError("The launcher for account x did not "
                                                                      "answer within 10 s; it was replaced."))
    poisoned = pool.submit(1, command="poison")
    pool.loop.step()
    _, reason, message = pool.last_event(poisoned)
    assert reason == "launch_failed" and "did not answer within 10 s" in message
    assert [p.status for p in pool.pods(poisoned)] == ["failed"]


def test_a_pod_cancelled_while_it_is_launched_is_stopped_once_the_launch_returns(pool: Pool) -> None:
    """The cancel asks the provider to stop the pod before the provider knows it (a no-op there)."""
    def cancel_first(pod: PodLaunch) -> None:
        workloads.cancel(pool.rt, ADMIN, pod.workload_id)

    pool.provider.before_launch = cancel_first
    workload_id = pool.submit(1)
    pool.loop.step()
    assert pool.row(workload_id).status == "cancelled"
    [status] = [s for s in pool.provider.poll() if s.pod_id.startswith(workload_id)]
    assert status.phase is PodPhase.STOPPED, "the provider was asked again once it knew the pod"
    pool.now += 1.0
    pool.loop.step()
    assert [p.status for p in pool.pods(workload_id)] == ["stopped"]


def test_a_pod_cancelled_while_its_launch_fails_is_final_at_once(pool: Pool) -> None:
    def cancel_then_fail(pod: PodLaunch) -> None:
        workloads.cancel(pool.rt, ADMIN, pod.workload_id)
        raise ValueError("embedded null byte")

    pool.provider.before_launch = cancel_then_fail
    workload_id = pool.submit(8)
    pool.loop.step()
    assert pool.row(workload_id).status == "cancelled"
    [pod] = pool.pods(workload_id)
    assert pod.status == "failed" and pod.finished_s == pool.now, "not left stopping for ever"
    pool.provider.before_launch = lambda pod: None
    after = pool.submit(8)
    pool.now += 1.0
    pool.loop.step()
    assert pool.row(after).status == "running", "its devices are free"
