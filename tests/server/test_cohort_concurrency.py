"""Concurrent submitters into two queues of one cohort never hold more than their quota plus what
the cohort may lend: checked from the store at every launch, before and after a quota is lowered
while work runs (running work is not stopped for it: preemption is off here, see
test_queues_cohorts for what reclaim does)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from fakes import ManualProvider
from sqlalchemy import select

from factories import node
from gpupool.config import PoolConfig
from gpupool.pods import PodLaunch
from gpupool.server.orm import PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import quotas
from gpupool.server.states import ACTIVE_POD_STATES
from live import live_server

TENANT = "team-a"
ADMISSION_ONLY = PoolConfig.model_validate({"scheduling": {
    "placement": "first-fit", "ordering": "priority-fifo", "preemption": False, "backfill": False}})


class CohortWatch(ManualProvider):
    """At each launch, reads what every queue holds from the store and notes any limit broken."""

    def __init__(self) -> None:
        super().__init__([node("n0", devices=8, model="H100")])
        self.rt: Runtime | None = None
        self.problems: list[str] = []
        self.peak_borrowed_milli = 0
        self.only_launching_queue = False
        """After a quota is lowered, queues may sit above it until their work ends: then only the
        queue that just grew is held to its limits."""

    def launch(self, pod: PodLaunch) -> None:
        # Measured before the pod counts as running: the test waits on running() and then reads the
        # peak, which must already include this launch (measured after, a loaded machine let the test
        # read the peak between the two and see 2,500 for 3,000).
        if self.rt is not None:
            self.problems += check(self.rt, pod.workload_id if self.only_launching_queue else None)
            self.peak_borrowed_milli = max(self.peak_borrowed_milli, max_borrowed(self.rt))
        super().launch(pod)


def _held(rt: Runtime) -> tuple[dict[str, quotas.QueueQuota], dict[str, int]]:
    with rt.store.read() as session:
        conn = session.connection()
        settings = {q.name: q for q in quotas.read_queues(conn) if q.tenant == TENANT}
        held = {name: 0 for name in settings}
        active = (select(WorkloadRow.queue, PodRow.slices)
                  .join(WorkloadRow, WorkloadRow.id == PodRow.workload_id)
                  .where(PodRow.status.in_(ACTIVE_POD_STATES), WorkloadRow.tenant == TENANT))
        for queue, slices in conn.execute(active):
            held[queue] += sum(s["compute_milli"] for s in slices)
    return settings, held


def max_borrowed(rt: Runtime) -> int:
    settings, held = _held(rt)
    return max(held[n] - (q.quota_milli or 0) for n, q in settings.items() if q.cohort)


def check(rt: Runtime, launching: str | None) -> list[str]:
    """The limits, written out from their definitions (not through the core's tracker): each queue
    holds at most nominal + min(borrowing limit, what the others may lend), and the cohort lends at
    most what its members allow (the sum beyond their guaranteed parts)."""
    settings, held = _held(rt)
    members = {n: q for n, q in settings.items() if q.cohort == "c"}
    lendable = {n: q.quota_milli if q.lending_limit_milli is None else q.lending_limit_milli
                for n, q in members.items()}
    guaranteed = {n: (q.quota_milli or 0) - (lendable[n] or 0) for n, q in members.items()}
    queues = list(members)
    if launching is not None:
        with rt.store.read() as session:
            queues = [session.scalars(select(WorkloadRow.queue).where(WorkloadRow.id == launching)).one()]
    problems = []
    for name in queues:
        q = members[name]
        others = sum(v or 0 for n, v in lendable.items() if n != name)
        limit = math.inf if q.borrowing_limit_milli is None else q.borrowing_limit_milli
        ceiling = (q.quota_milli or 0) + min(limit, others)
        if held[name] > ceiling:
            problems.append(f"{name} holds {held[name]} > {ceiling} ({held})")
        if held[name] > guaranteed[name]:
            lent = sum(max(0, held[n] - guaranteed[n]) for n in members)
            if lent > sum(v or 0 for v in lendable.values()):
                problems.append(f"cohort lends {lent} > {sum(v or 0 for v in lendable.values())} ({held})")
    return problems


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in time: {what}")
        time.sleep(0.02)


def test_concurrent_cohort_admission_stays_within_quota_plus_lending(tmp_path: Path) -> None:
    provider = CohortWatch()
    with live_server(tmp_path, provider, config=ADMISSION_ONLY) as srv:
        provider.rt = srv.rt
        auth = {"Authorization": f"Bearer {srv.admin_token}"}
        admin = httpx.Client(base_url=srv.url + "/api/v1", headers=auth)
        admin.post("/tenants", json={"name": TENANT}).raise_for_status()
        # a: nominal 2, lends at most 1; b: nominal 3, borrows at most 1. a may reach 2 + 3, b 3 + 1.
        for body in ({"name": "a", "quota_gpus": 2, "lending_limit_gpus": 1},
                     {"name": "b", "quota_gpus": 3, "borrowing_limit_gpus": 1}):
            admin.post("/queues", json={"tenant": TENANT, "cohort": "c", **body}).raise_for_status()

        def submit(queue: str, count: int) -> list[str]:
            body = {"command": ["x"], "tenant": TENANT, "queue": queue, "resources": {"gpus": 0.5}}
            with httpx.Client(base_url=srv.url + "/api/v1", headers=auth) as c:
                return [c.post("/workloads", json=body).raise_for_status().json()["id"] for _ in range(count)]

        def succeeded() -> int:
            return int(admin.get("/workloads", params={"status": "succeeded", "limit": 1}).json()["total"])

        # 1. six concurrent submitters (a-heavy, so a borrows), pods ending one at a time
        threads = [threading.Thread(target=submit, args=("a" if i < 4 else "b", 8)) for i in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 90
        while (succeeded() < 48 or any(t.is_alive() for t in threads)) and time.monotonic() < deadline:
            provider.problems += check(srv.rt, None)
            for pod_id in provider.running()[:1]:
                provider.finish(pod_id, 0)
            time.sleep(0.02)
        for t in threads:
            t.join()
        assert succeeded() == 48 and len(provider.launched) == 48
        assert provider.problems == []
        assert provider.peak_borrowed_milli > 0  # borrowing happened, so the cohort limits were exercised

        # 2. a borrows all it may (5 devices), then its quota is lowered to 1 while that work runs
        provider.peak_borrowed_milli = 0
        borrowers = submit("a", 10)
        _wait(lambda: len(provider.running()) == 10, "a runs 10 halves (its 2 plus b's 3)")
        assert provider.peak_borrowed_milli == 3000
        admin.patch(f"/queues/{TENANT}/a", json={"quota_gpus": 1}).raise_for_status()
        provider.only_launching_queue = True
        late = submit("a", 1) + submit("b", 1)

        def considered(wid: str) -> bool:
            return bool(admin.get(f"/workloads/{wid}").json()["reason"])

        _wait(lambda: all(considered(w) for w in late), "the loop looked at the late arrivals")
        assert [admin.get(f"/workloads/{w}").json()["status"] for w in late] == ["pending", "pending"]
        assert len(provider.running()) == 10 and provider.stopped == []  # nothing stopped for the lower quota
        listed = {q["name"]: q for q in admin.get("/queues", params={"tenant": TENANT}).json()}
        assert (listed["a"]["used_gpus"], listed["a"]["borrowed_gpus"], listed["b"]["lent_gpus"]) == (5, 4, 3)
        # a's work ends one pod at a time; the late ones start only when the limits allow
        deadline = time.monotonic() + 90
        while succeeded() < 48 + 12:
            assert time.monotonic() < deadline, "phase 2 did not finish"
            for pod_id in provider.running()[:1]:
                provider.finish(pod_id, 0)
            time.sleep(0.05)
        ended = [admin.get(f"/workloads/{w}").json()["status"] for w in borrowers + late]
        assert ended == ["succeeded"] * 12
        assert provider.problems == []
        admin.close()
