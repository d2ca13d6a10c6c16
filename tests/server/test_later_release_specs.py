"""A spec stored by a later release's server (one store, a rolling upgrade) may hold a field this
release does not know: it is read without it (the workload is shown and updated, not a 500), while a
spec submitted now still refuses an unknown field (a typo is an error, not a no-op)."""

from __future__ import annotations

from sqlalchemy import update

from conftest import Server
from gpupool.server.orm import WorkloadRow

API = "/api/v1"


def test_a_field_a_later_release_stored_is_read_past_and_a_submitted_one_refused(server: Server) -> None:
    made = server.client.post(f"{API}/workloads", json={"command": ["true"], "resources": {"gpus": 1}},
                              headers=server.headers(), params={"hold": "true"})
    wid = made.json()["id"]
    with server.rt.store.write() as session:
        row = session.get(WorkloadRow, wid)
        assert row is not None
        stored = {**row.spec, "a_later_field": {"x": 1}}
        session.execute(update(WorkloadRow).where(WorkloadRow.id == wid).values(spec=stored))
    shown = server.client.get(f"{API}/workloads/{wid}", headers=server.headers())
    assert shown.status_code == 200, shown.text
    assert "a_later_field" not in shown.json()["spec"]
    changed = server.client.patch(f"{API}/workloads/{wid}", json={"priority": 3}, headers=server.headers())
    assert changed.status_code == 200, changed.text
    refused = server.client.post(f"{API}/workloads", headers=server.headers(),
                                 json={"command": ["true"], "a_later_field": 1})
    assert refused.status_code == 422 and "a_later_field" in refused.json()["message"]
