"""Issue 12 item 5: admins inject and clear faults on simulated and fake nodes through the API; the
faults outlive a restart; node listings show ready / cordoned / draining / unhealthy / lost."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fakes import ManualProvider
from fastapi.testclient import TestClient

from conftest import Server, make_runtime, start_server, stop_server
from factories import node
from gpupool.core.model import Node
from gpupool.providers.base import Capability
from gpupool.providers.fake import FakeProvider
from gpupool.server.app import create_app


def sim_node(name: str, devices: int = 4) -> Node:
    plain = node(name, devices=devices, model="H100")
    return replace(plain, devices=tuple(replace(d, simulated=True) for d in plain.devices))


def pool_provider() -> FakeProvider:
    """Two simulated nodes and one of real hardware, on a provider that can inject faults."""
    return FakeProvider([sim_node("s0"), sim_node("s1"), node("real", devices=2, model="H100")])


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[Server]:
    server = start_server(tmp_path, provider=pool_provider())  # type: ignore[arg-type]
    yield server
    stop_server(server)


def restart(old: Server, provider: FakeProvider) -> Server:
    """A new server (runtime, provider, app) on `old`'s store, after `old` stopped."""
    new = start_server(Path(old.rt.settings.data_dir), old.rt.settings.database_url,
                       provider=provider)  # type: ignore[arg-type]
    new.admin_token = old.admin_token  # created by the first start only
    return new


def post(server: Server, path: str, token: str | None = None, **params: object) -> dict[str, object]:
    answer = server.client.post(f"/api/v1/nodes/{path}", params=params, headers=server.headers(token))
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def refused(server: Server, path: str, status: int, token: str | None = None, **params: object) -> str:
    answer = server.client.post(f"/api/v1/nodes/{path}", params=params, headers=server.headers(token))
    assert answer.status_code == status, answer.text
    assert set(answer.json()) == {"code", "message", "details"}
    return str(answer.json()["message"])


def listing(server: Server) -> dict[str, dict[str, object]]:
    answer = server.client.get("/api/v1/nodes", headers=server.headers())
    assert answer.status_code == 200, answer.text
    return {n["name"]: n for n in answer.json()}


def states(server: Server) -> dict[str, object]:
    return {name: n["state"] for name, n in listing(server).items()}


def device_health(answer: dict[str, object]) -> list[tuple[int, bool, bool]]:
    devices = answer["devices"]
    assert isinstance(devices, list)
    return [(d["index"], d["healthy"], d["injected_fault"]) for d in devices]


def test_failing_a_device_makes_it_and_its_node_unhealthy_until_healed(srv: Server) -> None:
    failed = post(srv, "s0/fail", device=2)
    assert (failed["state"], failed["healthy"], failed["unhealthy_devices"]) == ("unhealthy", True, [2])
    assert device_health(failed) == [(0, True, False), (1, True, False), (2, False, True), (3, True, False)]
    assert states(srv) == {"s0": "unhealthy", "s1": "ready", "real": "ready"}
    # the provider itself reports it, so the scheduler's snapshot sees the same
    (s0,) = [n for n in srv.provider.nodes() if n.name == "s0"]
    assert [d.healthy for d in s0.devices] == [True, True, False, True]
    healed = post(srv, "s0/heal", device=2)
    assert (healed["state"], healed["unhealthy_devices"]) == ("ready", [])
    assert all(d.healthy for d in srv.provider.nodes()[0].devices)


def test_failing_a_node_and_healing_it_clears_every_fault(srv: Server) -> None:
    post(srv, "s1/fail", device=0)
    failed = post(srv, "s1/fail")
    assert (failed["state"], failed["healthy"], failed["injected_fault"]) == ("unhealthy", False, True)
    again = post(srv, "s1/fail")  # idempotent
    assert again["state"] == "unhealthy"
    healed = post(srv, "s1/heal")
    assert (healed["state"], healed["healthy"], healed["injected_fault"], healed["unhealthy_devices"]) == (
        "ready", True, False, [])
    assert all(d.healthy for n in srv.provider.nodes() for d in n.devices)


def test_real_hardware_unknown_targets_and_tenants_are_refused(srv: Server) -> None:
    message = refused(srv, "real/fail", 409)
    assert message == ("Node 'real' is real hardware; faults can be injected only on simulated devices "
                       "(gpupool up --simulate) and the fake provider's nodes.")
    assert refused(srv, "real/fail", 409, device=1).startswith("Device 1 of node 'real' is real hardware;")
    assert refused(srv, "real/heal", 409).startswith("Node 'real' is real hardware;")
    assert refused(srv, "s0/fail", 404, device=9).startswith("Node 's0' has no device 9; its devices are 0-3")
    assert refused(srv, "s9/fail", 404).startswith("No node named 's9'.")
    srv.created("/tenants", {"name": "team-a"})
    token = srv.created("/tokens", {"tenant": "team-a"})["token"]
    assert isinstance(token, str)
    assert refused(srv, "s0/fail", 403, token=token).startswith("This needs the admin token")
    assert srv.client.post("/api/v1/nodes/s0/fail", params={"device": -1},
                           headers=srv.headers()).status_code == 422
    assert states(srv) == {"s0": "ready", "s1": "ready", "real": "ready"}  # nothing was injected


def test_a_provider_without_fault_injection_is_refused_with_its_reason(tmp_path: Path) -> None:
    class NoFaults(ManualProvider):
        def missing_capabilities(self) -> dict[Capability, str]:
            return {Capability.FAULT_INJECTION: "its devices are real"}

    server = start_server(tmp_path, provider=NoFaults([sim_node("s0")]))
    try:
        message = refused(server, "s0/fail", 409)
        assert message == "The manual provider cannot inject faults (its devices are real)."
    finally:
        stop_server(server)


def test_fail_and_heal_are_audited(srv: Server) -> None:
    post(srv, "s0/fail", device=1)
    post(srv, "s0/fail")
    post(srv, "s0/heal")
    rows = srv.client.get("/api/v1/audit", headers=srv.headers()).json()
    got = [(r["action"], r["target"], r["detail"]) for r in reversed(rows) if r["action"].startswith("node.")]
    assert got == [("node.fail", "s0", "device 1"), ("node.fail", "s0", "node"), ("node.heal", "s0", "node")]


def test_injected_faults_survive_a_restart_on_the_same_store(tmp_path: Path, db_url: str) -> None:
    first = start_server(tmp_path, db_url, provider=pool_provider())  # type: ignore[arg-type]
    post(first, "s0/fail", device=3)
    post(first, "s1/fail")
    stop_server(first)
    second = restart(first, pool_provider())  # a fresh provider: nothing injected
    try:
        nodes = listing(second)
        assert (nodes["s0"]["state"], nodes["s0"]["unhealthy_devices"]) == ("unhealthy", [3])
        assert (nodes["s1"]["state"], nodes["s1"]["healthy"]) == ("unhealthy", False)
        assert [n.name for n in second.provider.nodes() if not n.healthy] == ["s1"]
        post(second, "s0/heal", device=3)
    finally:
        stop_server(second)
    third = restart(first, pool_provider())
    try:
        assert states(third) == {"s0": "ready", "s1": "unhealthy", "real": "ready"}
    finally:
        stop_server(third)


def test_a_flagged_node_the_provider_no_longer_lists_is_lost(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    first = start_server(tmp_path, provider=pool_provider())  # type: ignore[arg-type]
    post(first, "s1/fail", device=2)
    post(first, "real/cordon")
    post(first, "s0/cordon")
    post(first, "s0/uncordon")  # a flag row with nothing set: not a reason to list s0 when it goes
    stop_server(first)
    with caplog.at_level(logging.WARNING):
        second = restart(first, FakeProvider([sim_node("s9")]))
    try:
        assert "The injected fault on device 2 of node s1 was not restored" in caplog.text
        nodes = listing(second)
        assert {n: v["state"] for n, v in nodes.items()} == {"s9": "ready", "real": "lost", "s1": "lost"}
        assert (nodes["s1"]["unhealthy_devices"], nodes["s1"]["devices"]) == ([2], [])
        assert nodes["real"]["cordoned"] is True
        shown = second.client.get("/api/v1/nodes/s1", headers=second.headers()).json()
        assert shown["state"] == "lost"
        # healing and uncordoning a lost node clear its flags, so it leaves the listing
        assert post(second, "s1/heal")["state"] == "lost"
        post(second, "real/uncordon")
        assert states(second) == {"s9": "ready"}
        assert second.client.get("/api/v1/nodes/s1", headers=second.headers()).status_code == 404
        assert refused(second, "real/cordon", 404).startswith("No node named 'real'.")
    finally:
        stop_server(second)


def test_a_node_with_running_pods_the_provider_no_longer_lists_is_lost(tmp_path: Path) -> None:
    first = start_server(tmp_path, provider=ManualProvider([node("n0", devices=2), node("n1", devices=2)]))
    workload = first.created("/workloads", {"command": ["true"], "resources": {"gpus": 2, "cpu": 2}})["id"]
    first.wait_for(lambda: first.status(str(workload)) == "running")
    stop_server(first)
    # no control loop: what is read is the store as the old server left it
    store_url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    rt, _ = make_runtime(store_url, tmp_path, ManualProvider([node("n1", devices=2)]))

    with TestClient(create_app(rt, run_loop=False)) as client:
        token = (tmp_path / "admin-token").read_text().strip()
        answer = client.get("/api/v1/nodes", headers={"Authorization": f"Bearer {token}"}).json()
    rt.store.close()
    lost = {n["name"]: n for n in answer}["n0"]
    assert (lost["state"], lost["allocated_cpu_milli"], lost["devices"]) == ("lost", 2000, [])
    assert [n["name"] for n in answer] == ["n1", "n0"]


def pods(server: Server, workload_id: str) -> list[tuple[str, list[int]]]:
    answer = server.client.get(f"/api/v1/workloads/{workload_id}", headers=server.headers()).json()
    return [(p["node"], [s["device_index"] for s in p["slices"]]) for p in answer["pods"]]


def reasons(server: Server, workload_id: str) -> list[str]:
    answer = server.client.get(f"/api/v1/workloads/{workload_id}/events", headers=server.headers())
    return [e["reason"] for e in answer.json()]


def test_the_work_on_a_failed_device_or_node_is_evicted_and_placed_on_healthy_hardware(srv: Server) -> None:
    """The seam with the control loop: what fail injects is what the scheduler's snapshot sees."""
    workload = str(srv.created("/workloads", {"command": ["true"], "resources": {"gpus": 2}})["id"])
    srv.wait_for(lambda: srv.status(workload) == "running")
    ((where, devices),) = pods(srv, workload)
    post(srv, f"{where}/fail", device=devices[0])
    srv.wait_for(lambda: "evicted_unhealthy" in reasons(srv, workload) and srv.status(workload) == "running")
    ((again, now_on),) = pods(srv, workload)
    assert again != where or devices[0] not in now_on  # never the failed device again
    post(srv, f"{again}/fail")
    srv.wait_for(lambda: reasons(srv, workload).count("evicted_unhealthy") == 2
                 and srv.status(workload) == "running")
    ((last, _),) = pods(srv, workload)
    assert last != again  # any healthy node, never the failed one
