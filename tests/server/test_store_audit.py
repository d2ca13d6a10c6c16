"""The store audit: the scheduler's cached placements against the store read afresh, at most once
per interval of a clock the test moves, on SQLite and PostgreSQL; a row changed behind the loop's
back is found, logged, counted on /metrics, and the next placement follows the store."""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from sqlalchemy import create_engine, delete, func, select, update

from conftest import Server
from gpupool.api.workloads import WorkloadSpec
from gpupool.config import parse_config
from gpupool.errors import Conflict
from gpupool.providers.fake import FakeProvider
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops.control import ControlLoop
from gpupool.server.loops.store_audit import compare
from gpupool.server.metrics import Metrics
from gpupool.server.orm import PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import workloads
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings
from gpupool.server.states import ACTIVE_POD_STATES

ADMIN = Principal("admin", None)
CONFIG = "scheduling:\n  placement: first-fit\n"
INTERVAL_S = 60.0


class Pool:
    """A control loop with its /metrics registry, on the fake provider and a clock the test moves."""

    def __init__(self, tmp_path: Path, url: str, nodes: str, interval_s: float = INTERVAL_S,
                 duration_s: float = 10_000.0) -> None:
        self.now = 1_000_000.0
        self.url = url
        self.provider = FakeProvider(nodes, clock=lambda: self.now, duration_s=duration_s)
        settings = Settings(data_dir=tmp_path, database_url=url, cycle_interval_s=0.05,
                            store_audit_interval_s=interval_s)
        self.rt = Runtime(settings=settings, store=Store.open(url), provider=self.provider,
                          clock=lambda: self.now, config=parse_config(CONFIG))
        bootstrap(self.rt)
        self.metrics = Metrics(self.rt)
        self.loop = ControlLoop(self.rt, self.metrics)
        self.loop.recovered = self.loop.reconciler.recover()
        self.nodes = [n.name for n in self.provider.nodes()]

    def submit(self, gpus: float = 1, **extra: Any) -> str:
        spec = WorkloadSpec.model_validate({"command": ["train"], "resources": {"gpus": gpus}, **extra})
        return workloads.submit(self.rt, ADMIN, spec).id

    def step(self, advance_s: float = 0.0) -> None:
        self.now += advance_s
        self.loop.step()

    def counted(self, kind: str) -> float:
        value = self.metrics.registry.get_sample_value("gpupool_store_view_divergence_total", {"kind": kind})
        assert value is not None, "the counter is served for every kind, from 0"
        return value

    def total(self) -> float:
        return sum(self.counted(kind) for kind in ("placement", "missing", "status"))

    def pods(self, workload_id: str) -> list[tuple[str, str, list[dict[str, int]]]]:
        """(pod id, node, slices) of the workload's active pods, as stored."""
        with self.rt.store.read() as session:
            return [(p.id, p.node, p.slices) for p in session.scalars(
                select(PodRow).where(PodRow.workload_id == workload_id, PodRow.status.in_(ACTIVE_POD_STATES))
                .order_by(PodRow.rank))]

    def behind_the_back(self, statement: Any) -> None:
        """Run `statement` on a connection of its own, as another process would."""
        engine = create_engine(self.url)
        try:
            with engine.begin() as conn:
                conn.execute(statement)
        finally:
            engine.dispose()

    def cached_nodes(self, workload_id: str) -> list[str]:
        _, allocation = self.loop.scheduler.cache.allocations()[workload_id]
        return [p.node for p in allocation.placements]


@pytest.fixture
def pool(tmp_path: Path, db_url: str) -> Iterator[Pool]:
    made = Pool(tmp_path, db_url, "2x1xH100")
    yield made
    made.rt.store.close()


def _moved_behind_the_back(pool: Pool) -> tuple[str, str]:
    """One workload runs on the first node; its pod row is then moved to the second node's device
    by another connection. Returns (the workload, the node it was moved to)."""
    first, second = pool.nodes
    wid = pool.submit(gpus=1)
    pool.step()
    pool.step()
    [(pod_id, node, slices)] = pool.pods(wid)
    assert node == first and pool.cached_nodes(wid) == [first]
    pool.behind_the_back(update(PodRow).where(PodRow.id == pod_id).values(node=second, slices=slices))
    return wid, second


def test_no_divergence_over_many_cycles(tmp_path: Path, db_url: str) -> None:
    """Admissions, gangs, completions, cancels and time passing, 200 steps over 200 minutes of the
    test's clock: the audit runs every minute and never finds anything."""
    pool = Pool(tmp_path, db_url, "4x4xH100", duration_s=150.0)
    try:
        rng = random.Random(7)
        submitted: list[str] = []
        for _ in range(200):
            for _ in range(rng.randrange(3)):
                gpus = rng.choice([0.25, 0.5, 1, 2, 4])
                replicas = rng.choice([1, 1, 1, 2])
                submitted.append(pool.submit(gpus=gpus, replicas=replicas))
            if submitted and rng.random() < 0.15:
                victim = submitted.pop(rng.randrange(len(submitted)))
                with contextlib.suppress(Conflict):  # it may have ended already
                    workloads.cancel(pool.rt, ADMIN, victim)
            pool.step(advance_s=rng.choice([0.5, 5.0, 60.0]))
        audit = pool.loop.scheduler.store_audit
        assert audit.runs >= 60, "the audit ran every minute of the clock"
        assert not audit.found and pool.total() == 0
        assert not compare(pool.rt, pool.loop.scheduler.cache), "and nothing differs at the end"
        with pool.rt.store.read() as session:
            by_status = select(WorkloadRow.status, func.count()).group_by(WorkloadRow.status)
            ended: dict[str, int] = {status: count for status, count in session.execute(by_status)}
            gangs = session.scalar(select(func.count(func.distinct(PodRow.workload_id)))
                                   .where(PodRow.rank == 1)) or 0
        assert ended["succeeded"] >= 50 and ended["cancelled"] >= 5 and gangs >= 20, "work came and went"
    finally:
        pool.rt.store.close()


def test_a_pod_moved_behind_the_loops_back_is_found_and_the_view_follows_the_store(
        pool: Pool, caplog: pytest.LogCaptureFixture) -> None:
    first, second = pool.nodes
    wid, moved_to = _moved_behind_the_back(pool)
    assert pool.total() == 0 and pool.cached_nodes(wid) == [first], "the cache has not seen it yet"
    caplog.set_level(logging.ERROR, logger="gpupool.scheduler")
    late = pool.submit(gpus=1)  # one device is free in the store: the first node's
    pool.step(advance_s=INTERVAL_S)
    assert pool.counted("placement") == 1 and pool.total() == 1
    [record] = [r for r in caplog.records if "differed from the store" in r.getMessage()]
    message = record.getMessage()
    assert f"placement 1 (pod {wid}-a1-r0: {first} [0:1000m/81920MiB]" in message
    assert f"{moved_to} [0:1000m/81920MiB]" in message and "rebuilds it from the store" in message
    # the view was rebuilt from the store: the cached placement is where the row says, and the
    # workload that came meanwhile went to the device the store says is free, not onto the moved pod
    assert pool.cached_nodes(wid) == [second]
    assert [node for _, node, _ in pool.pods(late)] == [first]
    assert not compare(pool.rt, pool.loop.scheduler.cache)
    pool.step(advance_s=INTERVAL_S)
    assert pool.total() == 1, "counted once: the next audit finds the view and the store alike"
    text = generate_latest(pool.metrics.registry).decode()
    assert 'gpupool_store_view_divergence_total{kind="placement"} 1.0' in text


def test_without_the_audit_the_loop_goes_on_with_the_stale_view(tmp_path: Path, db_url: str) -> None:
    """The mutation control of the test above: with the audit off (interval 0) the same change goes
    unseen, and the next workload is placed onto the device the moved pod holds in the store."""
    pool = Pool(tmp_path, db_url, "2x1xH100", interval_s=0.0)
    try:
        first, second = pool.nodes
        wid, _ = _moved_behind_the_back(pool)
        late = pool.submit(gpus=1)
        for _ in range(3):
            pool.step(advance_s=INTERVAL_S)
        assert pool.loop.scheduler.store_audit.runs == 0 and pool.total() == 0
        assert pool.cached_nodes(wid) == [first]
        assert [node for _, node, _ in pool.pods(late)] == [second], "two pods on one device in the store"
    finally:
        pool.rt.store.close()


def test_a_pod_row_deleted_behind_the_loops_back_is_found(pool: Pool) -> None:
    wid = pool.submit(gpus=1)
    pool.step()
    pool.step()
    [(pod_id, _, _)] = pool.pods(wid)
    pool.behind_the_back(delete(PodRow).where(PodRow.id == pod_id))
    pool.step(advance_s=INTERVAL_S)
    # its row is gone, and its workload still says it runs while it holds no pod
    assert pool.counted("missing") == 1 and pool.counted("status") == 1
    assert wid not in pool.loop.scheduler.cache.allocations(), "the view holds what the store holds"


def test_a_status_changed_behind_the_loops_back_is_found(pool: Pool) -> None:
    wid = pool.submit(gpus=1)
    pool.step()
    pool.step()
    pool.behind_the_back(update(WorkloadRow).where(WorkloadRow.id == wid).values(status="succeeded"))
    pool.step(advance_s=INTERVAL_S)
    assert pool.counted("status") == 1 and pool.counted("placement") == 0


def test_the_audit_runs_at_most_once_per_interval(pool: Pool) -> None:
    audit = pool.loop.scheduler.store_audit
    pool.step()
    assert audit.runs == 1, "the first cycle audits"
    _moved_behind_the_back(pool)  # changed right after that audit
    for _ in range(59):
        pool.step(advance_s=1.0)
        pool.loop.scheduler.cycle()
    assert audit.runs == 1 and pool.total() == 0, "not again within the interval, however many cycles"
    pool.step(advance_s=1.0)  # one interval after the first audit
    assert audit.runs == 2 and pool.counted("placement") == 1
    for _ in range(10):
        pool.step(advance_s=5.0)
    assert audit.runs == 2
    pool.step(advance_s=10.0)
    assert audit.runs == 3 and pool.total() == 1


def test_an_interval_of_zero_turns_the_audit_off_and_a_negative_one_is_refused() -> None:
    from gpupool.errors import InvalidInput

    assert Settings(store_audit_interval_s=0).store_audit_interval_s == 0
    assert Settings().with_env({"GPUPOOL_STORE_AUDIT_INTERVAL_S": "15"}).store_audit_interval_s == 15
    with pytest.raises(InvalidInput):
        Settings(store_audit_interval_s=-1)
    with pytest.raises(InvalidInput):
        Settings().with_env({"GPUPOOL_STORE_AUDIT_INTERVAL_S": "soon"})


def test_metrics_serve_the_counter_at_zero(server: Server) -> None:
    text = server.client.get("/metrics", headers=server.headers()).text
    for kind in ("placement", "missing", "status"):
        assert f'gpupool_store_view_divergence_total{{kind="{kind}"}} 0.0' in text
