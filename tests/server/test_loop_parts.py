"""The control loop's parts, each on its own (loops/time_limits.py, loops/arrivals.py): the time-limit
part given a clock and a store of rows fails exactly the overdue ones, and takes no write lock when
none is; the arrivals window decides full passes and moves its horizon as the scheduler relies on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from factories import node, workload
from gpupool.api.workloads import WorkloadSpec
from gpupool.core.model import ClusterSnapshot, Workload
from gpupool.core.quota import QuotaConfig
from gpupool.providers.fake import FakeProvider
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops.arrivals import ARRIVAL_MARGIN_S, FULL_RESCAN_S, Window
from gpupool.server.loops.snapshot import StoreView
from gpupool.server.loops.time_limits import LIMIT_CHECK_S, TimeLimits, duration
from gpupool.server.orm import EventRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import workloads
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

ADMIN = Principal("admin", None)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    clock = Clock()
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    made = Runtime(settings=Settings(data_dir=tmp_path, database_url=url), store=Store.open(url),
                   provider=FakeProvider("1x8xH100", clock=clock), clock=clock)
    bootstrap(made)
    yield made
    made.store.close()


def _row(rt: Runtime, status: str, started_s: float | None, limit_s: float | None) -> str:
    """A workload row as the loop would find it: `status`, started at `started_s`, `limit_s` long."""
    spec = WorkloadSpec.model_validate({"command": ["train"], "resources": {"gpus": 1},
                                        **({"time_limit_s": limit_s} if limit_s else {})})
    workload_id = workloads.submit(rt, ADMIN, spec).id
    with rt.store.write() as session:
        session.execute(update(WorkloadRow).where(WorkloadRow.id == workload_id)
                        .values(status=status, started_s=started_s))
    return workload_id


def _status(rt: Runtime, workload_id: str) -> tuple[str, str]:
    with rt.store.read() as session:
        row = session.get(WorkloadRow, workload_id)
        assert row is not None
        return row.status, row.reason


def test_the_time_limit_part_fails_exactly_the_workloads_past_their_limit(rt: Runtime) -> None:
    clock = rt.clock
    assert isinstance(clock, Clock)
    at_limit = _row(rt, "running", 900.0, 100.0)  # 900 + 100 <= 1000: due now
    admitted = _row(rt, "admitted", 800.0, 60.0)
    a_second_early = _row(rt, "running", 901.0, 100.0)
    next_due = _row(rt, "running", 900.2, 100.0)
    not_started = _row(rt, "admitted", None, 10.0)
    unlimited = _row(rt, "running", 0.0, None)
    pending = _row(rt, "pending", None, 1.0)
    ended = _row(rt, "succeeded", 0.0, 1.0)
    told: list[str] = []
    part = TimeLimits(rt, on_ended=told.append)
    assert part.enforce() == 2
    assert sorted(told) == sorted([at_limit, admitted])
    assert _status(rt, at_limit) == _status(rt, admitted) == ("failed", "time_limit")
    others = (a_second_early, next_due, not_started, unlimited, pending, ended)
    assert [_status(rt, w)[0] for w in others] == ["running", "running", "admitted", "running", "pending",
                                                   "succeeded"]
    with rt.store.read() as session:
        [message] = [e.message for e in session.query(EventRow)
                     .filter_by(workload_id=at_limit, reason="time_limit")]
    assert message.startswith("Stopped at its time limit of 1m40s; give it a longer --time-limit")
    clock.now = 1000.25  # the next is due now, but the part looks at most every LIMIT_CHECK_S
    assert part.enforce() == 0 and _status(rt, next_due)[0] == "running"
    clock.now = 1000.0 + LIMIT_CHECK_S
    assert part.enforce() == 1 and told[-1] == next_due
    clock.now = 1001.0
    assert part.enforce() == 1 and told[-1] == a_second_early
    assert part.enforce() == 0, "checked again only after LIMIT_CHECK_S"


def test_a_time_limit_check_that_finds_none_takes_no_write_lock(rt: Runtime,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Most checks find nothing due: they only read, so they never hold the store's write lock (on
    SQLite one writer at a time: the submissions wait on it)."""
    clock = rt.clock
    assert isinstance(clock, Clock)
    limited = _row(rt, "running", 1000.0, 60.0)
    writes: list[bool] = []
    write = rt.store.write

    @contextmanager
    def counted() -> Iterator[Session]:
        writes.append(True)
        with write() as session:
            yield session

    monkeypatch.setattr(rt.store, "write", counted)
    part = TimeLimits(rt)
    for _ in range(3):
        assert part.enforce() == 0
        clock.now += LIMIT_CHECK_S
    assert writes == [], "nothing was due: no write transaction"
    clock.now = 1060.0
    assert part.enforce() == 1 and writes == [True] and _status(rt, limited) == ("failed", "time_limit")


def test_durations_read_as_the_time_limit_was_given() -> None:
    assert [duration(s) for s in (0, 59.6, 90, 3600, 5400, 3661)] == \
        ["0s", "1m", "1m30s", "1h", "1h30m", "1h1m1s"]


def _view(*pending: Workload, nodes: int = 1, backoff_s: float | None = None) -> StoreView:
    cluster = tuple(node(f"n{i}") for i in range(nodes))
    return StoreView(snapshot=ClusterSnapshot(nodes=cluster), pending=pending, quota=QuotaConfig(),
                     next_backoff_s=backoff_s)


def test_the_arrivals_window_reads_new_arrivals_between_full_passes() -> None:
    window = Window()
    assert window.full_due(0.0, forced=False), "no horizon yet: the first cycle is a full pass"
    window.begin(True, 100.0)
    assert window.seen(_view(workload(wid="a", submit_s=50.0)), full=True, limit=10, now=100.0) is False
    assert window.horizon_s == 50.0 - ARRIVAL_MARGIN_S and window.since_s(True) is None
    assert not window.full_due(100.0 + FULL_RESCAN_S, forced=False)
    assert window.full_due(100.0, forced=True)
    assert window.full_due(100.0 + FULL_RESCAN_S + 0.001, forced=False)
    window.inadmissible.update({"a", "head"})
    assert window.since_s(False) == 40.0 and window.skip(frozenset({"head"})) == {"a"}
    later = _view(workload(wid="a"), workload(wid="b", submit_s=70.0), workload(wid="head"))
    assert [w.id for w in window.candidates(later, frozenset({"head"}))] == ["b", "head"]
    assert window.seen(later, full=False, limit=10, now=101.0) is False
    assert window.horizon_s == 70.0 - ARRIVAL_MARGIN_S, "moved to the newest read"
    assert window.seen(_view(workload(wid="old", submit_s=20.0)), full=True, limit=10, now=101.5) is False
    assert window.horizon_s == 70.0 - ARRIVAL_MARGIN_S, "never moved back"
    burst = _view(*(workload(wid=f"w{i}", submit_s=90.0) for i in range(3)))
    assert window.seen(burst, full=False, limit=3, now=102.0) is True, "more wait beyond the share"
    assert window.horizon_s == 60.0, "kept: the next cycle reads the ones after what this one decides"
    assert window.seen(_view(nodes=2), full=False, limit=3, now=103.0) is False
    assert window.horizon_s is None and window.full_due(103.0, forced=False), "nodes changed: a full pass"
    window.begin(True, 103.0)
    assert window.inadmissible == set(), "a full pass looks at the work set aside again"


def test_a_backoff_that_ends_makes_the_next_cycle_a_full_pass() -> None:
    window = Window()
    window.begin(True, 0.0)
    window.seen(_view(backoff_s=5.0), full=True, limit=10, now=0.0)
    assert not window.full_due(4.0, forced=False) and window.full_due(5.0, forced=False)
