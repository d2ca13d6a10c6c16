"""A finite event stream (`gpupool events` without --follow) reads the table a window of SCAN ids at a
time: it goes on past a window that held none of its tenant's events (another tenant's thousands
between two of its own), and ends only at the newest id stored when it read."""

from __future__ import annotations

import pytest

from conftest import Server
from gpupool.server.services import event_stream

API = "/api/v1"


def test_a_finite_stream_reads_past_a_window_of_other_tenants_events(server: Server,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    api, admin = server.client, server.headers()
    assert api.post(f"{API}/nodes/n0/cordon", headers=admin).status_code == 200  # every workload waits
    tokens = {}
    for tenant in ("a", "b"):
        assert api.post(f"{API}/tenants", json={"name": tenant}, headers=admin).status_code == 201
        tokens[tenant] = server.headers(api.post(f"{API}/tokens", json={"tenant": tenant}, headers=admin)
                                        .json()["token"])

    def submit(tenant: str) -> str:
        made = api.post(f"{API}/workloads", json={"command": ["x"]}, headers=tokens[tenant])
        assert made.status_code == 201, made.text
        return str(made.json()["id"])

    first = submit("a")
    for _ in range(12):
        submit("b")
    last = submit("a")
    assert api.post(f"{API}/workloads/{last}/cancel", headers=tokens["a"]).status_code == 200
    want = sorted(e["id"] for w in (first, last) for e in api.get(f"{API}/workloads/{w}/events",
                                                                   headers=tokens["a"]).json())
    monkeypatch.setattr(event_stream, "SCAN", 5)  # fewer ids a read than b's events between a's
    body = api.get(f"{API}/events/stream", headers=tokens["a"]).text
    got = [int(line[4:]) for line in body.splitlines() if line.startswith("id: ")][1:]  # after the start's
    assert got == want and len(want) >= 3, (got, want)
