"""A full pass reads at most MAX_PENDING_PER_CYCLE pending workloads. While more wait than that,
each priority is read in turn with the tenants taking turns within it, so one tenant's backlog of
work that cannot start does not keep every other tenant's work unread (loops/snapshot.py)."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import ManualProvider
from sqlalchemy import update

from conftest import make_runtime
from factories import node
from gpupool.api.tenants import QueueCreate, TenantCreate
from gpupool.api.workloads import WorkloadSpec
from gpupool.server.auth import Principal
from gpupool.server.loops.control import ControlLoop
from gpupool.server.loops.snapshot import WorkloadCache, load
from gpupool.server.orm import WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import tenants, workloads

ADMIN = Principal("admin", None)


def _submit(rt: Runtime, tenant: str | None, gpus: float = 0.25, **extra: object) -> str:
    spec = WorkloadSpec.model_validate({"command": ["true"], "resources": {"gpus": gpus}, **extra})
    who = ADMIN if tenant is None else Principal("t", tenant)
    return workloads.submit(rt, who, spec).id


@pytest.fixture
def pool(db_url: str, tmp_path: Path) -> Iterator[tuple[Runtime, ManualProvider]]:
    provider = ManualProvider([node("n0", devices=8, model="H100")])
    rt, _ = make_runtime(db_url, tmp_path, provider)
    for name in ("a", "b", "c"):
        tenants.create_tenant(rt, ADMIN, TenantCreate(name=name))
    try:
        yield rt, provider
    finally:
        rt.store.close()


def test_past_one_reads_worth_tenants_take_turns_within_each_priority(
        pool: tuple[Runtime, ManualProvider]) -> None:
    rt, _ = pool
    a = [_submit(rt, "a") for _ in range(12)]
    b = [_submit(rt, "b") for _ in range(3)]
    c = _submit(rt, "c", priority=5)
    cache = WorkloadCache()
    view = load(rt, cache, limit=10)
    # the higher priority first; then a's and b's oldest, their second oldest, ...; in the core's order
    assert [w.id for w in view.pending] == [c, *a[:6], *b]
    assert cache.saturated
    view = load(rt, cache, limit=10)  # the next full read takes turns at once
    assert [w.id for w in view.pending] == [c, *a[:6], *b] and cache.saturated
    with rt.store.write() as session:  # fewer than a read's worth left: the core's order again
        session.execute(update(WorkloadRow).where(WorkloadRow.id.in_(a[3:])).values(status="cancelled"))
    view = load(rt, cache, limit=10)
    assert [w.id for w in view.pending] == [c, *a[:3], *b] and not cache.saturated
    # the arrivals' read is by the ids asked for, in the core's order, with no turns
    view = load(rt, WorkloadCache(), since_s=0.0, limit=2)
    assert [w.id for w in view.pending] == [c, a[0]]


def test_work_behind_another_tenants_backlog_is_read_and_starts_when_room_is_made(
        pool: tuple[Runtime, ManualProvider], monkeypatch: pytest.MonkeyPatch) -> None:
    rt, provider = pool
    monkeypatch.setattr("gpupool.server.loops.scheduler.MAX_PENDING_PER_CYCLE", 10)
    tenants.create_queue(rt, ADMIN, QueueCreate(tenant="a", name="capped", quota_gpus=1))
    loop = ControlLoop(rt)
    backlog = [_submit(rt, "a", gpus=1, queue="capped") for _ in range(14)]  # 13 wait on a's quota
    filler = _submit(rt, "c", gpus=7)
    for _ in range(3):
        loop.step()
    assert workloads.get(rt, ADMIN, filler).status == "running"
    theirs = _submit(rt, "b", gpus=1)  # no room: set aside until capacity changes
    for _ in range(3):
        loop.step()
    assert workloads.get(rt, ADMIN, theirs).status == "pending"
    provider.finish(workloads.get(rt, ADMIN, filler).pods[0].id)  # room for it; a's quota still full
    for _ in range(3):
        loop.step()
    assert workloads.get(rt, ADMIN, theirs).status == "running"  # read from the store
    assert sum(workloads.get(rt, ADMIN, w).status == "running" for w in backlog) == 1


def test_the_cycle_benchmark_reads_as_the_server_does(pool: tuple[Runtime, ManualProvider]) -> None:
    # bench/cycle_latency.py --path server hands the core what this read hands it: its own copy of
    # the turns, checked against the store's on a mix of tenants and priorities
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import cycle_latency

    rt, _ = pool
    rng = random.Random(7)
    for _ in range(60):
        _submit(rt, rng.choice("abc"), priority=rng.choice((0, 0, 1, 2)))
    everything = list(load(rt, WorkloadCache(), limit=1000).pending)
    assert len({w.tenant for w in everything}) == 3
    changed = 0
    for limit in (5, 17, 31, 59):
        read = [w.id for w in load(rt, WorkloadCache(), limit=limit).pending]
        assert [w.id for w in cycle_latency._in_turns(everything, limit)] == read
        changed += read != [w.id for w in everything[:limit]]
    assert changed  # where the turns read other work than the core's order would
