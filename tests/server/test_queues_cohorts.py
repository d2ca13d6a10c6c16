"""Queues with cohorts, borrowing and lending limits and weights: the API, the SDK, the core's view
of them, what `queue ls` reports, and the configuration file's queues applied at start-up."""

from __future__ import annotations

import random
import re
from dataclasses import replace
from pathlib import Path

import pytest
from fakes import ManualProvider
from sqlalchemy import update

from conftest import Server, make_runtime
from factories import cluster, node, pod, workload
from gpupool.api.tenants import QueueCreate, QueueUpdate, TenantCreate
from gpupool.api.workloads import WorkloadSpec
from gpupool.client import Client
from gpupool.config import PoolConfig, parse_config
from gpupool.core.model import Allocation, ClusterSnapshot, Reason, Workload
from gpupool.core.quota import DEVICE_MILLI
from gpupool.core.scheduling.cycle import EventKind, Policies, cycle_on
from gpupool.core.scheduling.view import ClusterView
from gpupool.errors import InvalidInput
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops.control import ControlLoop
from gpupool.server.orm import AuditRow, QueueRow, TenantRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import quotas, tenants, workloads
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

API = "/api/v1"
ADMIN = Principal("admin", None)
QUIET = PoolConfig.model_validate({"scheduling": {"placement": "first-fit", "ordering": "priority-fifo",
                                                  "preemption": False, "backfill": False}})
"""Admission only: what these tests check must not depend on preemption or backfill."""


def _queue(server: Server, body: dict[str, object], status: int = 201) -> dict[str, object]:
    answer = server.client.post(f"{API}/queues", json=body, headers=server.headers())
    assert answer.status_code == status, answer.text
    return dict(answer.json())


def _patch(server: Server, path: str, body: dict[str, object], status: int = 200) -> dict[str, object]:
    answer = server.client.patch(f"{API}/queues/{path}", json=body, headers=server.headers())
    assert answer.status_code == status, answer.text
    return dict(answer.json())


# ------------------------------------------------------------------ the API


def test_create_and_set_change_only_what_is_given(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    wakes: list[str] = []
    monkeypatch.setattr(server.rt, "capacity_may_have_changed", lambda: wakes.append("woken"))
    server.created("/tenants", {"name": "team-a"})
    made = _queue(server, {"tenant": "team-a", "name": "train", "quota_gpus": 4, "cohort": "research",
                           "borrowing_limit_gpus": 2, "lending_limit_gpus": 1.5, "weight": 2})
    assert (made["quota_gpus"], made["cohort"], made["borrowing_limit_gpus"], made["lending_limit_gpus"],
            made["weight"]) == (4, "research", 2, 1.5, 2)
    assert made["used_gpus"] == made["borrowed_gpus"] == made["lent_gpus"] == 0
    assert wakes == ["woken"]  # a new cohort member may have quota to lend
    changed = _patch(server, "team-a/train", {"quota_gpus": 6})
    assert wakes == ["woken"] * 2  # the scheduler looks at all pending work again
    assert (changed["quota_gpus"], changed["cohort"], changed["borrowing_limit_gpus"],
            changed["lending_limit_gpus"], changed["weight"]) == (6, "research", 2, 1.5, 2)
    cleared = _patch(server, "team-a/train", {"borrowing_limit_gpus": None, "cohort": None})
    assert cleared["borrowing_limit_gpus"] is None and cleared["cohort"] is None
    assert cleared["quota_gpus"] == 6 and cleared["lending_limit_gpus"] == 1.5
    assert _patch(server, "team-a/train", {})["quota_gpus"] == 6  # nothing given, nothing changed
    with server.rt.store.read() as session:
        row = session.get(QueueRow, ("team-a", "train"))
        assert row is not None and row.quota_device_milli == 6000 and row.lending_limit_milli == 1500
        actions = [(a.action, a.target, a.detail) for a in session.query(AuditRow).order_by(AuditRow.id)
                   if a.action.startswith("queue.")]
    assert actions[0] == ("queue.create", "team-a/train",
                          "quota=4 cohort=research borrowing_limit=2 lending_limit=1.5 weight=2")
    assert [a[0] for a in actions] == ["queue.create"] + ["queue.update"] * 3


@pytest.mark.parametrize(("body", "status", "starts"), [
    ({"quota_gpus": 1, "lending_limit_gpus": 2}, 422, "Queue team-a/q's lending limit (2) cannot exceed its "
                                                      "quota (1)"),
    ({"borrowing_limit_gpus": 1}, 422, "Queue team-a/q has no quota, so a borrowing or lending limit"),
    ({"quota_gpus": 1, "weight": 0}, 422, ""),
    ({"quota_gpus": -1}, 422, ""),
    ({"quota_gpus": 1, "cohort": "Research"}, 422, ""),
])
def test_bad_settings_are_one_sentence(server: Server, body: dict[str, object], status: int,
                                       starts: str) -> None:
    server.created("/tenants", {"name": "team-a"})
    answer = _queue(server, {"tenant": "team-a", "name": "q", **body}, status)
    message = str(answer["message"])
    assert message.startswith(starts) and message.count(". ") == 0 and "Traceback" not in message


def test_set_checks_the_result_and_the_queue(server: Server) -> None:
    server.created("/tenants", {"name": "team-a"})
    _queue(server, {"tenant": "team-a", "name": "q", "quota_gpus": 2, "lending_limit_gpus": 2})
    refused = _patch(server, "team-a/q", {"quota_gpus": 1}, 422)  # below its lending limit
    assert "lending limit (2) cannot exceed its quota (1)" in str(refused["message"])
    assert "no quota" in str(_patch(server, "team-a/q", {"quota_gpus": None}, 422)["message"])
    both = _patch(server, "team-a/q", {"quota_gpus": None, "lending_limit_gpus": None})
    assert both["quota_gpus"] is None and both["lending_limit_gpus"] is None
    assert "gpupool queue create" in str(_patch(server, "team-a/nope", {"quota_gpus": 1}, 404)["message"])
    assert "No tenant named 'nobody'" in str(_patch(server, "nobody/q", {"quota_gpus": 1}, 404)["message"])
    assert _patch(server, "team-a/q", {"weight": None})["weight"] == 1  # null weight: unchanged


def test_tenant_tokens_cannot_change_queues(server: Server) -> None:
    server.created("/tenants", {"name": "team-a"})
    token = str(server.created("/tokens", {"tenant": "team-a"})["token"])
    answer = server.client.patch(f"{API}/queues/team-a/default", json={"quota_gpus": 9},
                                 headers=server.headers(token))
    assert answer.status_code == 403
    mine = server.client.get(f"{API}/queues", headers=server.headers(token)).json()
    assert [(q["tenant"], q["name"]) for q in mine] == [("team-a", "default")]


# ------------------------------------------------------------------ the SDK


def test_sdk_set_queue_keeps_what_it_is_not_given(server: Server) -> None:
    pool = Client(url="http://testserver", token=server.admin_token, transport=server.client._transport)
    server.created("/tenants", {"name": "team-a"})
    made = pool.create_queue("team-a", "q", 2, cohort="c", lending_limit_gpus=1, weight=3)
    assert (made.quota_gpus, made.cohort, made.lending_limit_gpus, made.weight) == (2, "c", 1, 3)
    assert pool.set_queue("team-a", "q", borrowing_limit_gpus=0.5).quota_gpus == 2
    got = pool.set_queue("team-a", "q", lending_limit_gpus=None, cohort=None)
    assert (got.cohort, got.lending_limit_gpus, got.borrowing_limit_gpus, got.weight) == (None, None, 0.5, 3)
    assert pool.set_quota("team-a", "q", 1).quota_gpus == 1
    with pytest.raises(InvalidInput, match="lending limit"):
        pool.set_queue("team-a", "q", lending_limit_gpus=5)


# ------------------------------------------------------------------ the core's view


def test_read_quota_builds_cohorts_limits_and_tenant_weights(tmp_path: Path) -> None:
    rt, _ = make_runtime(f"sqlite:///{tmp_path / 's.sqlite'}", tmp_path, ManualProvider([node("n0")]))
    for name in ("team-a", "team-b"):
        tenants.create_tenant(rt, ADMIN, TenantCreate(name=name))
    tenants.create_queue(rt, ADMIN, QueueCreate(tenant="team-a", name="x", quota_gpus=2, cohort="c",
                                                borrowing_limit_gpus=1, lending_limit_gpus=0.5, weight=3))
    tenants.create_queue(rt, ADMIN, QueueCreate(tenant="team-b", name="y", quota_gpus=4, cohort="c",
                                                weight=0.5))
    tenants.update_queue(rt, ADMIN, "team-b", "default", QueueUpdate(weight=0.25))
    with rt.store.read() as session:
        config = quotas.read_quota(session.connection())
    by_name = {cq.name: cq for cq in config.cluster_queues}
    x = by_name["team-a/x"]
    assert x.cohort == "c" and x.quotas[DEVICE_MILLI].nominal == 2000
    assert (x.quotas[DEVICE_MILLI].borrowing_limit, x.quotas[DEVICE_MILLI].lending_limit) == (1000, 500)
    assert by_name["team-a/default"].quotas == {}  # no quota: not limited
    assert config.route()[("team-b", "y")] == "team-b/y"
    # a tenant weighs what the largest weight its queues set says; team-a's default queue keeps 1
    assert config.weight("team-a") == 3 and config.weight("team-b") == 0.5 and config.weight("default") == 1
    rt.store.close()


def test_queue_use_splits_a_cohorts_borrowing_over_its_lenders() -> None:
    config = quotas.quota_config([
        quotas.QueueQuota("t", "a", 1000, "c"),
        quotas.QueueQuota("t", "b", 3000, "c", lending_limit_milli=1000),
        quotas.QueueQuota("t", "d", 2000, "c"),
        quotas.QueueQuota("t", "solo", 1000),
    ])
    use = quotas.queue_use(config, {("t", "a"): 3500, ("t", "b"): 2500, ("t", "solo"): 500})
    assert use["t/a"] == quotas.QueueUse(used_milli=3500, borrowed_milli=2500, lent_milli=0)
    # b may lend min(1000, 3000 - 2500) = 500, d all of its 2000: 2500 split 500 / 2000
    assert use["t/b"] == quotas.QueueUse(2500, 0, 500) and use["t/d"] == quotas.QueueUse(0, 0, 2000)
    assert use["t/solo"] == quotas.QueueUse(500, 0, 0)
    odd = quotas.queue_use(config, {("t", "a"): 1001})
    assert odd["t/a"].borrowed_milli == 1 and odd["t/b"].lent_milli + odd["t/d"].lent_milli == 1


def _spec(gpus: float, tenant: str, queue: str) -> WorkloadSpec:
    return WorkloadSpec.model_validate({"command": ["true"], "resources": {"gpus": gpus}, "tenant": tenant,
                                        "queue": queue})


def test_queue_ls_reports_borrowed_lent_and_the_reserved_head(tmp_path: Path) -> None:
    provider = ManualProvider([node("n0", devices=8, model="H100")])
    rt, _ = make_runtime(f"sqlite:///{tmp_path / 's.sqlite'}", tmp_path, provider)
    rt.config = QUIET
    tenants.create_tenant(rt, ADMIN, TenantCreate(name="team-a"))
    tenants.create_queue(rt, ADMIN, QueueCreate(tenant="team-a", name="a", quota_gpus=1, cohort="c"))
    tenants.create_queue(rt, ADMIN, QueueCreate(tenant="team-a", name="b", quota_gpus=3, cohort="c",
                                                lending_limit_gpus=2))
    ids = [workloads.submit(rt, ADMIN, _spec(1, "team-a", "a")).id for _ in range(4)]
    ControlLoop(rt).step()
    assert len(provider.running()) == 3  # a: its own 1 plus the 2 that b may lend
    listed = {q.name: q for q in tenants.list_queues(rt, ADMIN, "team-a")}
    a, b = listed["a"], listed["b"]
    assert (a.used_gpus, a.borrowed_gpus, a.lent_gpus, a.pending, a.running) == (3, 2, 0, 1, 3)
    assert (b.used_gpus, b.borrowed_gpus, b.lent_gpus, b.pending) == (0, 0, 2, 0)
    assert a.reserved_workload is None
    waiting = next(i for i in ids if workloads.get(rt, ADMIN, i).status == "pending")
    with rt.store.write() as session:
        session.execute(update(WorkloadRow).where(WorkloadRow.id == waiting).values(reserved_start_s=1234.5))
    a = next(q for q in tenants.list_queues(rt, ADMIN, "team-a") if q.name == "a")
    assert (a.reserved_workload, a.reserved_start_s) == (waiting, 1234.5)
    rt.store.close()


def test_queue_ls_shows_the_reservation_the_loop_made(tmp_path: Path) -> None:
    provider = ManualProvider([node("n0", devices=4, model="H100")])
    rt, _ = make_runtime(f"sqlite:///{tmp_path / 's.sqlite'}", tmp_path, provider)
    rt.config = PoolConfig.model_validate({"scheduling": {"placement": "first-fit", "preemption": False,
                                                          "backfill": True}})
    loop = ControlLoop(rt)
    spec = {"command": ["true"], "tenant": "default", "queue": "default"}
    running = workloads.submit(rt, ADMIN, WorkloadSpec.model_validate(
        {**spec, "resources": {"gpus": 2}, "time_limit_s": 3600})).id
    loop.step()
    head = workloads.submit(rt, ADMIN, WorkloadSpec.model_validate({**spec, "resources": {"gpus": 4}})).id
    loop.step()
    assert workloads.get(rt, ADMIN, running).status == "running"
    queue = next(q for q in tenants.list_queues(rt, ADMIN, "default") if q.name == "default")
    assert queue.reserved_workload == head and queue.pending == 1
    # the core's run starts at its admission (a launch under load may start the pod seconds later)
    admitted = workloads.get(rt, ADMIN, running).admitted_s
    assert admitted is not None and queue.reserved_start_s == pytest.approx(admitted + 3600, abs=1)
    rt.store.close()


# ------------------------------------------------------------------ a lowered quota, in the core


def _in_queue(w: Workload, queue: str) -> Workload:
    return replace(w, queue=queue)


def _policies(a_quota_milli: int, preemption: bool) -> Policies:
    config = quotas.quota_config([quotas.QueueQuota("t", "a", a_quota_milli, "c"),
                                  quotas.QueueQuota("t", "b", 3000, "c")])
    return Policies(placement="first-fit", ordering="priority-fifo", preemption=preemption, quota=config)


@pytest.mark.parametrize("preemption", [False, True])
def test_a_lowered_quota_keeps_running_work_unless_preemption_reclaims_it(preemption: bool) -> None:
    """a (quota 1) runs 4 devices, 3 borrowed from b (quota 3); a's quota is cut to 0.5 (`queue set`)
    and b asks for one device of its own: the server's view is rebuilt from the store with the new
    quotas, as the loop's keeper does when they change."""
    nodes = cluster(1, devices=8)
    before = _policies(1000, preemption)
    view = ClusterView.empty(nodes, before.quota)
    borrowers = [_in_queue(workload(pod(1), wid=f"a{i}", tenant="t"), "a") for i in range(5)]
    first = cycle_on(view, borrowers, before, 0.0, random.Random(0))
    assert sorted(a.workload_id for a in first.admitted) == ["a0", "a1", "a2", "a3"]  # 1 own + 3 of b's
    by_id = {w.id: w for w in borrowers}
    snapshot = ClusterSnapshot(nodes=tuple(nodes), allocations=tuple(
        Allocation(workload=by_id[a.workload_id], placements=a.placements, start_time_s=0.0)
        for a in first.admitted))
    lowered = _policies(500, preemption)
    rebuilt = ClusterView.from_snapshot(snapshot, lowered.quota)
    own = _in_queue(workload(pod(1), wid="b0", tenant="t", submit_s=10.0), "b")
    result = cycle_on(rebuilt, [by_id["a4"], own], lowered, 100.0, random.Random(0))
    admitted = [a.workload_id for a in result.admitted]
    assert "a4" not in admitted  # a is over its lowered quota
    if preemption:  # b stays within its nominal quota, so it reclaims what a borrowed: the cohort
        # lends 0.5 + 3 and is overdrawn by 0.5, so b's device takes two of a's
        assert admitted == ["b0"]
        assert sorted(p.workload_id for p in result.preempted) == ["a0", "a1"]
        assert all(p.kind == EventKind.PREEMPT and p.reason == Reason.RECLAIMED for p in result.preempted)
        rebuilt.quota.check_invariants()  # back within what the cohort may lend
    else:  # the cohort lends 0.5 + 3 and a holds 4 of it: b waits until a's work ends
        assert admitted == [] and not result.preempted
        assert sorted(rebuilt.running) == ["a0", "a1", "a2", "a3"]
        reasons = {r.workload_id: r.message for r in result.rejected}
        assert "Cohort 'c' has no device_milli left to lend" in reasons["b0"]


# ------------------------------------------------------------------ the configuration's queues


def _runtime(tmp_path: Path, config: PoolConfig) -> Runtime:
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 's.sqlite'}",
                        placement="first-fit")
    return Runtime(settings=settings, store=Store.open(settings.resolved_database_url),
                   provider=ManualProvider([node("n0")]), config=config)


def test_config_queues_are_applied_at_start(tmp_path: Path) -> None:
    config = PoolConfig.model_validate({"queues": [
        {"tenant": "vision", "name": "train", "quota": 16, "cohort": "research", "borrowing_limit": 8,
         "lending_limit": 4},
        {"tenant": "nlp", "quota": 16, "cohort": "research", "weight": 2},
    ]})
    rt = _runtime(tmp_path, config)
    assert bootstrap(rt) is not None
    listed = {f"{q.tenant}/{q.name}": q for q in tenants.list_queues(rt, ADMIN, None)}
    assert set(listed) == {"default/default", "nlp/default", "vision/default", "vision/train"}
    train = listed["vision/train"]
    settings = (train.quota_gpus, train.cohort, train.borrowing_limit_gpus, train.lending_limit_gpus)
    assert settings == (16, "research", 8, 4)
    assert (listed["nlp/default"].quota_gpus, listed["nlp/default"].weight) == (16, 2)
    # an admin changes a queue the file names: the next start puts the file's values back
    tenants.update_queue(rt, ADMIN, "vision", "train", QueueUpdate(quota_gpus=2, lending_limit_gpus=1,
                                                                     cohort=None))
    tenants.create_queue(rt, ADMIN, QueueCreate(tenant="vision", name="adhoc", quota_gpus=1))
    assert quotas.apply_config_queues(rt) == ["vision/train"]
    assert quotas.apply_config_queues(rt) == []  # nothing left to change
    listed = {f"{q.tenant}/{q.name}": q for q in tenants.list_queues(rt, ADMIN, None)}
    assert (listed["vision/train"].quota_gpus, listed["vision/train"].cohort) == (16, "research")
    assert listed["vision/adhoc"].quota_gpus == 1  # queues the file does not name are left alone
    with rt.store.read() as session:
        assert session.get(TenantRow, "nlp") is not None
        made = [(a.action, a.target, a.remote) for a in session.query(AuditRow).order_by(AuditRow.id)
                if a.remote == "configuration"]
    assert made[:2] == [("tenant.create", "vision", "configuration"),
                        ("queue.create", "vision/train", "configuration")]
    assert made[-1] == ("queue.update", "vision/train", "configuration")
    rt.store.close()


@pytest.mark.parametrize(("queue", "says"), [
    ("{tenant: Vision, quota: 1}", "line 2: queues[0].tenant: 'Vision' cannot be stored: a name may hold "
                                   "lower-case"),
    ("{tenant: vision, cohort: Big_One, quota: 1}", "queues[0].cohort: 'Big_One' cannot be stored"),
    ("{tenant: vision, borrowing_limit: 1}", "line 2: queues[0]: queue vision/default has no quota"),
])
def test_a_config_queue_the_store_cannot_hold_is_refused_with_the_file(queue: str, says: str) -> None:
    # `gpupool up` and `gpupool config check` both read the file with load_config: what one refuses
    # the other does too, before anything is stored
    with pytest.raises(InvalidInput, match=re.escape(says)):
        parse_config(f"queues:\n  - {queue}\n", "pool.yaml")


def test_a_queue_in_a_cohort_may_take_work_larger_than_its_own_quota(server: Server) -> None:
    """Submit does not refuse what the cohort could lend; the core admits it by borrowing."""
    client, h = server.client, server.headers()
    for tenant, quota in (("borrower", 1), ("lender", 7)):
        server.created("/tenants", {"name": tenant})
        answer = client.patch(f"/api/v1/queues/{tenant}/default",
                              json={"quota_gpus": quota, "cohort": "shared"}, headers=h)
        assert answer.status_code == 200, answer.text
    big = client.post("/api/v1/workloads", json={"command": ["x"], "tenant": "borrower",
                                                 "resources": {"gpus": 2}}, headers=h)
    assert big.status_code == 201, big.text
    server.wait_for(lambda: server.status(big.json()["id"]) == "running")
