"""PostgreSQL: the control loop's writes that touch pods and then their workloads take the
workload's row first, as a cancel does, so a cancel racing them waits instead of deadlocking.

Each test stops the loop's transaction right after it has written the pods (its locks held), runs a
user's cancel of the same workload on another thread until PostgreSQL reports that cancel waiting
for a lock, then lets the loop go on. Taken the other way round (pods, then the workload), the two
wait for each other and PostgreSQL aborts one of them ("deadlock detected": the cancel answered
503, or the loop's whole write undone).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.exc import OperationalError

from gpupool.api.workloads import WorkloadSpec
from gpupool.config import parse_config
from gpupool.errors import Conflict, StoreUnavailable
from gpupool.providers.fake import FakeProvider
from gpupool.server import pgtemp
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops import launching as launching_module
from gpupool.server.loops import reconciler as reconciler_module
from gpupool.server.loops.control import ControlLoop
from gpupool.server.orm import WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import workloads
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

ADMIN = Principal("admin", None)


class Pool:
    """A control loop on the fake provider over a PostgreSQL store, with a clock the test moves."""

    def __init__(self, tmp_path: Path, url: str) -> None:
        self.url = url
        self.now = 1_000_000.0
        self.provider = FakeProvider("1x8xH100", clock=lambda: self.now, duration_s=10.0)
        settings = Settings(data_dir=tmp_path, database_url=url, cycle_interval_s=0.05)
        self.rt = Runtime(settings=settings, store=Store.open(url), provider=self.provider,
                          clock=lambda: self.now, config=parse_config("scheduling: {placement: first-fit}\n"))
        bootstrap(self.rt)
        self.loop = ControlLoop(self.rt)
        self.loop.recovered = self.loop.reconciler.recover()
        self.store_failures: list[str] = []
        unavailable = self.rt.store._unavailable

        def noted(exc: OperationalError) -> StoreUnavailable:
            self.store_failures.append(str(exc.orig))
            return unavailable(exc)

        self.rt.store._unavailable = noted  # type: ignore[method-assign]

    def submit(self, **env: str) -> str:
        spec = WorkloadSpec.model_validate({"command": ["train"], "resources": {"gpus": 1}, "env": env})
        return workloads.submit(self.rt, ADMIN, spec).id

    def status(self, workload_id: str) -> str:
        with self.rt.store.read() as session:
            return str(session.scalar(select(WorkloadRow.status).where(WorkloadRow.id == workload_id)))


@pytest.fixture
def pool(tmp_path: Path, postgres: pgtemp.TempPostgres) -> Iterator[Pool]:
    made = Pool(tmp_path, postgres.create_database())
    yield made
    made.rt.store.close()


class RacingCancel:
    """The user's cancel of one workload, made on its own thread while the loop's transaction is
    open; `start()` returns once PostgreSQL shows the cancel waiting for a lock (or it has ended)."""

    def __init__(self, pool: Pool, workload_id: str) -> None:
        self.pool, self.workload_id = pool, workload_id
        self.outcome: str = ""
        self.thread = threading.Thread(target=self._cancel, daemon=True)

    def _cancel(self) -> None:
        try:
            workloads.cancel(self.pool.rt, ADMIN, self.workload_id)
            self.outcome = "cancelled"
        except Conflict as exc:
            self.outcome = f"conflict: {exc}"
        except StoreUnavailable as exc:
            self.outcome = f"store unavailable: {exc}"

    def start(self) -> None:
        engine = create_engine(self.pool.url)
        waiting = text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                       "AND datname = current_database()")
        try:
            with engine.connect() as watch:
                self.thread.start()
                while self.thread.is_alive() and not watch.execute(waiting).scalar():
                    watch.rollback()  # a fresh snapshot of the activity view each time
                    time.sleep(0.005)
        finally:
            engine.dispose()

    def join(self) -> str:
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the cancel never finished"
        return self.outcome


def race_once(pool: Pool, workload_id: str, original: Callable[..., Any],
              when: Callable[..., bool] = lambda *a, **k: True) -> tuple[Callable[..., Any], list[Any]]:
    """`original`, wrapped: the first call for which `when` holds races a cancel first."""
    raced: list[RacingCancel] = []

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not raced and when(*args, **kwargs):
            raced.append(RacingCancel(pool, workload_id))
            raced[0].start()
        return original(*args, **kwargs)

    return wrapped, raced


def test_a_cancel_racing_the_record_of_a_launch_waits_for_it(
        pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    workload_id = pool.submit()
    wrapped, raced = race_once(pool, workload_id, launching_module.states,
                               when=lambda conn, ids, *, with_spec: not with_spec and workload_id in ids)
    monkeypatch.setattr(launching_module, "states", wrapped)  # record_launches reads after writing the pods
    pool.loop.step()
    assert raced, "the launch was recorded"
    assert raced[0].join() == "cancelled"
    assert pool.store_failures == []
    assert pool.status(workload_id) == "cancelled"


def test_a_cancel_racing_the_settling_of_finished_pods_waits_for_it(
        pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    workload_id = pool.submit()
    pool.loop.step()
    assert pool.status(workload_id) == "running"
    wrapped, raced = race_once(pool, workload_id, reconciler_module.apply_moves)
    monkeypatch.setattr(reconciler_module, "apply_moves", wrapped)  # after the pods are settled
    pool.now += 11.0
    pool.loop.step()
    assert raced, "the pods that exited 0 were settled"
    assert raced[0].join().startswith("conflict: Workload")  # it had succeeded when the cancel got its row
    assert pool.store_failures == []
    assert pool.status(workload_id) == "succeeded"


def test_a_cancel_racing_the_record_of_a_failed_pod_waits_for_it(
        pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    workload_id = pool.submit(GPUPOOL_FAKE_EXIT_CODE="3")
    pool.loop.step()
    wrapped, raced = race_once(pool, workload_id, reconciler_module.transition)
    monkeypatch.setattr(reconciler_module, "transition", wrapped)  # after the failed pod is written
    pool.now += 11.0
    pool.loop.step()
    assert raced, "the failed pod was recorded"
    assert raced[0].join().startswith("conflict: Workload")
    assert pool.store_failures == []
    assert pool.status(workload_id) == "failed"


def test_a_cancel_after_the_settles_read_is_not_written_over_by_a_success(
        pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of finished pods with a failure in it is settled through the ORM, which writes the
    workload's row by its id alone: the rows it read must stay locked until it commits, or a cancel
    committed in between is overwritten (cancelled, then succeeded). Checked between the read and
    the write: where another connection can take the row, the cancel is made there and then."""
    failing = pool.submit(GPUPOOL_FAKE_EXIT_CODE="3")
    workload_id = pool.submit()
    pool.loop.step()
    transition = reconciler_module.transition
    cancelled_between: list[bool] = []

    def cancel_between(session: Any, row: WorkloadRow, to_status: str, *args: Any, **kwargs: Any) -> None:
        if row.id == workload_id and not cancelled_between:
            cancelled_between.append(cancel_if_free(pool, workload_id))
        transition(session, row, to_status, *args, **kwargs)

    monkeypatch.setattr(reconciler_module, "transition", cancel_between)
    pool.now += 11.0
    pool.loop.step()
    assert pool.status(failing) == "failed"
    if cancelled_between == [True]:
        assert pool.status(workload_id) == "cancelled", "the cancel committed in between was written over"
    assert cancelled_between == [False], "the row was locked from the settle's read to its commit"
    assert pool.status(workload_id) == "succeeded"


def cancel_if_free(pool: Pool, workload_id: str, cancel: bool = True) -> bool:
    """Whether another connection can take the workload's row; if so (and `cancel`), cancel the
    workload there and then (committed)."""
    engine = create_engine(pool.url)
    try:
        with engine.connect() as other:
            try:
                other.execute(select(WorkloadRow.id).where(WorkloadRow.id == workload_id)
                              .with_for_update(nowait=True))
                free = True
            except OperationalError:
                free = False
            other.rollback()
    finally:
        engine.dispose()
    if free and cancel:
        workloads.cancel(pool.rt, ADMIN, workload_id)
    return free


def test_the_recovery_after_a_restart_locks_the_workloads_it_writes(
        pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """At start-up the recovery marks lost the pods the provider no longer knows and fails their
    workloads through the ORM: the rows it read stay locked until it commits. (Only checked: the
    recovery has written the pods by then, so a cancel made there would wait on this thread.)"""
    workload_id = pool.submit()
    pool.loop.step()
    assert pool.status(workload_id) == "running"
    pool.rt.provider = FakeProvider("1x8xH100", clock=lambda: pool.now)  # restarted: it knows no pod
    transition = reconciler_module.transition
    cancelled_between: list[bool] = []

    def cancel_between(session: Any, row: WorkloadRow, to_status: str, *args: Any, **kwargs: Any) -> None:
        if row.id == workload_id and not cancelled_between:
            cancelled_between.append(cancel_if_free(pool, workload_id, cancel=False))
        transition(session, row, to_status, *args, **kwargs)

    monkeypatch.setattr(reconciler_module, "transition", cancel_between)
    assert pool.loop.reconciler.recover() == (0, 1)
    assert cancelled_between == [False], "the row was locked from the recovery's read to its commit"
    assert pool.status(workload_id) == "failed"


def test_requeuing_the_work_of_nodes_that_left_locks_the_workloads_it_writes(
        pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pods on nodes the provider no longer lists are marked lost and their workloads requeued
    through the ORM: the rows read stay locked until the commit (checked between the pods' write
    and the requeue)."""
    workload_id = pool.submit()
    pool.loop.step()
    assert pool.status(workload_id) == "running"
    requeue = reconciler_module.requeue
    free: list[bool] = []

    def check_between(session: Any, row: WorkloadRow, *args: Any, **kwargs: Any) -> list[str]:
        free.append(cancel_if_free(pool, row.id, cancel=False))
        return list(requeue(session, row, *args, **kwargs))

    monkeypatch.setattr(reconciler_module, "requeue", check_between)
    assert pool.loop.reconciler.nodes_gone([]) == 1
    assert free == [False], "the row was locked from the read to the commit"
    assert pool.status(workload_id) == "pending"
