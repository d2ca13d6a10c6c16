"""Every route of /api/v1: happy paths, tenant isolation, admin-only routes, and the error shape."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import Server
from factories import node
from gpupool.server.metrics import _idle_while_waiting

API = "/api/v1"


def _tenant_token(server: Server, name: str) -> str:
    h = server.headers()
    assert server.client.post(f"{API}/tenants", json={"name": name}, headers=h).status_code == 201
    answer = server.client.post(f"{API}/tokens", json={"tenant": name, "name": "ci"}, headers=h)
    assert answer.status_code == 201
    return str(answer.json()["token"])


def _submit(server: Server, token: str | None = None, **spec: object) -> str:
    body = {"command": ["true"], "resources": {"gpus": 0.25}, **spec}
    answer = server.client.post(f"{API}/workloads", json=body, headers=server.headers(token))
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def test_health_needs_no_token(server: Server) -> None:
    body = server.client.get(f"{API}/health").json()
    assert body["status"] == "ok" and body["provider"] == "manual" and body["database"] == "sqlite"


def test_workload_routes(server: Server) -> None:
    c, h = server.client, server.headers()
    wid = _submit(server, name="train", priority=5)
    server.wait_for(lambda: server.status(wid) == "running")
    page = c.get(f"{API}/workloads", params={"status": "running", "limit": 1}, headers=h).json()
    assert page["total"] == 1 and page["items"][0]["id"] == wid and page["items"][0]["name"] == "train"
    assert c.get(f"{API}/workloads", params={"offset": 1}, headers=h).json()["items"] == []
    one = c.get(f"{API}/workloads/{wid}", headers=h).json()
    # no --gpu-memory: its compute share of the device's memory (0.25 of 32 GiB)
    assert one["pods"][0]["slices"] == [{"device_index": 0, "compute_milli": 250, "memory_mib": 8192}]
    logs = c.get(f"{API}/workloads/{wid}/logs", headers=h).json()
    assert logs["pod_id"] == one["pods"][0]["id"] and logs["text"] == ""
    cancelled = c.post(f"{API}/workloads/{wid}/cancel", headers=h).json()
    assert cancelled["status"] == "cancelled" and server.provider.stopped == [one["pods"][0]["id"]]
    again = c.post(f"{API}/workloads/{wid}/cancel", headers=h)
    assert again.status_code == 409 and again.json()["code"] == "conflict"
    events = c.get(f"{API}/workloads/{wid}/events", headers=h).json()
    assert [e["to_status"] for e in events] == ["pending", "admitted", "running", "cancelled"]


def test_node_routes_and_pool(server: Server) -> None:
    c, h = server.client, server.headers()
    wid = _submit(server, resources={"gpus": 2})
    server.wait_for(lambda: server.status(wid) == "running")
    (n,) = c.get(f"{API}/nodes", headers=h).json()
    assert n["name"] == "n0" and sum(d["allocated_milli"] for d in n["devices"]) == 2000
    assert c.get(f"{API}/nodes/n0", headers=h).json()["cordoned"] is False
    missing = c.get(f"{API}/nodes/n1", headers=h)
    assert missing.status_code == 404 and "n0" in missing.json()["message"]
    assert c.post(f"{API}/nodes/n0/cordon", headers=h).json()["cordoned"] is True
    queued = _submit(server)
    server.rt.wake.set()
    assert server.status(queued) == "pending"
    drained = c.post(f"{API}/nodes/n0/drain", params={"now": "true"}, headers=h).json()
    assert drained["state"] == "drained" and server.status(wid) == "pending"
    assert c.post(f"{API}/nodes/n0/uncordon", headers=h).json()["cordoned"] is False
    server.wait_for(lambda: server.status(wid) == "running" and server.status(queued) == "running")
    assert c.get(f"{API}/workloads/{wid}", headers=h).json()["attempt"] == 2
    pool = c.get(f"{API}/pool", headers=h).json()
    assert pool["capacity_gpus"] == 8 and pool["allocated_gpus"] == 2.25
    assert pool["by_tenant"][0]["tenant"] == "default" and pool["workloads"]["running"] == 2


def test_work_only_a_cordoned_node_holds_waits_saying_so_and_work_no_node_holds_fails(server: Server) -> None:
    """While its only node is cordoned, work waits with a reason that is not final (the node comes
    back, and it runs there); work no node could ever hold fails at once, cordon or not."""
    c, h = server.client, server.headers()
    c.post(f"{API}/nodes/n0/cordon", headers=h).raise_for_status()
    waits = _submit(server, resources={"gpus": 1})
    never = _submit(server, resources={"gpus": 8}, replicas=2)  # two whole nodes of a pool of one
    server.wait_for(lambda: server.status(never) == "failed")
    assert c.get(f"{API}/workloads/{never}", headers=h).json()["reason"] == "never_fits"
    server.wait_for(lambda: bool(c.get(f"{API}/workloads/{waits}", headers=h).json()["reason"]))
    shown = c.get(f"{API}/workloads/{waits}", headers=h).json()
    assert (shown["status"], shown["reason_final"]) == ("pending", False), shown
    assert shown["reason"] != "never_fits" and "never fit" not in shown["message"], shown
    c.post(f"{API}/nodes/n0/uncordon", headers=h).raise_for_status()
    server.wait_for(lambda: server.status(waits) == "running")


def test_tenants_queues_tokens(server: Server) -> None:
    c, h = server.client, server.headers()
    _tenant_token(server, "team-a")
    assert c.post(f"{API}/tenants", json={"name": "team-a"}, headers=h).status_code == 409
    names = [t["name"] for t in c.get(f"{API}/tenants", headers=h).json()]
    assert names == ["default", "team-a"]
    made = c.post(f"{API}/queues", json={"tenant": "team-a", "name": "batch", "quota_gpus": 2}, headers=h)
    assert made.status_code == 201 and made.json()["quota_gpus"] == 2
    assert c.post(f"{API}/queues", json={"tenant": "nobody", "name": "q"}, headers=h).status_code == 404
    patched = c.patch(f"{API}/queues/team-a/batch", json={"quota_gpus": None}, headers=h).json()
    assert patched["quota_gpus"] is None
    listed = c.get(f"{API}/queues", params={"tenant": "team-a"}, headers=h).json()
    assert [q["name"] for q in listed] == ["batch", "default"]


def test_two_tenants_are_isolated(server: Server) -> None:
    c = server.client
    a, b = _tenant_token(server, "team-a"), _tenant_token(server, "team-b")
    wa = _submit(server, a)
    wb = _submit(server, b)
    for token, mine, theirs in ((a, wa, wb), (b, wb, wa)):
        h = server.headers(token)
        assert [w["id"] for w in c.get(f"{API}/workloads", headers=h).json()["items"]] == [mine]
        for path in ("", "/events", "/logs"):
            answer = c.get(f"{API}/workloads/{theirs}{path}", headers=h)
            assert answer.status_code == 404 and answer.json()["code"] == "not_found"
        assert c.post(f"{API}/workloads/{theirs}/cancel", headers=h).status_code == 404
        other = "team-b" if token == a else "team-a"
        hidden = c.get(f"{API}/workloads", params={"tenant": other}, headers=h)  # as if it did not exist
        assert hidden.status_code == 404 and hidden.json()["code"] == "not_found"
        denied = c.post(f"{API}/workloads", json={"command": ["x"], "tenant": other}, headers=h)
        assert denied.status_code == 403 and denied.json()["code"] == "forbidden"
        assert [t["name"] for t in c.get(f"{API}/tenants", headers=h).json()] == [
            other.replace(
                "team-b" if other == "team-b" else "team-a", "team-a" if other == "team-b" else "team-b"
            )
        ]
        pool = c.get(f"{API}/pool", headers=h).json()
        assert [t["tenant"] for t in pool["by_tenant"]] == ["team-a" if token == a else "team-b"]
    assert c.get(f"{API}/workloads/{wa}", headers=server.headers()).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/tenants", {"name": "x"}),
        ("post", "/queues", {"tenant": "team-a", "name": "q"}),
        ("patch", "/queues/team-a/default", {"quota_gpus": 1}),
        ("post", "/tokens", {"tenant": "team-a"}),
        ("post", "/nodes/n0/cordon", None),
        ("post", "/nodes/n0/uncordon", None),
        ("post", "/nodes/n0/drain", None),
    ],
)
def test_admin_routes_refuse_tenants(server: Server, method: str, path: str, body: object) -> None:
    token = _tenant_token(server, "team-a")
    answer = getattr(server.client, method)(f"{API}{path}", json=body, headers=server.headers(token))
    assert answer.status_code == 403
    assert set(answer.json()) == {"code", "message", "details"} and answer.json()["code"] == "forbidden"


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer "}],
)
def test_missing_or_wrong_token_is_401(server: Server, headers: dict[str, str]) -> None:
    for method, path in (
        ("get", "/workloads"),
        ("post", "/workloads"),
        ("get", "/nodes"),
        ("get", "/pool"),
        ("get", "/tenants"),
        ("get", "/queues"),
    ):
        answer = getattr(server.client, method)(f"{API}{path}", headers=headers)
        assert answer.status_code == 401, (method, path)
        assert answer.json()["code"] == "unauthorized" and answer.headers["www-authenticate"] == "Bearer"


def test_metrics(server: Server) -> None:
    wid = _submit(server)
    server.wait_for(lambda: server.status(wid) == "running")
    text = server.client.get("/metrics", headers=server.headers()).text
    for line in (
        'gpupool_device_capacity_devices{model="H100",simulated="false"} 8.0',
        'gpupool_device_allocated_devices{model="H100",tenant="default"} 0.25',
        'gpupool_workloads{status="running"} 1.0',
        "gpupool_scheduling_cycle_duration_seconds_count",
        'gpupool_api_request_duration_seconds_count{method="POST",route="/api/v1/workloads",status="201"}',
    ):
        assert line in text, line
    assert "gpupool_queue_pending_workloads" in text
    assert "gpupool_queue_pending_devices 0.0" in text  # nothing waits: nothing is idle while waiting
    assert "gpupool_devices_idle_while_waiting 0.0" in text


def test_metrics_count_devices_left_idle_while_work_waits(server: Server) -> None:
    small = _submit(server)
    server.wait_for(lambda: server.status(small) == "running")
    # one pod of all 8 devices cannot start beside the quarter device held: 7.75 sit idle while it
    # waits, and the job ahead of a second waiting one caps nothing (only the free devices do)
    big = _submit(server, resources={"gpus": 8})
    also = _submit(server, resources={"gpus": 8})
    server.wait_for(lambda: server.status(big) == "pending" and server.status(also) == "pending")
    text = server.client.get("/metrics", headers=server.headers()).text
    assert "gpupool_queue_pending_devices 16.0" in text
    assert "gpupool_devices_idle_while_waiting 7.75" in text


def test_idle_while_waiting_leaves_out_sick_and_cordoned_capacity() -> None:
    ok, cordoned, sick = node("a", devices=4), node("b", devices=4), node("c", devices=4)
    sick = replace(sick, devices=(replace(sick.devices[0], healthy=False), *sick.devices[1:]))
    nodes = (ok, replace(cordoned, cordoned=True), sick)
    pods = [("a", [{"device_index": 0, "compute_milli": 500}], "t"),
            ("c", [{"device_index": 0, "compute_milli": 1000}], "t")]  # on the sick device
    def idle(waiting_milli: int) -> float:
        families = {m.name: m.samples[0].value for m in _idle_while_waiting(nodes, pods, waiting_milli)}
        return families["gpupool_devices_idle_while_waiting"]
    # free: 3.5 on a, 3 healthy on c; nothing of the cordoned b
    assert idle(100_000) == 6.5
    assert idle(2_000) == 2.0 and idle(0) == 0.0
