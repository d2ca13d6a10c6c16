"""The store's use cases on both back ends: submit, schedule, finish, cancel, quota, events."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import ManualProvider

from conftest import make_runtime
from factories import node
from gpupool.api.tenants import QueueCreate, TenantCreate
from gpupool.api.workloads import WorkloadSpec
from gpupool.errors import Conflict, NotFound, QuotaExceeded
from gpupool.server.auth import Principal
from gpupool.server.loops.control import ControlLoop
from gpupool.server.services import tenants, workloads

ADMIN = Principal("admin", None)


def _spec(gpus: float = 0.25, **extra: object) -> WorkloadSpec:
    return WorkloadSpec.model_validate({"command": ["true"], "resources": {"gpus": gpus}, **extra})


def test_lifecycle_is_recorded_on_both_back_ends(db_url: str, tmp_path: Path) -> None:
    provider = ManualProvider([node("n0", devices=1, model="H100")])
    rt, token = make_runtime(db_url, tmp_path, provider)
    assert token is not None and make_runtime(db_url, tmp_path, provider)[1] is None  # once only
    loop = ControlLoop(rt)
    ids = [workloads.submit(rt, ADMIN, _spec(0.5)).id for _ in range(3)]
    loop.step()
    running = provider.running()
    assert len(running) == 2  # two halves fit one device; the third waits
    assert workloads.get(rt, ADMIN, ids[2]).status == "pending"
    assert workloads.get(rt, ADMIN, ids[2]).reason != ""
    provider.finish(running[0], 0)
    provider.finish(running[1], 3)
    loop.step()
    loop.step()
    states = sorted(workloads.get(rt, ADMIN, i).status for i in ids)
    assert states == ["failed", "running", "succeeded"]
    failed = next(workloads.get(rt, ADMIN, i) for i in ids if workloads.get(rt, ADMIN, i).status == "failed")
    assert failed.exit_code == 3 and failed.reason == "pod_failed"
    third = workloads.cancel(rt, ADMIN, ids[2])
    assert third.status == "cancelled"
    assert provider.stopped == [third.pods[0].id]
    with pytest.raises(Conflict):
        workloads.cancel(rt, ADMIN, ids[2])
    reasons = [e.reason for e in workloads.events(rt, ADMIN, ids[2])]
    assert reasons == ["submitted", "admitted", "launched", "cancelled_by_user"]
    rt.store.close()


def test_queue_quota_caps_admitted_work(db_url: str, tmp_path: Path) -> None:
    provider = ManualProvider([node("n0", devices=8, model="H100")])
    rt, _ = make_runtime(db_url, tmp_path, provider)
    tenants.create_tenant(rt, ADMIN, TenantCreate(name="team-a"))
    tenants.create_queue(rt, ADMIN, QueueCreate(tenant="team-a", name="small", quota_gpus=1))
    with pytest.raises(QuotaExceeded):
        workloads.submit(rt, ADMIN, _spec(2, tenant="team-a", queue="small"))
    with pytest.raises(NotFound, match="smal"):
        workloads.submit(rt, ADMIN, _spec(1, tenant="team-a", queue="smal"))
    for _ in range(6):
        workloads.submit(rt, ADMIN, _spec(0.25, tenant="team-a", queue="small"))
    ControlLoop(rt).step()
    assert len(provider.running()) == 4
    (queue,) = [q for q in tenants.list_queues(rt, ADMIN, "team-a") if q.name == "small"]
    assert queue.used_gpus == 1.0 and queue.pending == 2
    rt.store.close()


def test_incremental_snapshot_matches_a_fresh_read(db_url: str, tmp_path: Path) -> None:
    """The loop re-reads only allocations whose active pods changed, and takes the API's parsed
    workloads: after admissions, exits and a cancel, its view equals one read from scratch."""
    from gpupool.core.scheduling.view import ClusterView
    from gpupool.server.loops.snapshot import WorkloadCache, load

    provider = ManualProvider([node("n0", devices=2, model="H100")])
    rt, _ = make_runtime(db_url, tmp_path, provider)
    loop = ControlLoop(rt)
    cache = loop.scheduler.cache

    def assert_same() -> None:
        incremental, fresh = load(rt, cache), load(rt, WorkloadCache())
        assert incremental.snapshot == fresh.snapshot
        assert incremental.pending == fresh.pending
        # the scheduler's kept view holds what a view built from the store would
        kept = loop.scheduler.keeper.view
        assert kept is not None and loop.scheduler.keeper.rebuilds == 1
        built = ClusterView.from_snapshot(fresh.snapshot)
        for name in ("cpu_free", "mem_free", "dev_milli_free", "dev_mem_free"):
            assert (getattr(kept.state, name) == getattr(built.state, name)).all(), name

    ids = [workloads.submit(rt, ADMIN, _spec(0.5, replicas=r)).id for r in (1, 2, 1, 1, 2)]
    assert len(rt.submitted) == 5  # handed over by the submissions
    loop.step()
    assert not rt.submitted
    assert_same()
    assert len(load(rt, cache).snapshot.allocations) == 3
    first = provider.running()[0]
    provider.finish(first, 0)
    loop.step()
    assert_same()
    workloads.cancel(rt, ADMIN, ids[1])
    loop.step()
    assert_same()
    held = {a.workload.id for a in load(rt, cache).snapshot.allocations}
    assert ids[1] not in held and held  # the cancelled one left, the others are still there
    rt.store.close()


def test_a_burst_of_arrivals_is_decided_in_capped_cycles(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A cycle that looks at new arrivals takes at most ARRIVALS_PER_CYCLE of them, oldest first,
    and asks for another cycle; every arrival is decided in the following ones."""
    from gpupool.server.loops import scheduler

    monkeypatch.setattr(scheduler, "ARRIVALS_PER_CYCLE", 4)
    provider = ManualProvider([node("n0", devices=8, model="H100")])
    rt, _ = make_runtime(f"sqlite:///{tmp_path / 'store.sqlite'}", tmp_path, provider)
    loop = ControlLoop(rt)
    loop.step()  # the first pass reads everything; later ones read new arrivals only
    ids = [workloads.submit(rt, ADMIN, _spec(0.25)).id for _ in range(10)]
    rt.wake.clear()
    admitted_per_step = []
    for _ in range(3):
        before = len(provider.running())
        loop.step(woken=True)
        admitted_per_step.append(len(provider.running()) - before)
    assert admitted_per_step == [4, 4, 2]
    assert all(workloads.get(rt, ADMIN, i).status == "running" for i in ids)
    admitted_at = [workloads.get(rt, ADMIN, i).admitted_s for i in ids]
    assert admitted_at == sorted(admitted_at)  # oldest first
    rt.store.close()
