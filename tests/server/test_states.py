"""The transition tables (server/states.py), and moves not made: refused (not an edge) and lost (a
compare-and-set that lost) are told alike on every path -- logged, counted by kind, outcome, from
and to on /metrics, written nowhere, and reported to the writer."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, select, update

from factories import ISSUE_CONFIG
from gpupool.api.workloads import WorkloadSpec
from gpupool.config import parse_config
from gpupool.core.model import WorkloadStatus
from gpupool.providers.fake import FakeProvider
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops import launching as launching_module
from gpupool.server.loops import reconciler as reconciler_module
from gpupool.server.loops.control import ControlLoop
from gpupool.server.metrics import Metrics
from gpupool.server.orm import EventRow, PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import workloads
from gpupool.server.services.events import IllegalMove, Move, apply_moves, moves_not_made, transition
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings
from gpupool.server.states import (
    POD_EDGES,
    POD_MOVES,
    WORKLOAD_EDGES,
    WORKLOAD_MOVES,
    PodState,
    markdown,
    pod_move_allowed,
    workload_move_allowed,
)

ADMIN = Principal("admin", None)
DOC = Path(__file__).resolve().parents[2] / "docs" / "admission.md"
Key = tuple[str, str, str, str]


class Pool:
    def __init__(self, tmp_path: Path, config: str = "scheduling:\n  placement: best-fit\n") -> None:
        self.now = 1000.0
        self.provider = FakeProvider("1x2xH100", clock=lambda: self.now, duration_s=100.0)
        url = f"sqlite:///{tmp_path / 'store.sqlite'}"
        self.rt = Runtime(settings=Settings(data_dir=tmp_path, database_url=url), store=Store.open(url),
                          provider=self.provider, clock=lambda: self.now,
                          config=parse_config(config))
        bootstrap(self.rt)
        self.loop = ControlLoop(self.rt)
        self.metrics = Metrics(self.rt)

    def submit(self, **extra: Any) -> str:
        spec = WorkloadSpec.model_validate({"command": ["train"], "resources": {"gpus": 1}, **extra})
        return workloads.submit(self.rt, ADMIN, spec).id

    def status(self, workload_id: str) -> str:
        with self.rt.store.read() as session:
            row = session.get(WorkloadRow, workload_id)
            assert row is not None
            return row.status

    def pod_status(self, pod_id: str) -> str:
        with self.rt.store.read() as session:
            pod = session.get(PodRow, pod_id)
            assert pod is not None
            return pod.status

    def events(self, workload_id: str) -> list[str]:
        with self.rt.store.read() as session:
            return list(session.scalars(select(EventRow.to_status).where(
                EventRow.workload_id == workload_id).order_by(EventRow.id)))

    def counted(self, key: Key) -> float:
        """What /metrics says of one (kind, outcome, from, to)."""
        labels = dict(zip(("kind", "outcome", "from_status", "to_status"), key, strict=True))
        return self.metrics.registry.get_sample_value("gpupool_state_moves_not_made_total", labels) or 0.0


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    made = Pool(tmp_path)
    yield made
    made.rt.store.close()


def test_the_tables_are_keyed_by_the_enums_and_every_edge_says_why() -> None:
    assert set(WORKLOAD_MOVES) == set(WorkloadStatus) and set(POD_MOVES) == set(PodState)
    for edges in (WORKLOAD_EDGES, POD_EDGES):
        for (a, b), why in edges.items():
            assert type(a) is type(b) and a is not b
            assert why.strip() and "\n" not in why and len(why) < 120, (a, b)
    for status in WorkloadStatus:
        assert (not WORKLOAD_MOVES[status]) == status.is_final, status
    assert WORKLOAD_MOVES[WorkloadStatus.PENDING] == {WorkloadStatus.ADMITTED, WorkloadStatus.FAILED,
                                                      WorkloadStatus.CANCELLED}
    # the stored strings find their members' entries (StrEnum)
    assert workload_move_allowed("running", "pending") and not workload_move_allowed("succeeded", "running")
    assert workload_move_allowed("pending", "pending") and not workload_move_allowed("failed", "failed")
    assert pod_move_allowed("waiting", "launching") and not pod_move_allowed("stopped", "running")


def test_the_docs_show_the_tables_as_the_code_has_them() -> None:
    text = DOC.read_text()
    shown = text.split("<!-- states:begin -->\n", 1)[1].split("<!-- states:end -->", 1)[0]
    assert shown == markdown(), ("docs/admission.md's states table differs from server/states.py: "
                                 "paste `gpupool.server.states.markdown()` between its markers")


def test_a_refused_move_is_told_alike_on_the_row_path_and_the_bulk_path(
        pool: Pool, caplog: pytest.LogCaptureFixture) -> None:
    first, second, third = pool.submit(), pool.submit(), pool.submit()
    key = ("workload", "refused", "pending", "succeeded")
    before = pool.counted(key)
    with caplog.at_level(logging.WARNING, "gpupool.transitions"):
        with pytest.raises(IllegalMove), pool.rt.store.write() as session:
            row = session.get(WorkloadRow, first)
            assert row is not None
            transition(session, row, WorkloadStatus.SUCCEEDED.value, "completed", "never ran", pool.now)
        illegal = Move(second, "pending", "succeeded", "completed", "never ran", pool.now)
        legal = Move(third, "pending", "failed", "no_node_fits", "Fits nowhere.", pool.now)
        with pool.rt.store.write() as session:
            not_made = apply_moves(session.connection(), [illegal, legal])
    assert not_made == [illegal], "the bulk path reports a refused move to its caller, as a lost one"
    assert [pool.status(w) for w in (first, second, third)] == ["pending", "pending", "failed"]
    assert pool.events(second) == ["pending"], "nothing written for it"
    assert pool.counted(key) == before + 2
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    said = "move pending -> succeeded (completed) refused: it is not an edge of the transition table"
    assert [line.split(" (a bug")[0] for line in lines] == [f"workload {w}: {said}" for w in (first, second)]


def test_an_illegal_pod_move_is_refused_and_counted(pool: Pool) -> None:
    workload_id = pool.submit()
    pool.loop.step()
    pod_id = f"{workload_id}-a1-r0"
    workloads.cancel(pool.rt, ADMIN, workload_id)
    assert pool.pod_status(pod_id) == "stopping"
    before = pool.counted(("pod", "refused", "stopping", "running"))
    with pytest.raises(IllegalMove), pool.rt.store.write() as session:
        pod = session.get(PodRow, pod_id)
        assert pod is not None
        pod.status = PodState.RUNNING.value
    assert pool.pod_status(pod_id) == "stopping"
    assert pool.counted(("pod", "refused", "stopping", "running")) == before + 1


def test_a_lost_compare_and_set_is_counted(pool: Pool) -> None:
    workload_id = pool.submit()
    workloads.cancel(pool.rt, ADMIN, workload_id)
    key = ("workload", "lost", "pending", "admitted")
    before = pool.counted(key)
    move = Move(workload_id, "pending", "admitted", "admitted", "Placed.", pool.now)
    with pool.rt.store.write() as session:
        assert apply_moves(session.connection(), [move]) == [move]
    assert pool.status(workload_id) == "cancelled"
    assert pool.counted(key) == before + 1


def test_a_pod_success_that_lost_its_race_is_not_written(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider reports a pod exited 0, but between the reconciler's read of the pod and its lock
    of the workload a change committed (here: the pod was stopped): the settle is a compare-and-set,
    so the stopped pod stays stopped, its workload does not succeed, and the loss is counted."""
    workload_id = pool.submit()
    pool.loop.step()
    pod_id = f"{workload_id}-a1-r0"
    assert pool.status(workload_id) == "running" and pool.pod_status(pod_id) == "running"
    lock = reconciler_module.lock_workloads

    def changed_meanwhile(conn: Connection, ids: Any) -> None:
        conn.execute(update(PodRow).where(PodRow.id == pod_id).values(status=PodState.STOPPED.value))
        lock(conn, ids)

    monkeypatch.setattr(reconciler_module, "lock_workloads", changed_meanwhile)
    key = ("pod", "lost", "running", "succeeded")
    before = pool.counted(key)
    pool.now += 200.0  # the fake pod has ended, exit 0
    assert pool.loop.reconciler.sync() == 1
    assert pool.pod_status(pod_id) == "stopped"
    assert pool.status(workload_id) == "running" and "succeeded" not in pool.events(workload_id)
    assert pool.counted(key) == before + 1
    assert moves_not_made()[key] >= 1


def test_a_waiting_pod_stopped_before_its_promotion_is_not_launched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod waits for a preempted pod to leave its device; between the promotion's read of the
    waiting pods and its lock of their workload, its workload is cancelled (its pods stopped). The
    promotion's move waiting -> launching is a compare-and-set: it is lost, counted, and the pod is
    never handed to the provider (a launch of a cancelled workload would run unaccounted)."""
    pool = Pool(tmp_path, ISSUE_CONFIG)
    try:
        low = [pool.submit(priority_class="low", env={"GPUPOOL_FAKE_IGNORE_TERM": "1"}) for _ in range(2)]
        pool.loop.step()
        assert [pool.status(w) for w in low] == ["running", "running"]
        high = pool.submit(priority_class="high")
        pool.loop.step()  # a victim stops for its class's 5 s grace; the preemptor waits for it
        pod_id = f"{high}-a1-r0"
        assert pool.status(high) == "admitted" and pool.pod_status(pod_id) == "waiting"
        lock = launching_module.lock_workloads

        def cancelled_meanwhile(conn: Connection, ids: Any) -> None:
            conn.execute(update(PodRow).where(PodRow.id == pod_id).values(status=PodState.STOPPED.value))
            conn.execute(update(WorkloadRow).where(WorkloadRow.id == high).values(status="cancelled"))
            lock(conn, ids)

        pool.now += 10.0  # the victim has gone
        pool.loop.reconciler.sync()
        monkeypatch.setattr(launching_module, "lock_workloads", cancelled_meanwhile)
        key = ("pod", "lost", "waiting", "launching")
        before = pool.counted(key)
        assert pool.loop.scheduler.promote_waiting() == 0
        assert pod_id not in pool.provider._pods, "a stopped pod was handed to the provider"
        assert pool.pod_status(pod_id) == "stopped"
        assert pool.counted(key) == before + 1
    finally:
        pool.rt.store.close()


def test_a_pod_failure_read_before_a_cancel_does_not_overwrite_it(
        pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider reports a pod exited 1; a cancel commits between the reconciler's read of the pod
    and its lock of the workload. The pod's state is read under the lock: it stays stopped (a
    loaded row's stale `running` would let stopped -> failed through), and nothing is retried."""
    workload_id = pool.submit(env={"GPUPOOL_FAKE_EXIT_CODE": "1"})
    pool.loop.step()
    pod_id = f"{workload_id}-a1-r0"
    assert pool.pod_status(pod_id) == "running"
    lock = reconciler_module.lock_workloads

    def cancelled_meanwhile(conn: Connection, ids: Any) -> None:
        conn.execute(update(PodRow).where(PodRow.id == pod_id).values(status=PodState.STOPPED.value))
        conn.execute(update(WorkloadRow).where(WorkloadRow.id == workload_id).values(status="cancelled"))
        lock(conn, ids)

    monkeypatch.setattr(reconciler_module, "lock_workloads", cancelled_meanwhile)
    pool.now += 200.0  # the fake pod has ended, exit 1
    assert pool.loop.reconciler.sync() == 1
    assert pool.pod_status(pod_id) == "stopped"
    assert pool.status(workload_id) == "cancelled"


def test_a_node_gone_does_not_overwrite_a_pod_a_cancel_stopped(
        pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node a pod runs on leaves the pool; a cancel commits between the reconciler's read of the
    pods on it and its lock of their workloads. The pods are read under the lock: the stopped pod is
    not written over as lost, and the cancelled workload is not requeued."""
    workload_id = pool.submit()
    pool.loop.step()
    pod_id = f"{workload_id}-a1-r0"
    assert pool.pod_status(pod_id) == "running"
    lock = reconciler_module.lock_workloads

    def cancelled_meanwhile(conn: Connection, ids: Any) -> None:
        conn.execute(update(PodRow).where(PodRow.id == pod_id).values(status=PodState.STOPPED.value))
        conn.execute(update(WorkloadRow).where(WorkloadRow.id == workload_id).values(status="cancelled"))
        lock(conn, ids)

    monkeypatch.setattr(reconciler_module, "lock_workloads", cancelled_meanwhile)
    assert pool.loop.reconciler.nodes_gone([]) == 0
    assert pool.pod_status(pod_id) == "stopped"
    assert pool.status(workload_id) == "cancelled"


def test_a_stop_whose_workload_was_cancelled_meanwhile_is_counted_lost(tmp_path: Path) -> None:
    """The cycle preempts a running workload; the user's cancel of it commits before the cycle's
    decisions are written (here: while the provider is asked for checkpoint marks, before any
    transaction opens). The requeue finds it cancelled: it writes nothing, and is told and counted
    as a lost move like any other."""
    pool = Pool(tmp_path, ISSUE_CONFIG)
    try:
        low = [pool.submit(priority_class="low") for _ in range(2)]
        pool.loop.step()
        marks = pool.provider.checkpoint_marks

        def cancel_first(workload_ids: Any) -> Any:
            for wid in workload_ids:
                workloads.cancel(pool.rt, ADMIN, wid)
            return marks(workload_ids)

        pool.provider.checkpoint_marks = cancel_first  # type: ignore[method-assign]
        key = ("workload", "lost", "admitted|running", "pending")
        before = pool.counted(key)
        pool.submit(priority_class="high")
        pool.loop.step()
        victims = [w for w in low if pool.status(w) == "cancelled"]
        assert len(victims) == 1
        assert pool.events(victims[0]) == ["pending", "admitted", "running", "cancelled"]
        assert pool.counted(key) == before + 1
    finally:
        pool.rt.store.close()


def test_recovery_does_not_overwrite_a_pod_a_cancel_stopped(
        pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a restart the provider no longer knows a running pod; a cancel commits between the
    recovery's read of the active pods and its lock of their workloads. The pods are read under the
    lock: the stopped pod is not written over as lost."""
    workload_id = pool.submit()
    pool.loop.step()
    pod_id = f"{workload_id}-a1-r0"
    lock = reconciler_module.lock_workloads

    def cancelled_meanwhile(conn: Connection, ids: Any) -> None:
        conn.execute(update(PodRow).where(PodRow.id == pod_id).values(status=PodState.STOPPED.value))
        conn.execute(update(WorkloadRow).where(WorkloadRow.id == workload_id).values(status="cancelled"))
        lock(conn, ids)

    monkeypatch.setattr(reconciler_module, "lock_workloads", cancelled_meanwhile)
    monkeypatch.setattr(pool.provider, "poll", lambda: [])  # it forgot every pod
    assert pool.loop.reconciler.recover() == (0, 0)
    assert pool.pod_status(pod_id) == "stopped"


def test_the_bulk_settle_refuses_a_pod_move_the_table_does_not_have(pool: Pool) -> None:
    """The settle of pods that exited 0 is written in bulk (no ORM listener): it checks the pod
    table itself. A pod the store holds `waiting` (never handed to the provider) that the provider
    reports succeeded is refused, counted, and written nowhere."""
    workload_id = pool.submit()
    pool.loop.step()
    pod_id = f"{workload_id}-a1-r0"
    with pool.rt.store.write() as session:
        session.execute(update(PodRow).where(PodRow.id == pod_id).values(status=PodState.WAITING.value))
    key = ("pod", "refused", "waiting", "succeeded")
    before = pool.counted(key)
    pool.now += 200.0  # the fake pod has ended, exit 0
    assert pool.loop.reconciler.sync() == 1
    assert pool.pod_status(pod_id) == "waiting"
    assert pool.status(workload_id) == "running"
    assert pool.counted(key) == before + 1
