"""The leader lease (server/leader.py) and the store's fencing (Store.fenced), on SQLite and PostgreSQL:
of two contenders one wins; the lease is renewed, expires, and is taken with a higher epoch; a
leader stops acting at its renew deadline; a write under a stale epoch is refused in the store."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, insert, select
from upproc import cli

from gpupool.errors import InvalidInput
from gpupool.server.db import Fenced, Store
from gpupool.server.leader import Leadership
from gpupool.server.orm import LeaderLeaseRow, ServerRow, TenantRow
from gpupool.server.settings import Settings
from ports import free_port


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    opened = Store.open(db_url)
    try:
        yield opened
    finally:
        opened.close()


def _pair(store: Store, clock: Clock) -> tuple[Leadership, Leadership]:
    a = Leadership(store, server_id="a", lease_s=9.0, renew_s=2.0, clock=clock, monotonic=clock)
    b = Leadership(store, server_id="b", lease_s=9.0, renew_s=2.0, clock=clock, monotonic=clock)
    return a, b


def test_one_of_two_contenders_wins_renews_and_loses_at_expiry(store: Store) -> None:
    clock = Clock()
    a, b = _pair(store, clock)
    assert a.round() and a.acting_epoch() == 1
    assert not b.round() and b.acting_epoch() is None
    clock.now += 5  # a renews: the expiry moves 9 s past this renewal
    assert a.round() and a.acting_epoch() == 1
    clock.now += 5  # 10 s after the first take, 5 after the renewal: still a's
    assert not b.round()
    clock.now += 1.5  # a stopped renewing (stalled): 6.5 s after its renewal, past its renew
    assert a.epoch == 1 and a.acting_epoch() is None  # deadline (2/3 of 9 s), it no longer acts ...
    assert not b.round()  # ... though its lease has not run out yet (2.5 s left)
    clock.now += 3
    assert b.round() and b.acting_epoch() == 2  # expired: taken with the next epoch
    assert not a.round() and a.epoch is None  # a sees the new holder and follows
    with store.read() as session:
        lease = session.get(LeaderLeaseRow, 1)
        assert lease is not None and (lease.holder, lease.epoch) == ("b", 2)
        assert set(session.scalars(select(ServerRow.id))) == {"a", "b"}  # both heartbeat


def test_concurrent_contenders_one_winner(store: Store) -> None:
    clock = Clock()
    contenders = [Leadership(store, server_id=f"s{i}", lease_s=9.0, renew_s=2.0, clock=clock,
                             monotonic=clock) for i in range(6)]
    results: dict[str, bool] = {}
    start = threading.Barrier(len(contenders))

    def contend(who: Leadership) -> None:
        start.wait()
        results[who.server_id] = who.round()

    threads = [threading.Thread(target=contend, args=(c,)) for c in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results.values()) == 1, results
    clock.now += 10  # the winner died: of the others, again exactly one takes over
    start = threading.Barrier(len(contenders) - 1)
    results.clear()
    threads = [threading.Thread(target=contend, args=(c,)) for c in contenders if c.epoch is None]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results.values()) == 1, results
    assert {c.epoch for c in contenders if c.server_id in results and c.epoch is not None} == {2}


def _tenants(store: Store) -> int:
    with store.read() as session:
        return int(session.scalar(select(func.count()).select_from(TenantRow)) or 0)


def _add_tenant(store: Store, name: str) -> None:
    with store.write() as session:
        session.execute(insert(TenantRow).values(name=name, created_s=0.0))


def test_a_write_under_a_stale_epoch_is_refused(store: Store) -> None:
    clock = Clock()
    a, b = _pair(store, clock)
    assert a.round()
    before = _tenants(store)
    with store.fenced(1):
        _add_tenant(store, "under-epoch-1")  # the current epoch: written
    clock.now += 10
    assert b.round() and b.epoch == 2
    with store.fenced(1), pytest.raises(Fenced, match="no longer leads"):
        _add_tenant(store, "stale")
    assert _tenants(store) == before + 1  # the stale write left nothing
    assert store.fenced_writes == 1
    with store.fenced(2):
        _add_tenant(store, "under-epoch-2")
    _add_tenant(store, "unfenced")  # API writes (submissions, cancels) are not the leader's
    assert _tenants(store) == before + 3


@pytest.fixture
def lapsed(store: Store) -> Callable[[], Leadership]:
    """The takeover tests' setup, on PostgreSQL (SQLite serialises every write, so no row lock is
    met there): leader a takes the lease (epoch 1) and lets it run out; the call returns contender b,
    ready to take it. A factory, so that a test may bound the store's transactions first."""
    if store.is_sqlite:
        pytest.skip("SQLite serialises every write; the row lock a takeover meets is PostgreSQL's")

    def make() -> Leadership:
        clock = Clock()
        a, b = _pair(store, clock)
        assert a.round()
        clock.now += 10
        return b

    return make


def _old_leader(store: Store, name: str, hold: Callable[[Any], None]) -> tuple[threading.Thread, list[str]]:
    """The old leader's fenced transaction (epoch 1), started: it writes tenant `name`, then `hold`s
    the session open; its outcome, once the thread ends: "refused" or "committed"."""
    inside = threading.Event()
    outcome: list[str] = []

    def run() -> None:
        from gpupool.errors import StoreUnavailable

        try:
            with store.fenced(1), store.write() as session:
                session.execute(insert(TenantRow).values(name=name, created_s=0.0))
                inside.set()
                hold(session)
        except StoreUnavailable:
            outcome.append("refused")
        else:
            outcome.append("committed")

    writer = threading.Thread(target=run)
    writer.start()
    assert inside.wait(10)
    return writer, outcome


def _takes_over(b: Leadership, within_s: float, why: str) -> None:
    """b takes the lease (epoch 2) within `within_s`, not waiting for the old leader's transaction."""
    took: list[bool] = []
    taker = threading.Thread(target=lambda: took.append(b.round()))
    taker.start()
    taker.join(within_s)
    assert not taker.is_alive(), why
    assert took == [True] and b.epoch == 2


def _tenant_names(store: Store) -> set[str]:
    with store.read() as session:
        return set(session.scalars(select(TenantRow.name)))


def test_takeover_ends_the_fenced_transaction_in_flight(store: Store,
                                                        lapsed: Callable[[], Leadership]) -> None:
    """A transaction of the old leader still open when its lease has expired (the leader is past its
    renew deadline: stopped, or stalled) holds the lease row: the takeover ends it rather than wait,
    so it commits nothing, and what follows under the old epoch is refused."""
    b = lapsed()
    release = threading.Event()
    writer, outcome = _old_leader(store, "in-flight", lambda _: release.wait(10))
    try:
        _takes_over(b, 10, "the takeover waited for the old epoch's transaction")
    finally:
        release.set()
        writer.join(10)
    assert outcome == ["refused"]
    with store.fenced(1), pytest.raises(Fenced):
        _add_tenant(store, "after")
    assert not {"in-flight", "after"} & _tenant_names(store)


def test_ha_settings_refused_with_a_sentence(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"--ha .* needs PostgreSQL"):
        Settings(data_dir=tmp_path, ha=True)
    with pytest.raises(InvalidInput, match="at most a third of the lease"):
        Settings(data_dir=tmp_path, lease_s=3, lease_renew_s=2)
    with pytest.raises(InvalidInput, match="GPUPOOL_LEASE_S must be a number"):
        Settings(data_dir=tmp_path).with_env({"GPUPOOL_LEASE_S": "ten"})
    assert Settings(data_dir=tmp_path).with_env({"GPUPOOL_LEASE_S": "6", "GPUPOOL_LEASE_RENEW_S": "1"}
                                                ).lease_s == 6
    done = cli(["up", "--ha", "--data-dir", str(tmp_path / "d"), "--port", str(free_port())], {})
    assert done.returncode == 2, done.stderr
    assert "--ha shares the store between servers, so it needs PostgreSQL" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_commit_that_breaks_is_not_offered_for_retry(store: Store) -> None:
    """A connection lost before the commit: 503 with Retry-After (nothing kept). Lost during the
    commit itself on PostgreSQL: it may have landed, so no Retry-After and a sentence saying to check
    first. SQLite's commit is local: when it fails nothing was stored, and the retry is offered."""
    from sqlalchemy import event
    from sqlalchemy.exc import OperationalError

    from gpupool.errors import StoreUnavailable
    from gpupool.server.http_errors import gpupool_error_response

    lost = OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"),
                            connection_invalidated=True)
    where: list[str] = []

    def breaks(_: object) -> None:
        if where == ["commit"]:
            raise lost

    event.listen(store._sessions, "before_commit", breaks)
    where.append("before")
    with pytest.raises(StoreUnavailable) as before, store.write() as session:
        session.execute(insert(TenantRow).values(name="t1", created_s=0.0))
        raise lost
    assert gpupool_error_response(before.value).headers["retry-after"] == "1"
    where[:] = ["commit"]
    with pytest.raises(StoreUnavailable) as during, store.write() as session:
        session.execute(insert(TenantRow).values(name="t2", created_s=0.0))
    answer = gpupool_error_response(during.value)
    assert answer.status_code == 503
    if store.is_sqlite:
        assert answer.headers["retry-after"] == "1"
    else:
        assert "retry-after" not in answer.headers
        assert "may or may not have been saved" in during.value.message


def test_a_leader_stopped_inside_a_transaction_does_not_block_the_takeover(
        store: Store, lapsed: Callable[[], Leadership]) -> None:
    """The old leader's fenced transaction is left open (its process stopped): the database ends
    it after the bound, its writes are rolled back, and the takeover goes on."""
    from gpupool.server.leader import bound_stalled_transactions

    bound_stalled_transactions(store, 1.0)  # before any connection of the test's is opened
    b = lapsed()
    resume = threading.Event()  # stopped: nothing is sent to the database meanwhile
    writer, outcome = _old_leader(store, "stalled", lambda _: resume.wait(20))
    try:
        _takes_over(b, 10, "the takeover still waits for the stopped leader's transaction")
    finally:
        resume.set()
        writer.join(10)
    assert outcome == ["refused"]  # it resumed to a connection the database had ended
    assert "stalled" not in _tenant_names(store)


class _Passes:
    """Stands in for the services' controller: records each pass and the epoch it was fenced by,
    writes a row (so a stale epoch is refused by the store), and stops the loop after one pass."""

    def __init__(self, loop: object, store: Store) -> None:
        self.loop, self.store, self.epochs = loop, store, []  # type: ignore[var-annotated]

    def step(self) -> int:
        self.epochs.append(self.store.fence_epoch())
        self.loop._stop.set()  # type: ignore[attr-defined]
        _add_tenant(self.store, f"pass-{len(self.epochs)}-{id(self)}")
        return 1

    def close(self) -> None:
        pass


def test_services_controller_runs_only_on_the_leader_under_its_epoch(db_url: str, tmp_path: Path) -> None:
    from fakes import ManualProvider

    from conftest import make_runtime
    from factories import node
    from gpupool.server.loops.serving import ServingLoop

    rt, _ = make_runtime(db_url, tmp_path, ManualProvider([node("n0", devices=8, model="H100")]))
    try:
        clock = Clock()
        a, b = _pair(rt.store, clock)
        assert a.round() and not b.round()
        follower = ServingLoop(rt, b)
        follower.controller = passes_b = _Passes(follower, rt.store)  # type: ignore[assignment]
        asked = threading.Event()

        def not_leading() -> None:
            asked.set()
            follower._stop.set()  # one round of the follower's loop, then stop

        b.acting_epoch = lambda: not_leading()  # type: ignore[method-assign]
        follower._run()
        assert asked.is_set() and passes_b.epochs == []  # a follower never runs a pass

        leader = ServingLoop(rt, a)
        leader.controller = passes_a = _Passes(leader, rt.store)  # type: ignore[assignment]
        leader._run()
        assert passes_a.epochs == [1]  # the leader's pass, fenced by its epoch

        clock.now += 10  # a's lease ran out; b takes it (epoch 2)
        assert b.round()
        del b.acting_epoch
        stale = ServingLoop(rt, a)
        stale.controller = passes_stale = _Passes(stale, rt.store)  # type: ignore[assignment]
        a.acting_epoch = lambda: 1  # type: ignore[method-assign]  # a deposed leader that has not noticed
        before = _tenants(rt.store)
        stale._run()
        assert passes_stale.epochs == [1] and _tenants(rt.store) == before  # its write was refused
    finally:
        rt.store.close()


def test_a_leader_stopped_inside_a_statement_does_not_block_the_takeover(
        store: Store, lapsed: Callable[[], Leadership]) -> None:
    """A session the database is still busy with (a long statement, or results a stopped client no
    longer reads) is not idle, so the database's own bound never ends it: the takeover ends it."""
    from sqlalchemy import text

    b = lapsed()
    writer, outcome = _old_leader(store, "stalled",  # active, holding the lease row
                                  lambda session: session.execute(text("SELECT pg_sleep(60)")))
    _takes_over(b, 15, "the takeover still waits for the old leader's transaction")
    writer.join(15)
    assert outcome == ["refused"]
    assert "stalled" not in _tenant_names(store)
