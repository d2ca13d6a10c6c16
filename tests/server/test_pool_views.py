"""The pool's views read from the kept held-pods view: /nodes lists each device's held slices (a
tenant's token only its own) with an ETag, /pool and /queues follow pods as they start and end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conftest import Server
from gpupool.server.held import HeldPods

API = "/api/v1"


def _tenant(server: Server, name: str) -> str:
    admin = server.headers()
    assert server.client.post(f"{API}/tenants", json={"name": name}, headers=admin).status_code == 201
    answer = server.client.post(f"{API}/tokens", json={"tenant": name, "name": "t"}, headers=admin)
    return str(answer.json()["token"])


def _submit(server: Server, token: str, gpus: float, name: str) -> str:
    answer = server.client.post(f"{API}/workloads", headers=server.headers(token),
                                json={"command": ["true"], "name": name, "resources": {"gpus": gpus}})
    assert answer.status_code == 201, answer.text
    workload_id = str(answer.json()["id"])
    server.wait_for(lambda: server.status(workload_id) == "running")
    return workload_id


def _held(server: Server, token: str | None = None) -> list[dict[str, Any]]:
    nodes = server.client.get(f"{API}/nodes", headers=server.headers(token)).json()
    return [{"device": d["index"], **s} for n in nodes for d in n["devices"] for s in d["held"]]


def test_nodes_list_the_held_slices_and_a_tenant_sees_only_its_own(server: Server) -> None:
    red, blue = _tenant(server, "red"), _tenant(server, "blue")
    red_job = _submit(server, red, 0.5, "red-job")
    blue_job = _submit(server, blue, 2, "blue-job")

    everything = _held(server)
    assert sorted((s["workload"], s["tenant"], s["name"], s["compute_milli"]) for s in everything) == sorted(
        [(red_job, "red", "red-job", 500), (blue_job, "blue", "blue-job", 1000),
         (blue_job, "blue", "blue-job", 1000)])
    # the admin's answer was built first: the parts it left in the cache must not reach a tenant
    assert [(s["workload"], s["tenant"]) for s in _held(server, red)] == [(red_job, "red")]
    assert {s["tenant"] for s in _held(server, blue)} == {"blue"}
    as_red = server.client.get(f"{API}/nodes", headers=server.headers(red)).text
    assert "blue" not in as_red
    devices = server.client.get(f"{API}/nodes", headers=server.headers(red)).json()[0]["devices"]
    assert sum(d["allocated_milli"] for d in devices) == 2500, "the others' use still counts in the totals"


def test_an_unchanged_listing_answers_304_and_a_change_a_new_etag(server: Server) -> None:
    first = server.client.get(f"{API}/nodes", headers=server.headers())
    etag = first.headers["etag"]
    again = server.client.get(f"{API}/nodes", headers={**server.headers(), "If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    assert server.client.post(f"{API}/nodes/n0/cordon", headers=server.headers()).status_code == 200
    changed = server.client.get(f"{API}/nodes", headers={**server.headers(), "If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    assert changed.json()[0]["cordoned"] is True
    assert first.json()[0]["cordoned"] is False


def test_pool_and_queues_follow_pods_that_start_and_end(server: Server) -> None:
    token = _tenant(server, "green")
    workload_id = _submit(server, token, 2, "green-job")

    def allocated() -> tuple[float, float, float]:
        pool = server.client.get(f"{API}/pool", headers=server.headers()).json()
        queue = server.client.get(f"{API}/queues", params={"tenant": "green"},
                                  headers=server.headers()).json()
        tenant = next((t["allocated_gpus"] for t in pool["by_tenant"] if t["tenant"] == "green"), 0.0)
        return pool["allocated_gpus"], tenant, queue[0]["used_gpus"]

    assert allocated() == (2.0, 2.0, 2.0)
    for pod_id in server.provider.running():
        server.provider.finish(pod_id)
    server.wait_for(lambda: server.status(workload_id) == "succeeded")
    assert allocated() == (0.0, 0.0, 0.0)


def test_the_held_view_reads_only_new_pods_and_keeps_its_version_while_unchanged(
        server_factory: Callable[..., Server], db_url: str) -> None:
    server = server_factory(db_url)  # the ids are read through the driver's cursor: both stores
    token = _tenant(server, "amber")
    _submit(server, token, 1, "one")
    held = HeldPods()
    with server.rt.store.read() as session:
        first = held.read(session.connection())
        assert held.read(session.connection()) is first
    assert [p.tenant for p in first.pods.values()] == ["amber"]
    second_id = _submit(server, token, 1, "two")
    with server.rt.store.read() as session:
        second = held.read(session.connection())
    assert second.version == first.version + 1
    assert second_id in {p.workload for p in second.pods.values()}
    kept = set(first.pods) & set(second.pods)
    assert kept and all(second.pods[i] is first.pods[i] for i in kept), "known pods are not read again"
