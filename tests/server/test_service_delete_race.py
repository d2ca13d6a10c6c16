"""A replica the controller makes for a service it read before a delete began is not stored: the
replica's own transaction checks the service is still there and not being deleted (compare-and-set),
so no replica outlives its service (seen as a running replica left after `DELETE /services/NAME`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fabric_pool import Pool
from sqlalchemy import func, select

from gpupool.api.services import ServiceSpec
from gpupool.server.orm import ServiceReplicaRow, ServiceRow, WorkloadRow
from gpupool.server.serving.controller import Controller


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    pool = Pool(tmp_path, fabric=False)
    yield pool
    pool.close()


def _read_service(pool: Pool, name: str) -> ServiceRow:
    with pool.rt.store.read() as session:
        row = session.scalars(select(ServiceRow).where(ServiceRow.name == name)).one()
        session.expunge(row)
        return row


def _new_service(pool: Pool) -> ServiceRow:
    """Service `web` created, as the controller's pass reads it (no replica made yet)."""
    answer = pool.call("post", "/services", {"name": "web", "command": ["serve"],
                                             "resources": {"gpus": 0.25}}, pool.tenant)
    assert answer.status_code == 201, answer.text
    return _read_service(pool, "web")


def _create_replica(pool: Pool, row: ServiceRow) -> bool:
    """The controller's replica for `row` as it read it."""
    controller = Controller(pool.rt)
    try:
        return controller._create(row, ServiceSpec.model_validate(row.spec), pool.now)
    finally:
        controller.close()


def _replica_workloads(pool: Pool) -> int:
    with pool.rt.store.read() as session:
        return int(session.scalar(select(func.count()).select_from(ServiceReplicaRow)) or 0) + int(
            session.scalar(select(func.count()).select_from(WorkloadRow)) or 0)


def test_a_replica_for_a_service_whose_delete_began_is_not_stored(pool: Pool) -> None:
    row = _new_service(pool)
    with pool.rt.store.write() as session:  # `services.remove`'s first step: marked, replicas listed
        marked = session.get(ServiceRow, row.id)
        assert marked is not None
        marked.state, marked.version = "deleting", marked.version + 1
    before = _replica_workloads(pool)
    assert _create_replica(pool, row) is False
    assert _replica_workloads(pool) == before  # neither the workload nor its replica row


def test_a_service_read_and_still_there_gets_its_replica(pool: Pool) -> None:
    row = _new_service(pool)
    before = _replica_workloads(pool)
    assert _create_replica(pool, row) is True
    assert _replica_workloads(pool) == before + 2  # the workload and its replica row
    assert pool.call("delete", "/services/web", token=pool.tenant).status_code == 200
    with pool.rt.store.read() as session:
        statuses = set(session.scalars(select(WorkloadRow.status)))
    assert statuses == {"cancelled"}  # the delete listed it and cancelled it
