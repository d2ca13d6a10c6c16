"""The reconciler acknowledges pods to the provider (forget_pods) once their final states are
committed, so poll() lists only pods the store has not settled yet; never before the commit."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from sqlalchemy import select

from gpupool.api.workloads import WorkloadSpec
from gpupool.config import parse_config
from gpupool.providers.fake import FakeProvider
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops import reconciler as reconciler_module
from gpupool.server.loops.control import ControlLoop
from gpupool.server.orm import PodRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import workloads
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

ADMIN = Principal("admin", None)


class Noting(FakeProvider):
    def __init__(self) -> None:
        self.now = 1_000.0
        super().__init__("1x4xT4", clock=lambda: self.now, duration_s=10.0)
        self.acknowledged: list[str] = []

    def forget_pods(self, pod_ids: Sequence[str]) -> None:
        self.acknowledged += pod_ids
        super().forget_pods(pod_ids)


class Pool:
    def __init__(self, tmp_path: Path) -> None:
        self.provider = Noting()
        url = f"sqlite:///{tmp_path / 'store.sqlite'}"
        settings = Settings(data_dir=tmp_path, database_url=url, cycle_interval_s=0.05)
        self.rt = Runtime(settings=settings, store=Store.open(url), provider=self.provider,
                          clock=lambda: self.provider.now,
                          config=parse_config("scheduling: {placement: first-fit}"))
        bootstrap(self.rt)
        self.loop = ControlLoop(self.rt)
        self.loop.recovered = self.loop.reconciler.recover()

    def submit(self, **env: str) -> str:
        spec = WorkloadSpec.model_validate({"command": ["train"], "resources": {"gpus": 1}, "env": env})
        return workloads.submit(self.rt, ADMIN, spec).id

    def pods(self) -> dict[str, str]:
        with self.rt.store.read() as session:
            return {pod_id: status for pod_id, status in session.execute(select(PodRow.id, PodRow.status))}


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    made = Pool(tmp_path)
    yield made
    made.rt.store.close()


def test_pods_settled_in_the_store_leave_the_providers_poll(pool: Pool) -> None:
    done = pool.submit()
    failed = pool.submit(GPUPOOL_FAKE_EXIT_CODE="3")
    running = pool.submit(GPUPOOL_FAKE_DURATION_S="1e9")
    pool.loop.step()
    assert len(pool.provider.poll()) == 3
    pool.provider.now += 20
    pool.loop.step()
    stored = pool.pods()
    assert sorted(stored.values()) == ["failed", "running", "succeeded"]
    assert sorted(pool.provider.acknowledged) == sorted(p for p, s in stored.items() if s != "running")
    assert [s.pod_id for s in pool.provider.poll()] == [p for p in stored if p.startswith(running)]
    assert {done, failed} & {s.pod_id.split("-a")[0] for s in pool.provider.poll()} == set()


def test_nothing_is_acknowledged_when_the_commit_fails(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails leaves the pod listed, so the next sync applies it."""
    pool.submit()
    pool.loop.step()
    pool.provider.now += 20

    def broken(*_: object) -> None:
        raise RuntimeError("the store went away")

    with monkeypatch.context() as patch:
        patch.setattr(reconciler_module, "_apply_successes", broken)
        with pytest.raises(RuntimeError):
            pool.loop.reconciler.sync()
    assert pool.provider.acknowledged == []
    [status] = pool.provider.poll()
    assert status.phase.is_final
    assert pool.loop.reconciler.sync() == 1
    assert list(pool.pods().values()) == ["succeeded"]
    assert pool.provider.acknowledged == [status.pod_id] and pool.provider.poll() == []


def test_the_reconciler_keeps_no_memory_of_pods_the_provider_forgot(pool: Pool) -> None:
    """Its set of settled ids follows what the provider still lists, not every pod ever run."""
    pool.submit(GPUPOOL_FAKE_DURATION_S="1e9")
    for _ in range(30):
        for _ in range(3):
            pool.submit(GPUPOOL_FAKE_DURATION_S="1")
        pool.loop.step()
        pool.provider.now += 2
        pool.loop.step()
    assert sorted(set(pool.pods().values())) == ["running", "succeeded"]
    assert len(pool.provider.acknowledged) == 90
    assert len(pool.provider.poll()) == 1
    assert len(pool.loop.reconciler._settled) <= 3, "the last sync's pods, until the next one"
    pool.loop.reconciler.sync()
    assert pool.loop.reconciler._settled == set()
