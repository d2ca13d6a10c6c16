"""Issue 38 item 3 on the server: dependencies (afterok, afterany, afternotok, singleton), hold and
release, update while pending, requeue, and what a hostile tenant can and cannot do with them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import ManualProvider

from conftest import Server, make_runtime
from factories import node
from gpupool.api.dependency_spec import parse_dependency
from gpupool.api.tenants import QueueCreate, TenantCreate, TenantUpdate
from gpupool.api.workloads import WorkloadSpec, WorkloadUpdate
from gpupool.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    PriorityNotAllowed,
    QuotaExceeded,
    TooManyPending,
)
from gpupool.server.auth import Principal
from gpupool.server.loops.control import ControlLoop
from gpupool.server.loops.snapshot import WorkloadCache, load
from gpupool.server.runtime import Runtime
from gpupool.server.services import audit, jobs, tenants, workloads

ADMIN = Principal("admin", None)
A = Principal("ta", "team-a", max_priority=5)
B = Principal("tb", "team-b", max_priority=5)


@pytest.fixture
def pool(tmp_path: Path, db_url: str) -> Iterator[tuple[Runtime, ManualProvider, ControlLoop]]:
    """On SQLite and on a real PostgreSQL (where transactions run concurrently), when one starts."""
    provider = ManualProvider([node("n0", devices=2, model="H100")])
    rt, _ = make_runtime(db_url, tmp_path, provider)
    for name in ("team-a", "team-b"):
        tenants.create_tenant(rt, ADMIN, TenantCreate(name=name, unix_user=None))
    yield rt, provider, ControlLoop(rt)
    rt.store.close()


Pool = tuple[Runtime, ManualProvider, ControlLoop]


def _submit(rt: Runtime, who: Principal = A, gpus: float = 1, **extra: object) -> str:
    spec = WorkloadSpec.model_validate({"command": ["true"], "resources": {"gpus": gpus}, **extra})
    return workloads.submit(rt, who, spec).id


def _status(rt: Runtime, wid: str) -> str:
    return workloads.get(rt, ADMIN, wid).status


def _pod(rt: Runtime, wid: str) -> str:
    return workloads.get(rt, ADMIN, wid).pods[0].id


def _finish(pool: Pool, wid: str, code: int = 0, steps: int = 3) -> None:
    rt, provider, loop = pool
    provider.finish(_pod(rt, wid), code)
    for _ in range(steps):
        loop.step()


# ---- the expression ---------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["afterok", "afterok:", "after:w-1", "singleton:w-1", "afterok:w 1", ""])
def test_malformed_dependencies_name_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match="afterok:ID"):
        parse_dependency(text)


def test_the_expression_is_stored_in_one_written_form() -> None:
    spec = WorkloadSpec.model_validate({"command": ["true"], "dependency": " AfterOK:w-1:w-2 , singleton"})
    assert spec.dependency == "afterok:w-1:w-2,singleton"


# ---- Slurm's meanings -------------------------------------------------------------------------

def test_afterok_waits_for_success_and_the_core_never_sees_it(pool: Pool) -> None:
    rt, _, loop = pool
    first = _submit(rt)
    then = _submit(rt, dependency=f"afterok:{first}")
    shown = workloads.get(rt, A, then)
    assert (shown.reason, shown.waiting_on) == ("waiting_for_dependency", f"afterok:{first}")
    assert shown.message == f"Waits for afterok:{first}."
    loop.step()
    assert (_status(rt, first), _status(rt, then)) == ("running", "pending")  # a free device left idle
    _finish(pool, first)
    assert _status(rt, then) == "running"
    reasons = [e.reason for e in workloads.events(rt, A, then)]
    assert reasons[:3] == ["submitted", "waiting_for_dependency", "dependency_met"]


def test_afterok_on_failed_work_cancels_with_the_reason(pool: Pool) -> None:
    rt, _, loop = pool
    first = _submit(rt)
    then = _submit(rt, dependency=f"afterok:{first}")
    after_then = _submit(rt, dependency=f"afterok:{then}")  # cascades
    loop.step()
    _finish(pool, first, code=3)
    assert _status(rt, first) == "failed"
    for wid in (then, after_then):
        shown = workloads.get(rt, A, wid)
        assert (shown.status, shown.reason, shown.reason_final) == ("cancelled", "dependency_never_satisfied",
                                                                     True)
    assert f"({first} did not succeed)" in workloads.get(rt, A, then).message


def test_kill_on_invalid_dep_no_keeps_it_pending_with_the_reason(pool: Pool) -> None:
    rt, _, loop = pool
    first = _submit(rt)
    then = _submit(rt, dependency=f"afterok:{first}", kill_on_invalid_dep=False)
    loop.step()
    _finish(pool, first, code=1)
    shown = workloads.get(rt, A, then)
    assert (shown.status, shown.reason) == ("pending", "dependency_never_satisfied_kept")
    loop.step()
    assert _status(rt, then) == "pending"  # never placed, though a device is free


def test_afterany_and_afternotok(pool: Pool) -> None:
    rt, _, loop = pool
    first = _submit(rt)
    any_ = _submit(rt, dependency=f"afterany:{first}")
    notok = _submit(rt, dependency=f"afternotok:{first}")
    loop.step()
    _finish(pool, first, code=0)
    assert _status(rt, any_) == "running"
    shown = workloads.get(rt, A, notok)
    assert (shown.status, shown.reason) == ("cancelled", "dependency_never_satisfied")
    failing = _submit(rt, gpus=0.5)
    cleanup = _submit(rt, gpus=0.5, dependency=f"afternotok:{failing}")
    loop.step()
    _finish(pool, failing, code=2)
    assert _status(rt, cleanup) == "running"


def test_afterok_on_an_array_waits_for_every_task(pool: Pool) -> None:
    rt, _, loop = pool
    array = workloads.submit(rt, A, WorkloadSpec.model_validate(
        {"command": ["true"], "resources": {"gpus": 1}, "array": "0-1"})).id
    then = _submit(rt, dependency=f"afterok:{array}")
    loop.step()
    _finish(pool, f"{array}_0")
    assert _status(rt, then) == "pending"
    _finish(pool, f"{array}_1")
    assert _status(rt, then) == "running"


def test_singleton_runs_one_of_a_name_at_a_time_in_order(pool: Pool) -> None:
    rt, _, loop = pool
    ids = [_submit(rt, gpus=0.5, name="nightly", dependency="singleton") for _ in range(3)]
    other = _submit(rt, B, gpus=0.5, name="nightly", dependency="singleton")  # another tenant's name
    loop.step()
    assert [_status(rt, w) for w in ids] == ["running", "pending", "pending"]
    assert _status(rt, other) == "running"
    _finish(pool, ids[0])
    assert [_status(rt, w) for w in ids] == ["succeeded", "running", "pending"]
    with pytest.raises(InvalidInput, match="give the workload a --name"):
        _submit(rt, dependency="singleton")


# ---- bad and hostile input ----------------------------------------------------------------------

def test_another_tenants_id_reads_exactly_as_an_unknown_one(pool: Pool) -> None:
    rt, _, _ = pool
    theirs = _submit(rt, B)
    with pytest.raises(NotFound) as foreign:
        _submit(rt, A, dependency=f"afterok:{theirs}")
    with pytest.raises(NotFound) as unknown:
        _submit(rt, A, dependency="afterok:w-000000000000")
    assert foreign.value.message.replace(theirs, "X") == unknown.value.message.replace("w-000000000000", "X")
    for act in (jobs.hold, jobs.release, jobs.requeue):
        with pytest.raises(NotFound):
            act(rt, A, theirs)
    with pytest.raises(NotFound):
        jobs.update(rt, A, theirs, WorkloadUpdate(priority=1))
    assert workloads.get(rt, B, theirs).held == ""


# ---- hold, release, update, requeue --------------------------------------------------------------

def test_hold_keeps_it_from_the_scheduler_until_released(pool: Pool) -> None:
    rt, _, loop = pool
    wid = _submit(rt)
    held = jobs.hold(rt, A, wid)
    assert (held.held, held.reason) == ("user", "held")
    loop.step()
    assert _status(rt, wid) == "pending"
    released = jobs.release(rt, A, wid)
    assert (released.held, released.reason) == ("", "released")
    loop.step()
    assert _status(rt, wid) == "running"
    with pytest.raises(Conflict, match="only pending work can be held"):
        jobs.hold(rt, A, wid)


def test_an_admins_hold_only_the_admin_releases_and_it_is_audited(pool: Pool) -> None:
    rt, _, _ = pool
    wid = _submit(rt)
    assert jobs.hold(rt, ADMIN, wid).held == "admin"
    assert jobs.hold(rt, A, wid).held == "admin"  # the tenant cannot weaken it
    with pytest.raises(Forbidden, match="held by the admin"):
        jobs.release(rt, A, wid)
    jobs.release(rt, ADMIN, wid)
    actions = [e.action for e in audit.entries(rt, ADMIN, None, 100)]
    assert "workload.hold" in actions and "workload.release" in actions


def test_a_hold_committed_after_the_cycle_read_wins_over_its_admission(pool: Pool) -> None:
    rt, _, loop = pool
    wid = _submit(rt)
    real_load = loop.scheduler.cycle.__globals__["load"]

    def load_then_hold(*args: object, **kwargs: object) -> object:
        view = real_load(*args, **kwargs)
        jobs.hold(rt, A, wid)  # between the read and the admission's compare-and-set
        return view

    loop.scheduler.cycle.__globals__["load"] = load_then_hold
    try:
        loop.step()
    finally:
        loop.scheduler.cycle.__globals__["load"] = real_load
    shown = workloads.get(rt, A, wid)
    assert (shown.status, shown.held, shown.pods) == ("pending", "user", [])


def test_update_while_pending_and_refused_once_admitted(pool: Pool) -> None:
    rt, _, loop = pool
    blocker = _submit(rt, gpus=2)
    wid = _submit(rt, gpus=1, replicas=1)
    loop.step()
    assert _status(rt, wid) == "pending"
    updated = jobs.update(rt, A, wid, WorkloadUpdate(priority=5, gpus=0.5, replicas=2, time_limit_s=60))
    assert (updated.priority, updated.spec.resources.gpus, updated.spec.replicas, updated.time_limit_s) == (
        5, 0.5, 2, 60)
    assert "gpus 1 -> 0.5; replicas 1 -> 2" in updated.message
    with pytest.raises(PriorityNotAllowed):
        jobs.update(rt, A, wid, WorkloadUpdate(priority=6))
    with pytest.raises(InvalidInput):
        jobs.update(rt, A, wid, WorkloadUpdate(gpus=64))  # no node could ever hold it
    _finish(pool, blocker)
    shown = workloads.get(rt, A, wid)
    assert shown.status == "running" and len(shown.pods) == 2  # placed with its new shape
    assert {p.slices[0].compute_milli for p in shown.pods} == {500}
    with pytest.raises(Conflict, match=f"Workload {wid} is running; only pending work can be updated"):
        jobs.update(rt, A, wid, WorkloadUpdate(priority=1))


def test_requeue_of_running_work_stops_it_and_places_it_again(pool: Pool) -> None:
    rt, provider, loop = pool
    wid = _submit(rt)
    loop.step()
    first_pod = _pod(rt, wid)
    requeued = jobs.requeue(rt, A, wid, hold_after=True)
    assert (requeued.status, requeued.held) == ("pending", "user")
    assert provider.stopped == [first_pod]
    for _ in range(3):
        loop.step()
    assert _status(rt, wid) == "pending"
    jobs.release(rt, A, wid)
    loop.step()
    shown = workloads.get(rt, A, wid)
    assert (shown.status, shown.attempt) == ("running", 2)
    assert "requeued_by_user" in [e.reason for e in workloads.events(rt, A, wid)]
    with pytest.raises(Conflict, match="only admitted or running work can be requeued"):
        jobs.requeue(rt, A, _submit(rt, dependency=f"afterok:{wid}"))


def _two_running_at_a_limit_of_one(pool: Pool) -> tuple[str, str]:
    """Team-a with max_pending 1 and two workloads running, each submitted while none waited."""
    rt, _, loop = pool
    tenants.update_tenant(rt, ADMIN, "team-a", TenantUpdate(max_pending=1))
    first = _submit(rt)
    loop.step()
    second = _submit(rt)
    loop.step()
    assert (_status(rt, first), _status(rt, second)) == ("running", "running")
    return first, second


def test_a_tenants_requeue_is_refused_at_its_max_pending_and_the_admins_is_not(pool: Pool) -> None:
    """A requeue gives the tenant one more pending workload: at its max_pending it is refused as a
    submission is (429), so running work cannot be requeued past the limit; once room appears it
    goes through, and the admin's requeue is not limited."""
    rt, provider, _ = pool
    first, second = _two_running_at_a_limit_of_one(pool)
    waiting = _submit(rt, gpus=2)  # the pool is full: it waits, the tenant's one pending workload
    with pytest.raises(TooManyPending, match=f"^Tenant team-a already has 1 pending workload and its limit "
                                             f"is 1, so {first} was not requeued; wait until"):
        jobs.requeue(rt, A, first)
    assert _status(rt, first) == "running" and provider.stopped == []
    workloads.cancel(rt, A, waiting)
    assert jobs.requeue(rt, A, first).status == "pending"  # room again
    with pytest.raises(TooManyPending):
        jobs.requeue(rt, A, second)
    assert jobs.requeue(rt, ADMIN, second).status == "pending"


def test_two_requeues_at_once_cannot_both_take_the_last_pending_place(
        pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each requeue counts the tenant's pending work under its tenant row's lock (PostgreSQL runs
    the two transactions at once): with one place left, one requeue goes through and the other is
    refused, even with each held for 0.3 s between its count and its write."""
    rt = pool[0]
    first, second = _two_running_at_a_limit_of_one(pool)
    visible = workloads._visible

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)  # after the count, before the row is written
        return visible(*args, **kwargs)

    monkeypatch.setattr(workloads, "_visible", slow)
    outcomes: list[str] = []

    def requeue(wid: str) -> None:
        try:
            outcomes.append(jobs.requeue(rt, A, wid).status)
        except TooManyPending:
            outcomes.append("refused")

    threads = [threading.Thread(target=requeue, args=(wid,)) for wid in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["pending", "refused"], outcomes
    assert sorted([_status(rt, first), _status(rt, second)]) == ["pending", "running"]


def test_the_schedulers_read_leaves_out_held_and_waiting_work(pool: Pool) -> None:
    """Filtered in the query, before the core: the core's cycle never weighs them (10,000 pending
    with half of them waiting cost what the other half costs; bench/dependencies.py measures it)."""
    rt, _, _ = pool
    plain = _submit(rt)
    held = _submit(rt)
    jobs.hold(rt, A, held)
    waiting = _submit(rt, dependency=f"afterok:{plain}")
    view = load(rt, WorkloadCache())
    assert [w.id for w in view.pending] == [plain]
    jobs.release(rt, A, held)
    assert {w.id for w in load(rt, WorkloadCache()).pending} == {plain, held}
    assert waiting not in {w.id for w in load(rt, WorkloadCache()).pending}


def test_update_keeps_within_the_queues_quota_as_submit_does(pool: Pool) -> None:
    rt, _, _ = pool
    tenants.create_queue(rt, ADMIN, QueueCreate(tenant="team-a", name="small", quota_gpus=1))
    wid = _submit(rt, gpus=1, queue="small", dependency=f"afterok:{_submit(rt)}")  # stays pending
    with pytest.raises(QuotaExceeded, match="queue team-a/small may hold at most 1"):
        jobs.update(rt, A, wid, WorkloadUpdate(replicas=2))
    assert workloads.get(rt, A, wid).spec.replicas == 1


def test_over_http_a_bad_dependency_is_one_sentence(shared_server: Server) -> None:
    post = shared_server.client.post
    bad = post("/api/v1/workloads", json={"command": ["true"], "dependency": "afterok:"},
               headers=shared_server.headers())
    assert bad.status_code == 422
    forms = "afterok:ID[:ID...], afterany:ID[:ID...], afternotok:ID[:ID...] or singleton"
    assert forms in bad.json()["message"]
    unknown = post("/api/v1/workloads", json={"command": ["true"], "dependency": "afterok:w-000000000000"},
                   headers=shared_server.headers())
    assert (unknown.status_code, unknown.json()["message"]) == (
        404, "No workload 'w-000000000000' to depend on; list yours with `gpupool ls`.")
    running = post("/api/v1/workloads/w-000000000000/requeue", headers=shared_server.headers())
    assert running.status_code == 404
    patched = shared_server.client.patch("/api/v1/workloads/w-000000000000", json={"command": ["sh"]},
                                         headers=shared_server.headers())
    assert patched.status_code == 422  # only priority, time limit, gpus and replicas may change
