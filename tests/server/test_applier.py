"""How a cycle's decisions reach the store: a stop keeps its reason and grace however many there
are, provider facts are read before the transaction, a move is a compare-and-set on the status it
expects, and rows read to be stopped or cancelled stay locked until the commit (a cancel that lands
between a read and a write is never written over, nor writes over an admission)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from gpupool.api.workloads import WorkloadSpec
from gpupool.config import parse_config
from gpupool.errors import Conflict
from gpupool.providers.fake import FakeProvider
from gpupool.server import pgtemp
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops import applier as applier_module
from gpupool.server.loops import time_limits as time_limits_module
from gpupool.server.loops.control import ControlLoop
from gpupool.server.orm import EventRow, PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import nodes, workloads
from gpupool.server.services.events import LostMoves, Move, apply_moves
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

ADMIN = Principal("admin", None)
CONFIG = """\
scheduling:
  placement: first-fit
priority_classes:
  - {name: low, value: 0, preemptible: true, grace: 30s}
"""


class Stops(FakeProvider):
    """The fake provider, noting the grace of every stop and each question about checkpoints (the
    workloads asked about, and whether a write transaction was open then)."""

    def __init__(self, nodes: str, **kwargs: Any) -> None:
        super().__init__(nodes, **kwargs)
        self.graces: dict[str, float] = {}
        self.asked: list[tuple[frozenset[str], bool]] = []
        self.writing = 0

    def stop(self, pod_id: str, grace_s: float = 10.0) -> None:
        self.graces[pod_id] = grace_s
        super().stop(pod_id, grace_s)

    def checkpoint_s(self, workload_id: str) -> float | None:
        self.asked.append((frozenset({workload_id}), self.writing > 0))
        return super().checkpoint_s(workload_id)

    def checkpoint_marks(self, workload_ids: Sequence[str]) -> dict[str, float | None]:
        self.asked.append((frozenset(workload_ids), self.writing > 0))
        return {workload_id: super(Stops, self).checkpoint_s(workload_id) for workload_id in workload_ids}


class Pool:
    """A control loop over a store at `url`, on the fake provider and a clock the test moves."""

    def __init__(self, tmp_path: Path, url: str, nodes: str) -> None:
        self.now = 1_000_000.0
        self.provider = Stops(nodes, clock=lambda: self.now, duration_s=100_000.0)
        settings = Settings(data_dir=tmp_path, database_url=url, cycle_interval_s=0.05)
        self.rt = Runtime(settings=settings, store=Store.open(url), provider=self.provider,
                          clock=lambda: self.now, config=parse_config(CONFIG))
        bootstrap(self.rt)
        write = self.rt.store.write

        @contextmanager
        def noted() -> Iterator[Session]:
            self.provider.writing += 1
            try:
                with write() as session:
                    yield session
            finally:
                self.provider.writing -= 1

        self.rt.store.write = noted  # type: ignore[method-assign]
        self.loop = ControlLoop(self.rt)
        self.loop.recovered = self.loop.reconciler.recover()
        self.cycles = 0
        cycle = self.loop.scheduler.cycle

        def counted(capacity_changed: bool = True) -> Any:
            self.cycles += 1
            return cycle(capacity_changed)

        self.loop.scheduler.cycle = counted  # type: ignore[method-assign]

    def submit(self, gpus: float = 1, **extra: Any) -> str:
        spec = WorkloadSpec.model_validate({"command": ["train"], "resources": {"gpus": gpus}, **extra})
        return workloads.submit(self.rt, ADMIN, spec).id

    def step(self, advance_s: float = 0.0) -> None:
        self.now += advance_s
        self.loop.step()

    def statuses(self) -> dict[str, str]:
        with self.rt.store.read() as session:
            return {w: s for w, s in session.execute(select(WorkloadRow.id, WorkloadRow.status))}

    def events(self) -> list[tuple[str, str, str, str, str]]:
        """(workload, from, to, reason, message) of every event, in order."""
        with self.rt.store.read() as session:
            return [(r.workload_id, r.from_status, r.to_status, r.reason, r.message) for r in session.execute(
                select(EventRow.workload_id, EventRow.from_status, EventRow.to_status, EventRow.reason,
                       EventRow.message).order_by(EventRow.id))]

    def close(self) -> None:
        self.rt.store.close()


@pytest.fixture
def sqlite_pool(tmp_path: Path) -> Iterator[Pool]:
    pool = Pool(tmp_path, f"sqlite:///{tmp_path / 'store.sqlite'}", "1x32xH100,1x8xH100")
    yield pool
    pool.close()


@pytest.fixture
def storm_pool(tmp_path: Path, db_url: str) -> Iterator[Pool]:
    pool = Pool(tmp_path, db_url, "1x32xH100,1x8xH100")
    yield pool
    pool.close()


def test_a_node_failure_under_300_small_pods_stores_every_eviction_with_its_reason_and_no_grace(
        storm_pool: Pool) -> None:
    pool = storm_pool
    small = [pool.submit(gpus=0.1, priority_class="low") for _ in range(300)]
    for _ in range(4):
        pool.step()
    big = pool.provider.nodes()[0].name
    on_big = {w for w in small if pool.provider._pods[f"{w}-a1-r0"].launch.node == big}
    assert len(on_big) > 2 * 128, "enough evictions to span several transactions"
    assert set(pool.statuses().values()) == {"running"}
    pool.step(60.0)
    pool.provider.inject_fault(big)
    pool.cycles = 0
    pool.step()
    assert pool.cycles <= 2
    requeued = [(w, reason, why) for w, frm, to, reason, why in pool.events()
                if (frm, to) == ("running", "pending")]
    assert sorted(w for w, _, _ in requeued) == sorted(on_big)
    assert {reason for _, reason, _ in requeued} == {"evicted_unhealthy"}
    assert all(why.startswith("A node or device it ran on became unhealthy") for _, _, why in requeued)
    assert {pool.provider.graces[f"{w}-a1-r0"] for w in on_big} == {0.0}
    # what the stops lost is counted from checkpoint marks asked for once, before any transaction
    assert pool.provider.asked == [(frozenset(on_big), False)]


@pytest.fixture
def pg_pool(tmp_path: Path, postgres: pgtemp.TempPostgres) -> Iterator[Pool]:
    pool = Pool(tmp_path, postgres.create_database(), "2x8xH100")
    yield pool
    pool.close()


def ever_admitted_after_cancel(events: list[tuple[str, str, str, str, str]]) -> set[str]:
    """Workloads with an event after the one that cancelled them (an admission or a launch that wrote
    over the cancel)."""
    cancelled: set[str] = set()
    after: set[str] = set()
    for workload_id, _, to, _, _ in events:
        if workload_id in cancelled:
            after.add(workload_id)
        if to == "cancelled":
            cancelled.add(workload_id)
    return after


def test_cancels_landing_between_the_admissions_read_and_write_are_never_overwritten(
        pg_pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL, where a cancel commits on its own connection while the scheduler's transaction is
    open: the cancels are made to land exactly between `_admit`'s read of the statuses and its
    write (no timing involved)."""
    pool = pg_pool
    submitted = [pool.submit(gpus=1) for _ in range(12)]
    to_cancel = set(submitted[::2])
    read = applier_module.states
    landed: list[str] = []

    def read_then_cancel(conn: Any, ids: Sequence[str], *, with_spec: bool) -> dict[str, Any]:
        rows = read(conn, ids, with_spec=with_spec)
        if with_spec and not landed:
            for workload_id in sorted(to_cancel & set(ids)):
                workloads.cancel(pool.rt, ADMIN, workload_id)  # its own transaction, committed now
                landed.append(workload_id)
        return rows

    monkeypatch.setattr(applier_module, "states", read_then_cancel)
    pool.step()
    assert sorted(landed) == sorted(to_cancel), "every cancel landed inside the admission's transaction"
    monkeypatch.setattr(applier_module, "states", read)
    for _ in range(3):
        pool.step(1.0)
    events = pool.events()
    statuses = pool.statuses()
    assert ever_admitted_after_cancel(events) == set()
    assert {w for w in submitted if statuses[w] == "cancelled"} == to_cancel
    assert {statuses[w] for w in submitted if w not in to_cancel} == {"running"}
    launched = {pod.launch.workload_id for pod in pool.provider._pods.values()}
    assert launched & to_cancel == set()
    with pool.rt.store.read() as session:
        held = set(session.scalars(select(PodRow.workload_id).where(PodRow.workload_id.in_(to_cancel))))
    assert held == set(), "a lost admission leaves no pod rows"


def test_a_move_is_a_compare_and_set_on_the_status_it_expects(tmp_path: Path, db_url: str) -> None:
    pool = Pool(tmp_path, db_url, "1x8xH100")
    try:
        first, second = pool.submit(), pool.submit()
        workloads.cancel(pool.rt, ADMIN, second)
        moves = [Move(w, "pending", "failed", "unschedulable", "Refused.", pool.now,
                      columns=(("finished_s", 1.0),)) for w in (first, second)]
        with pool.rt.store.write() as session:
            lost = apply_moves(session.connection(), moves)
        assert lost == [moves[1]]
        assert pool.statuses() == {first: "failed", second: "cancelled"}
        last_two = [(w, to) for w, _, to, _, _ in pool.events()][-2:]
        assert last_two == [(second, "cancelled"), (first, "failed")]
        # the rows are locked once read, so a short count is a bug (here two moves of one workload):
        # the whole transaction rolls back
        third = pool.submit()
        twice = [Move(third, "pending", "failed", "unschedulable", "Refused.", pool.now)] * 2
        with pytest.raises(LostMoves), pool.rt.store.write() as session:
            apply_moves(session.connection(), twice)
        assert pool.statuses()[third] == "pending"
    finally:
        pool.close()


def cancel_or_wait(pool: Pool, workload_id: str, waited: list[str]) -> None:
    """Between a read and a write of the loop: cancel the workload there and then if another
    connection can take its row (a racing cancel), else note that the cancel would wait."""
    with pool.rt.store.engine.connect() as other:
        try:
            other.execute(select(WorkloadRow.id).where(WorkloadRow.id == workload_id)
                          .with_for_update(nowait=True))
            free = True
        except OperationalError:
            free = False
        other.rollback()
    if free:
        workloads.cancel(pool.rt, ADMIN, workload_id)  # lands between the read and the write
    else:
        waited.append(workload_id)  # the user's cancel would wait here: it is made after the commit


def test_a_cancel_after_a_requeues_read_waits_for_its_commit_and_is_not_written_over(
        pg_pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL: when the scheduler requeues evicted work, the rows it read are locked until it
    commits. Checked between the read and the write of each requeue: another connection cannot take
    the row (where it can, the user's cancel is made there and then, as a racing cancel would be)."""
    pool = pg_pool
    evicted = [pool.submit(gpus=1) for _ in range(4)]
    pool.step()
    node = pool.provider._pods[f"{evicted[0]}-a1-r0"].launch.node
    evicted = [w for w in evicted if pool.provider._pods[f"{w}-a1-r0"].launch.node == node]
    requeue = applier_module.requeue
    waited: list[str] = []

    def cancel_between(session: Session, row: WorkloadRow, *args: Any, **kwargs: Any) -> list[str]:
        cancel_or_wait(pool, row.id, waited)
        return requeue(session, row, *args, **kwargs)

    monkeypatch.setattr(applier_module, "requeue", cancel_between)
    pool.provider.inject_fault(node)
    pool.step()
    for workload_id in waited:
        workloads.cancel(pool.rt, ADMIN, workload_id)
    pool.step(1.0)
    statuses = pool.statuses()
    assert {statuses[w] for w in evicted} == {"cancelled"}
    assert ever_admitted_after_cancel(pool.events()) == set()
    assert sorted(waited) == sorted(evicted), "every row was locked from the read to the commit"


def test_a_drain_now_asks_for_checkpoint_marks_before_its_transaction(sqlite_pool: Pool) -> None:
    pool = sqlite_pool
    small = pool.provider.nodes()[1].name  # 8 devices: the first-fit pool fills the big node first
    ids = [pool.submit(gpus=1) for _ in range(34)]
    pool.step()
    there = {w for w in ids if pool.provider._pods[f"{w}-a1-r0"].launch.node == small}
    assert there
    pool.step(30.0)
    nodes.drain(pool.rt, ADMIN, small, now=True)
    assert pool.provider.asked == [(frozenset(there), False)]
    drained = {w for w, frm, to, reason, _ in pool.events()
               if (frm, to, reason) == ("running", "pending", "node_drained")}
    assert drained == there


def test_a_cancel_after_the_time_limits_read_waits_for_its_commit_and_is_not_written_over(
        pg_pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = pg_pool
    limited = [pool.submit(gpus=1, time_limit_s=60) for _ in range(2)]
    pool.step()
    stop_pods = time_limits_module.stop_pods
    waited: list[str] = []

    def cancel_between(session: Session, row: WorkloadRow, *args: Any, **kwargs: Any) -> list[str]:
        cancel_or_wait(pool, row.id, waited)
        return stop_pods(session, row, *args, **kwargs)

    monkeypatch.setattr(time_limits_module, "stop_pods", cancel_between)
    pool.step(61.0)
    for workload_id in waited:  # the cancel that waited finds it failed at its time limit
        with pytest.raises(Conflict, match="already failed"):
            workloads.cancel(pool.rt, ADMIN, workload_id)
    statuses = pool.statuses()
    events = pool.events()
    assert ever_admitted_after_cancel(events) == set(), "nothing written over a cancel"
    assert {statuses[w] for w in limited} == {"failed"}
    assert sorted(waited) == sorted(limited), "every row was locked from the read to the commit"


def test_an_admission_after_a_cancels_read_waits_for_it_and_adds_no_pod_it_did_not_stop(
        pg_pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL, the other way round: the cancel has read the row and stopped the pods it found
    when the scheduler's cycle comes. Checked between the cancel's read and its write: where
    another connection can take the row, the cycle runs there and then (admitting and launching)."""
    pool = pg_pool
    workload_id = pool.submit(gpus=1)
    transition = workloads.transition
    cycles: list[str] = []

    def cycle_between(session: Session, row: WorkloadRow, *args: Any, **kwargs: Any) -> None:
        with pool.rt.store.engine.connect() as other:
            try:
                other.execute(select(WorkloadRow.id).where(WorkloadRow.id == row.id)
                              .with_for_update(nowait=True))
                cycles.append("between")
            except OperationalError:
                cycles.append("after")
            other.rollback()
        if cycles[-1] == "between":
            pool.step()  # admits and launches it, committed before the cancel writes
        transition(session, row, *args, **kwargs)

    monkeypatch.setattr(workloads, "transition", cycle_between)
    workloads.cancel(pool.rt, ADMIN, workload_id)
    if cycles == ["after"]:
        pool.step()
    pool.step(1.0)
    assert pool.statuses()[workload_id] == "cancelled"
    running = [s.pod_id for s in pool.provider.poll() if not s.phase.is_final]
    assert running == [], "no pod of a cancelled workload is left running"
    assert ever_admitted_after_cancel(pool.events()) == set()
    assert cycles == ["after"], "the cancel held the row from its read to its commit"
