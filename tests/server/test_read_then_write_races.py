"""Writes that depend on a read, raced on PostgreSQL (where transactions run at once) at the one
instant that matters: the code under test is held right after its read until the competing request
has either committed or waits on a row lock, so each case is the same interleaving on every run.
Each write must follow what the competitor left, never what it read before:

- a federation member's fence, and its hold at a restart, never put back a copy the user cancelled;
- a remote call cancelled while its worker asks for work is not handed out;
- two servers folding the usage rollup at once count each pod once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, func, select, text

from conftest import Server, start_server, stop_server
from factories import node
from gpupool.core.budgets import Budget
from gpupool.providers.fake import FakeProvider
from gpupool.server import pgtemp
from gpupool.server.auth import FEDERATION_ID_ENV, Principal
from gpupool.server.db import Store
from gpupool.server.federation_fence import Fence
from gpupool.server.loops.reconciler import _hold_federated_copies
from gpupool.server.orm import (
    AuditRow,
    NodeFlagRow,
    PodRow,
    QueueRow,
    RemoteCallRow,
    TenantRow,
    UsageDailyServiceRow,
    WorkloadRow,
)
from gpupool.server.runtime import Runtime
from gpupool.server.services import calls, node_faults, usage, usage_rollup
from gpupool.server.services.budgets import WARNING_ACTION, BudgetTracker, TenantSpend
from gpupool.server.services.calls import WorkerPod
from gpupool.server.services.tenants import delete_tenant
from gpupool.server.settings import Settings
from server.fakes import ManualProvider

API = "/api/v1"
ADMIN = Principal(token_id="test", tenant=None)
WAITING = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
           "AND datname = current_database()")


class AfterRead:
    """While active: once `engine` has run a statement `is_read` picks in this thread (the server's own
    loops read the same tables in theirs), `competitor` runs in another, and the statement's caller goes
    on only when the competitor is done, or waits on a row lock."""

    def __init__(self, engine: Engine, url: str, is_read: Callable[[str], bool],
                 competitor: Callable[[], Any]) -> None:
        self.engine, self.url, self.is_read, self.competitor = engine, url, is_read, competitor
        self.thread: threading.Thread | None = None
        self.result: list[Any] = []
        self.waited = False
        """Whether the competitor was seen waiting on a row lock (rather than done at once)."""

    def __enter__(self) -> AfterRead:
        self.tested = threading.get_ident()
        event.listen(self.engine, "after_cursor_execute", self._after)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "after_cursor_execute", self._after)
        if self.thread is not None:
            self.thread.join(60)
            assert not self.thread.is_alive(), "the competing request never ended"

    def _after(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if self.thread is not None or threading.get_ident() != self.tested or not self.is_read(statement):
            return
        self.thread = threading.Thread(target=lambda: self.result.append(self.competitor()))
        self.thread.start()
        watch = create_engine(self.url, isolation_level="AUTOCOMMIT")
        try:
            with watch.connect() as fresh:
                deadline = time.monotonic() + 30
                while self.thread.is_alive():
                    if fresh.execute(text(WAITING)).scalar():
                        self.waited = True
                        return
                    assert time.monotonic() < deadline, "the competing request neither ended nor waited"
                    time.sleep(0.01)
        finally:
            watch.dispose()


def _selects_workloads(statement: str) -> bool:
    return statement.lstrip().startswith("SELECT") and "FROM workloads" in statement \
        and "workloads.held = " in statement


@pytest.fixture
def pg_server(postgres: pgtemp.TempPostgres, tmp_path: Path) -> Iterator[tuple[Server, str]]:
    url = postgres.create_database()
    server = start_server(tmp_path, url, ManualProvider([node("n0", devices=8, model="H100")]))
    try:
        yield server, url
    finally:
        stop_server(server)


def _submit(server: Server, env: dict[str, str]) -> str:
    answer = server.client.post(f"{API}/workloads", headers=server.headers(), json={
        "command": ["train"], "env": env, "resources": {"gpus": 1}})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _shown(server: Server, wid: str) -> tuple[str, str, str]:
    with server.rt.store.read() as session:
        row = session.get(WorkloadRow, wid)
        assert row is not None
        return row.status, row.held, row.reason


def _cancel(server: Server, wid: str) -> Callable[[], int]:
    return lambda: server.client.post(f"{API}/workloads/{wid}/cancel", headers=server.headers()).status_code


def test_the_fence_never_holds_a_copy_cancelled_after_its_read(pg_server: tuple[Server, str]) -> None:
    server, url = pg_server
    copy = _submit(server, {FEDERATION_ID_ENV: "f-1"})
    server.wait_for(lambda: _shown(server, copy)[0] == "running")
    fence = Fence(server.rt)
    fence.fence_s = 5.0
    server.rt.auth.federation_heard_s = time.monotonic() - 10.0
    with AfterRead(server.rt.store.engine, url, _selects_workloads, _cancel(server, copy)) as race:
        fence.check()
    assert race.result == [200]
    # the cancel the user was answered stands: it waited for the fence's hold, then cancelled the held
    # copy (read without a lock, the fence wrote the copy back to pending, held, over the cancel)
    assert _shown(server, copy)[0] == "cancelled" and race.waited


def test_the_hold_at_a_restart_never_holds_a_copy_cancelled_after_its_read(
        pg_server: tuple[Server, str]) -> None:
    server, url = pg_server
    assert server.client.post(f"{API}/nodes/n0/cordon", headers=server.headers()).status_code == 200
    copy = _submit(server, {FEDERATION_ID_ENV: "f-1"})
    with AfterRead(server.rt.store.engine, url, _selects_workloads, _cancel(server, copy)) as race, \
            server.rt.store.write() as session:
        _hold_federated_copies(session, server.rt.clock())
    assert race.result == [200] and race.waited
    # held, then cancelled (read without a lock, the hold came after the cancel: held, its reason
    # `held`, and a hold's event after the cancel's)
    assert _shown(server, copy) == ("cancelled", "user", "cancelled_by_user")
    answer = server.client.get(f"{API}/workloads/{copy}/events", headers=server.headers())
    assert [e["reason"] for e in answer.json()][-2:] == ["held", "cancelled_by_user"], answer.text


def test_a_call_cancelled_while_its_worker_asks_for_work_is_not_handed_out(
        pg_server: tuple[Server, str]) -> None:
    server, url = pg_server
    assert server.client.post(f"{API}/nodes/n0/cordon", headers=server.headers()).status_code == 200
    opened = server.client.post(f"{API}/calls/sessions", headers=server.headers(),
                                json={"python": "3.11", "call": {"payload": "AA=="}})
    assert opened.status_code == 201, opened.text
    session_id, call_id = opened.json()["id"], opened.json()["call"]["id"]

    def cancel() -> Any:
        return server.client.post(f"{API}/calls/{call_id}/cancel", headers=server.headers()).json()

    def picks_a_queued_call(statement: str) -> bool:
        return "FROM remote_calls" in statement and "ORDER BY remote_calls.submitted_s" in statement

    with AfterRead(server.rt.store.engine, url, picks_a_queued_call, cancel) as race:
        work = calls.next_call(server.rt, WorkerPod("p-1", session_id))
    assert race.result[0]["status"] == "cancelled", race.result
    assert work is None or work.call_id != call_id, work  # read as queued, it was run after its cancel
    with server.rt.store.read() as session:
        row = session.get(RemoteCallRow, call_id)
        assert row is not None and row.status == "cancelled"


# ------------------------------------------------------------------ the usage rollup


def _runtime(url: str, data_dir: Path) -> Runtime:
    return Runtime(settings=Settings(data_dir=data_dir, database_url=url), store=Store.open(url),
                   provider=ManualProvider([node("n0", devices=8, model="H100")]))


def _ended_pods(rt: Runtime, tenant: str, count: int, start_s: float) -> None:
    with rt.store.write() as session:
        if session.get(TenantRow, tenant) is None:
            session.add(TenantRow(name=tenant, created_s=start_s))
            session.flush()
            session.add(QueueRow(tenant=tenant, name="default", created_s=start_s))
            session.flush()
        for i in range(count):
            wid = f"{tenant}-w{i}"
            session.add(WorkloadRow(id=wid, name="", tenant=tenant, queue="default", status="succeeded",
                                    priority=0, device_milli=1000, spec={"command": ["x"]}, attempt=1,
                                    submit_s=start_s))
            session.flush()
            session.add(PodRow(id=f"{wid}-a1-r0", workload_id=wid, attempt=1, name="r0", rank=0,
                               status="succeeded", node="n0",
                               slices=[{"device_index": i % 8, "compute_milli": 1000, "memory_mib": 0}],
                               cpu_milli=0, memory_mib=0, created_s=start_s, started_s=start_s,
                               finished_s=start_s + 3600.0))


def _yesterday(rt: Runtime) -> float:
    """01:00 UTC yesterday: an hour's pod from then lies in one day (a pod from 24 h ago crossed
    midnight when the clock read after 23:00, and the rollup counted it on both days)."""
    return (rt.clock() // 86_400 - 1) * 86_400 + 3600.0


def _rolled_up_pods(rt: Runtime) -> tuple[int, float]:
    with rt.store.read() as session:
        pods = session.scalar(select(func.sum(UsageDailyServiceRow.pods))) or 0
        seconds = session.scalar(select(func.sum(UsageDailyServiceRow.compute_milli_s))) or 0.0
        return int(pods), float(seconds) / 1000


def test_two_servers_folding_at_once_count_each_pod_once(postgres: pgtemp.TempPostgres,
                                                         tmp_path: Path) -> None:
    url = postgres.create_database()
    one, other = _runtime(url, tmp_path / "one"), _runtime(url, tmp_path / "other")
    try:
        start = _yesterday(one)
        _ended_pods(one, "t", 3, start)
        assert one.usage_rollup.fold(one) == 3  # the day's rows exist: the next fold adds to them
        _ended_pods(one, "u", 3, start)

        def reads_the_pods_to_fold(statement: str) -> bool:
            return statement.lstrip().startswith("SELECT pods.id") and "rolled_up" in statement

        with AfterRead(one.store.engine, url, reads_the_pods_to_fold,
                       lambda: other.usage_rollup.fold(other)) as race:
            folded = one.usage_rollup.fold(one)
        # the other server's fold waited for this one's and found nothing left (unlocked, it added the
        # same three pods again: 9 pods and 9 device-hours in the rollup)
        assert (folded, race.result, race.waited) == (3, [0], True)
        assert _rolled_up_pods(one) == (6, 6 * 3600.0)
    finally:
        one.store.close()
        other.store.close()


def test_a_usage_query_beside_another_servers_fold_counts_each_pod_once(
        postgres: pgtemp.TempPostgres, tmp_path: Path) -> None:
    """A usage query reads the rollup's rows, then the pods not rolled up: another server's fold that
    committed between the two would leave the pods it folded out of both (and out of the answer)."""
    url = postgres.create_database()
    one, other = _runtime(url, tmp_path / "one"), _runtime(url, tmp_path / "other")
    try:
        day = (one.clock() // 86_400 - 3) * 86_400
        _ended_pods(one, "t", 3, day + 3600.0)
        assert one.usage_rollup.fold(one) == 3
        _ended_pods(one, "u", 3, day + 3600.0)
        window = {"tenant": None, "since_s": day, "until_s": one.clock(), "by": "tenant"}

        def reads_the_rollup(statement: str) -> bool:
            return "FROM usage_daily_services" in statement and "GROUP BY" in statement

        fold = lambda: other.usage_rollup.fold(other)  # noqa: E731
        with AfterRead(one.store.engine, url, reads_the_rollup, fold) as race:
            answer = usage.usage(one, ADMIN, **window)  # type: ignore[arg-type]
        assert race.result == [3] and race.waited  # the fold waited for the query to end
        assert answer.total.pods == 6 and answer.total.device_hours == pytest.approx(6.0), answer.total
        assert usage.usage(one, ADMIN, **window) == answer  # type: ignore[arg-type]
    finally:
        one.store.close()
        other.store.close()


def test_a_deleted_tenants_usage_is_kept_however_many_pods_wait_to_be_folded(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant's pods are folded before their rows go, all of them: a fold takes FOLD_BATCH pods at
    most, of any tenant, and a backlog of other pods left most of the deleted tenant's unfolded."""
    monkeypatch.setattr(usage_rollup, "FOLD_BATCH", 2)
    rt = _runtime(db_url, tmp_path)
    try:
        start = _yesterday(rt)
        _ended_pods(rt, "a", 5, start)
        _ended_pods(rt, "gone", 5, start)
        assert delete_tenant(rt, ADMIN, "gone").workloads == 5
        with rt.store.read() as session:
            kept = session.scalar(select(func.sum(UsageDailyServiceRow.pods))
                                  .where(UsageDailyServiceRow.tenant == "gone"))
        assert kept == 5
    finally:
        rt.store.close()


def test_two_admins_failing_two_devices_of_one_node_at_once_keep_both(
        postgres: pgtemp.TempPostgres, tmp_path: Path) -> None:
    """Each fault is added to the node's stored list: read unlocked, the second admin's list (read
    before the first's was written) lost the first's device, or, on the node's first change, its insert
    met the first's and answered 500."""
    url = postgres.create_database()
    plain = node("s0", devices=4)
    simulated = replace(plain, devices=tuple(replace(d, simulated=True) for d in plain.devices))
    server = start_server(tmp_path, url, FakeProvider([simulated]))  # type: ignore[arg-type]
    try:
        def fail(device: int) -> Callable[[], int]:
            return lambda: server.client.post(f"{API}/nodes/s0/fail", params={"device": device},
                                              headers=server.headers()).status_code

        def reads_the_flags(statement: str) -> bool:
            return statement.lstrip().startswith("SELECT") and "FROM node_flags" in statement

        with AfterRead(server.rt.store.engine, url, reads_the_flags, fail(2)) as race:
            node_faults.fail(server.rt, ADMIN, "s0", 1)
        assert race.result == [200]
        with AfterRead(server.rt.store.engine, url, reads_the_flags, fail(3)) as race:
            node_faults.fail(server.rt, ADMIN, "s0", 0)  # the row is there now: nothing to insert
        assert race.result == [200]
        with server.rt.store.read() as session:
            row = session.get(NodeFlagRow, "s0")
            assert row is not None and row.failed_devices == [0, 1, 2, 3]
    finally:
        stop_server(server)


def test_two_servers_warning_of_one_budget_at_once_say_it_once(postgres: pgtemp.TempPostgres,
                                                               tmp_path: Path) -> None:
    """Each server keeps its own set of budgets it warned of, and both may refresh a tenant's spend at
    once (the leader's loop, a follower answering `gpupool tenant ls`): the audit log says it once."""
    url = postgres.create_database()
    one, other = _runtime(url, tmp_path / "one"), _runtime(url, tmp_path / "other")
    try:
        now = one.clock()
        _ended_pods(one, "t", 1, now - 3600.0)
        trackers = [BudgetTracker(), BudgetTracker()]
        for tracker in trackers:
            tracker.spend = {"t": TenantSpend(Budget(10.0), now - 86_400.0, 9.0)}

        def reads_what_was_said(statement: str) -> bool:
            return "FROM audit" in statement and statement.lstrip().startswith("SELECT")

        def warn_there() -> None:
            trackers[1]._warn(other, now)

        with AfterRead(one.store.engine, url, reads_what_was_said, warn_there) as race:
            trackers[0]._warn(one, now)
        with one.store.read() as session:
            said = session.scalars(select(AuditRow.detail).where(AuditRow.action == WARNING_ACTION)).all()
        assert len(said) == 1 and race.waited, said
    finally:
        one.store.close()
        other.store.close()
