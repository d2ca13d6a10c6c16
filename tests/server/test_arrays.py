"""Issue 12 item 6: array jobs on the server: the expression, one submission of many tasks (max_pending
all or nothing), listing and cancelling an array, and the %N throttle the loop asks for."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakes import ManualProvider
from sqlalchemy import update

from conftest import Server, make_runtime
from factories import node
from gpupool.api.array_spec import MAX_ARRAY_TASKS, compact, parse_array
from gpupool.api.tenants import TenantCreate
from gpupool.api.workloads import WorkloadSpec
from gpupool.errors import InvalidInput, NotFound, TooManyPending
from gpupool.server.auth import Principal
from gpupool.server.loops.control import ControlLoop
from gpupool.server.orm import WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import listing, tenants, workloads
from gpupool.server.services.arrays import throttled

ADMIN = Principal("admin", None)
MakeRt = Callable[..., tuple[Runtime, ManualProvider]]


def _spec(gpus: float = 0.25, **extra: object) -> WorkloadSpec:
    return WorkloadSpec.model_validate({"command": ["true"], "resources": {"gpus": gpus}, **extra})


@pytest.fixture
def make_rt(tmp_path: Path) -> Iterator[MakeRt]:
    made: list[Runtime] = []

    def make(url: str = "", devices: int = 8) -> tuple[Runtime, ManualProvider]:
        provider = ManualProvider([node("n0", devices=devices, model="H100")])
        rt, _ = make_runtime(url or f"sqlite:///{tmp_path / 'store.sqlite'}", tmp_path, provider)
        made.append(rt)
        return rt, provider

    yield make
    for rt in made:
        rt.store.close()


def _tasks(rt: Runtime, array_id: str, who: Principal = ADMIN) -> list[workloads.WorkloadOut]:
    items = listing.list_workloads(rt, who, array_id=[array_id], limit=1000, full=True).items
    assert all(isinstance(item, workloads.WorkloadOut) for item in items)
    return [item for item in items if isinstance(item, workloads.WorkloadOut)]


def _set_status(rt: Runtime, ids: list[str], status: str) -> None:
    with rt.store.write() as session:
        session.execute(update(WorkloadRow).where(WorkloadRow.id.in_(ids)).values(status=status))


# ---- the expression -------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "indexes", "limit"), [
    ("0-3", (0, 1, 2, 3), None),
    ("1,3,5-7", (1, 3, 5, 6, 7), None),
    ("0-15:4", (0, 4, 8, 12), None),
    ("0-999%50", tuple(range(1000)), 50),
    ("3,1,3,2", (1, 2, 3), None),  # sorted, duplicates once (as Slurm does)
    ("0-2%10", (0, 1, 2), 3),  # a limit above the task count is the task count
    ("99999", (99999,), None),
])
def test_slurm_array_expressions(text: str, indexes: tuple[int, ...], limit: int | None) -> None:
    parsed = parse_array(text)
    assert (parsed.indexes, parsed.limit) == (indexes, limit)


@pytest.mark.parametrize(("text", "says"), [
    ("", "must list task indexes"),
    ("5-1", "ends before it starts"),
    ("0-9%0", "at least 1"),
    ("a-b", "is not an index"),
    ("1-", "is not an index"),
    ("0-9:0", "step"),
    ("100000", "beyond the highest task index, 99999"),
    (f"0-{MAX_ARRAY_TASKS}", f"one array holds at most {MAX_ARRAY_TASKS}"),
    ("0-4999,5000-9999,10000", f"one array holds at most {MAX_ARRAY_TASKS}"),
    ("１", "is not an index"),  # a full-width digit
])
def test_bad_expressions_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_array(text)


def test_compact_ranges() -> None:
    assert compact([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert compact([]) == ""


def test_bad_array_over_http_is_one_sentence_422(shared_server: Server) -> None:
    answer = shared_server.client.post("/api/v1/workloads", headers=shared_server.headers(),
                                       json={"command": ["true"], "array": "9-2"})
    assert answer.status_code == 422
    message = answer.json()["message"]
    assert message == ("Field 'array' has the range '9-2', which ends before it starts; write it low-high.")


# ---- one submission, many tasks ----------------------------------------------------------------------

def test_an_array_is_one_submission_of_tasks_in_index_order(make_rt: MakeRt) -> None:
    rt, _ = make_rt()
    created = workloads.submit(rt, ADMIN, _spec(array="8-11,20%2", time_limit_s=60))
    assert created.tasks == 5 and "_" not in created.id
    tasks = _tasks(rt, created.id)
    assert [t.id for t in tasks] == [f"{created.id}_{i}" for i in (8, 9, 10, 11, 20)]
    assert all(len(t.id) <= 64 for t in tasks)
    for task in tasks:
        assert (task.array_id, task.array_limit, task.status) == (created.id, 2, "pending")
        assert task.spec.array_index == task.array_index  # the loop sets GPUPOOL_ARRAY_INDEX from it
        assert task.spec.array is None and task.spec.time_limit_s == 60
        assert [e.reason for e in workloads.events(rt, ADMIN, task.id)] == ["submitted"]
    submitted = [t.submit_s for t in tasks]
    assert submitted == sorted(submitted) and len(set(submitted)) == 5  # FIFO order is index order
    assert {w.id for w in rt.submitted} == {t.id for t in tasks}  # handed to the scheduler's cache


def test_a_lone_workload_is_no_array(make_rt: MakeRt) -> None:
    rt, _ = make_rt()
    created = workloads.submit(rt, ADMIN, _spec())
    assert created.tasks is None
    shown = workloads.get(rt, ADMIN, created.id)
    assert (shown.array_id, shown.array_index, shown.array_limit) == (None, None, None)


def test_array_index_is_the_servers_to_set(make_rt: MakeRt) -> None:
    rt, _ = make_rt()
    with pytest.raises(InvalidInput, match="array_index is set by the server"):
        workloads.submit(rt, ADMIN, _spec(array_index=3))


def test_max_pending_applies_to_the_whole_array(make_rt: MakeRt) -> None:
    rt, _ = make_rt()
    tenants.create_tenant(rt, ADMIN, TenantCreate(name="team-a", unix_user=None, max_pending=5))
    team = Principal("t", "team-a", max_priority=0)
    with pytest.raises(TooManyPending, match="This array's 6 tasks would take tenant team-a to 6 pending"):
        workloads.submit(rt, team, _spec(array="0-5"))
    assert listing.list_workloads(rt, team).total == 0  # all or nothing
    workloads.submit(rt, team, _spec(array="0-4"))
    with pytest.raises(TooManyPending, match="already has 5 pending workloads"):
        workloads.submit(rt, team, _spec())


# ---- listing and cancelling ---------------------------------------------------------------------------

def test_cancel_an_array_stops_what_runs_and_cancels_the_rest(make_rt: MakeRt) -> None:
    rt, provider = make_rt(devices=1)
    created = workloads.submit(rt, ADMIN, _spec(gpus=1, array="8-11"))
    ControlLoop(rt).step()
    placed = [t for t in _tasks(rt, created.id) if t.status != "pending"]
    assert [t.id for t in placed] == [f"{created.id}_8"]  # lowest index first, not the id's text order
    done = workloads.cancel_array(rt, ADMIN, created.id)
    assert (done.cancelled, done.finished) == (4, 0)
    assert provider.stopped == [placed[0].pods[0].id]
    tasks = _tasks(rt, created.id)
    assert {t.status for t in tasks} == {"cancelled"} and all(t.finished_s for t in tasks)
    assert all(workloads.events(rt, ADMIN, t.id)[-1].reason == "cancelled_by_user" for t in tasks)
    again = workloads.cancel_array(rt, ADMIN, created.id)
    assert (again.cancelled, again.finished) == (0, 4)


def test_another_tenants_array_is_not_found(make_rt: MakeRt) -> None:
    rt, _ = make_rt()
    tenants.create_tenant(rt, ADMIN, TenantCreate(name="team-b", unix_user=None))
    created = workloads.submit(rt, ADMIN, _spec(array="0-2"))
    other = Principal("t", "team-b", max_priority=0)
    with pytest.raises(NotFound, match="No array"):
        workloads.cancel_array(rt, other, created.id)
    assert listing.list_workloads(rt, other, array_id=[created.id]).total == 0
    assert {t.status for t in _tasks(rt, created.id)} == {"pending"}


def test_listing_takes_arrays_and_workloads_together(make_rt: MakeRt) -> None:
    rt, _ = make_rt()
    first = workloads.submit(rt, ADMIN, _spec(array="0-1")).id
    lone = workloads.submit(rt, ADMIN, _spec()).id
    workloads.submit(rt, ADMIN, _spec(array="0-1"))  # not asked for
    page = listing.list_workloads(rt, ADMIN, array_id=[first], workload_id=[lone])
    assert sorted(w.id for w in page.items) == sorted([f"{first}_0", f"{first}_1", lone])


# ---- the %N throttle -------------------------------------------------------------------------------

def test_throttle_keeps_the_lowest_indexes_eligible(db_url: str, make_rt: MakeRt) -> None:
    rt, _ = make_rt(db_url)
    capped = workloads.submit(rt, ADMIN, _spec(array="0-5%2")).id
    free = workloads.submit(rt, ADMIN, _spec(array="0-3")).id
    lone = workloads.submit(rt, ADMIN, _spec()).id
    ids = [w.id for w in listing.list_workloads(rt, ADMIN).items]

    def waiting(pending: list[str]) -> set[str]:
        with rt.store.read() as session:
            return throttled(session.connection(), pending)

    task = [f"{capped}_{i}" for i in range(6)]
    assert waiting(ids) == set(task[2:])  # none holds slices: room for 0 and 1
    _set_status(rt, [task[0]], "admitted")
    assert waiting([i for i in ids if i != task[0]]) == set(task[2:])  # 0 holds, 1 may start
    _set_status(rt, [task[1]], "running")
    assert waiting([i for i in ids if i not in task[:2]]) == set(task[2:])  # 2 holding: none may
    _set_status(rt, [task[0]], "succeeded")
    assert waiting(task[2:]) == set(task[3:])  # one finished: the next lowest goes
    assert waiting(task[4:]) == {task[5]}  # among the ids asked about, the lowest first
    assert waiting([f"{free}_{i}" for i in range(4)] + [lone]) == set()  # no limit, no array
    assert waiting([]) == set()


def test_a_throttled_array_does_not_fill_the_cycles_read(db_url: str, make_rt: MakeRt) -> None:
    """A full pass reads the first N pending workloads in the core's order; an array of thousands of
    tasks limited to one at a time used to fill that read with tasks that could not start, ahead of
    every other tenant's work, which then waited unread while the pool stood idle. Each limited
    array now brings at most its limit of tasks (its lowest indexes) into the read."""
    from gpupool.server.loops.snapshot import WorkloadCache, load

    rt, _ = make_rt(db_url)
    tenants.create_tenant(rt, ADMIN, TenantCreate(name="other"))
    capped = workloads.submit(rt, ADMIN, _spec(array="0-49%2")).id
    free = workloads.submit(rt, ADMIN, _spec(array="0-3")).id
    theirs = workloads.submit(rt, Principal("t", "other"), _spec()).id
    view = load(rt, WorkloadCache(), limit=10)
    assert [w.id for w in view.pending] == [f"{capped}_0", f"{capped}_1", *(f"{free}_{i}" for i in range(4)),
                                            theirs]
    _set_status(rt, [f"{capped}_0"], "running")  # one holds slices: room for one more, the next lowest
    view = load(rt, WorkloadCache(), limit=10)
    assert [w.id for w in view.pending][:1] == [f"{capped}_1"] and theirs in {w.id for w in view.pending}
