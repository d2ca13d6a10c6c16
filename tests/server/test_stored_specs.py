"""Specs read back from the store are read by the rules they were stored under: a rule given to new
specs since (no relative workdir, no variable the pool sets itself in env) refuses a submission, but
a workload or service already stored with one is still shown, scheduled and replaced. Read with the
new rules, one such pending workload failed the scheduler's every cycle, and `show` answered 500."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from conftest import Server
from gpupool.server.orm import ServiceRow, WorkloadRow

API = "/api/v1"
OLD = {"command": ["serve"], "workdir": "relative/dir", "env": {"GPUPOOL_TENANT": "someone-else"},
       "resources": {"gpus": 0.25}}


def _stored_as_before(server: Server, workload_id: str, changes: dict[str, Any]) -> None:
    with server.rt.store.write() as session:
        row = session.get(WorkloadRow, workload_id)
        assert row is not None
        row.spec = {**row.spec, **changes}
        row.revision += 1  # the scheduler reads it again from the store, as after a restart


def test_a_workload_stored_before_a_rule_is_still_shown_and_scheduled(server: Server) -> None:
    c, h = server.client, server.headers()
    refused = c.post(f"{API}/workloads", json=OLD, headers=h)
    assert refused.status_code == 422 and "absolute path" in refused.json()["message"], refused.text
    c.post(f"{API}/nodes/n0/cordon", headers=h).raise_for_status()
    made = c.post(f"{API}/workloads", json={"command": ["serve"], "resources": {"gpus": 0.25}}, headers=h)
    workload_id = made.json()["id"]
    _stored_as_before(server, workload_id, {"workdir": OLD["workdir"], "env": OLD["env"]})
    shown = c.get(f"{API}/workloads/{workload_id}", headers=h)
    assert shown.status_code == 200, shown.text
    assert shown.json()["spec"]["env"] == OLD["env"]
    c.post(f"{API}/nodes/n0/uncordon", headers=h).raise_for_status()
    server.wait_for(lambda: server.status(workload_id) == "running")
    [launch] = [p for p in server.provider.launched.values() if p.workload_id == workload_id]
    assert launch.env["GPUPOOL_TENANT"] == "default"  # the pool's value wins, as it always did


def test_a_service_stored_before_a_rule_still_gets_its_replicas(server: Server) -> None:
    c, h = server.client, server.headers()
    refused = c.post(f"{API}/services", json={"name": "old", **OLD, "workdir": ""}, headers=h)
    assert refused.status_code == 422 and "GPUPOOL_TENANT" in refused.json()["message"], refused.text
    made = c.post(f"{API}/services", json={"name": "old", "command": ["serve"], "resources": {"gpus": 0.25},
                                           "min_replicas": 0, "max_replicas": 1, "replicas": 0}, headers=h)
    assert made.status_code == 201, made.text
    with server.rt.store.write() as session:
        row = session.scalars(select(ServiceRow).where(ServiceRow.name == "old")).one()
        row.spec = {**row.spec, "env": OLD["env"]}
    shown = c.get(f"{API}/services/old", headers=h)
    assert shown.status_code == 200, shown.text
    scaled = c.post(f"{API}/services/old/scale", json={"replicas": 1}, headers=h)
    assert scaled.status_code == 200, scaled.text
    server.wait_for(lambda: len(c.get(f"{API}/services/old", headers=h).json()["replicas"]) == 1)
