"""The services' contract with their data plane: ready endpoints, and desired counts set by
compare-and-set on the service row (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import select

from gpupool.server.db import Store
from gpupool.server.orm import (
    QueueRow,
    ServiceEventRow,
    ServiceReplicaRow,
    ServiceRow,
    TenantRow,
    WorkloadRow,
)
from gpupool.server.serving.endpoints import Endpoint, ready_endpoints, set_desired


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    store = Store.open(db_url)
    with store.write() as session:
        session.add(TenantRow(name="a", created_s=0.0))
        session.flush()
        session.add(QueueRow(tenant="a", name="default", created_s=0.0))
        session.add(ServiceRow(id="s-1", tenant="a", name="web", spec={}, generation=1, version=3, desired=2,
                               min_replicas=1, max_replicas=4, public=False, state="ready",
                               last_probe_error="", created_s=0.0, updated_s=0.0))
        session.flush()
        for wid, status, ready, host in (("w-1", "running", "ready", "10.0.0.1"),
                                         ("w-2", "running", "unready", "10.0.0.2"),
                                         ("w-3", "pending", "ready", ""),
                                         ("w-0", "running", "ready", "10.0.0.3")):
            session.add(WorkloadRow(id=wid, tenant="a", queue="default", status=status, spec={},
                                    submit_s=0.0))
            session.flush()
            session.add(ServiceReplicaRow(workload_id=wid, service_id="s-1", generation=1,
                                          port=40001, host=host, ready=ready, successes=0, failures=0,
                                          last_error="", created_s=0.0))
    yield store
    store.close()


def test_ready_endpoints_are_the_running_ready_replicas_in_id_order(store: Store) -> None:
    with store.read() as session:
        assert ready_endpoints(session, "s-1") == [Endpoint("w-0", "10.0.0.3", 40001),
                                                    Endpoint("w-1", "10.0.0.1", 40001)]
        assert ready_endpoints(session, "s-unknown") == []


def test_set_desired_is_a_compare_and_set_that_clamps_and_writes_its_event(store: Store) -> None:
    with store.write() as session:
        assert set_desired(session, "s-1", 9, "19.4 in flight against a target of 4", 3, now=5.0)
    with store.write() as session:  # a writer that read version 3 too loses, and writes nothing
        assert not set_desired(session, "s-1", 1, "idle", 3, now=6.0)
    with store.read() as session:
        row = session.get(ServiceRow, "s-1")
        assert row is not None and (row.desired, row.version) == (4, 4)  # clamped to max 4
        events = session.scalars(select(ServiceEventRow.message)).all()
        assert events == ["scaled 2 → 4: 19.4 in flight against a target of 4"]
    with store.write() as session:
        assert set_desired(session, "s-1", 0, "idle", 4, now=7.0)
    with store.read() as session:
        row = session.get(ServiceRow, "s-1")
        assert row is not None and (row.desired, row.version) == (1, 5)  # clamped to min 1
    with store.write() as session:
        assert not set_desired(session, "s-gone", 1, "", 1)


def test_of_concurrent_scalers_that_read_one_version_exactly_one_wins(store: Store) -> None:
    """Eight writers at once, each in its own transaction (PostgreSQL runs them concurrently): one
    scale applies, with one event; the others are told they lost."""
    barrier = threading.Barrier(8)

    def scale(n: int) -> bool:
        barrier.wait()
        with store.write() as session:
            return set_desired(session, "s-1", n, f"writer {n}", 3, now=float(n))

    asked = [1, 3, 4, 1, 3, 4, 3, 4]  # each a change from the 2 it has
    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(scale, asked))
    with store.read() as session:
        row = session.get(ServiceRow, "s-1")
        events = session.scalars(select(ServiceEventRow.message)).all()
    winners = [n for n, won in zip(asked, outcomes, strict=True) if won]
    assert len(winners) == 1, outcomes
    assert row is not None and (row.version, row.desired) == (4, winners[0])
    assert events == [f"scaled 2 → {winners[0]}: writer {winners[0]}"]
