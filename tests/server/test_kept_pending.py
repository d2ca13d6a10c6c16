"""The scheduling loop hands each cycle what changed: one pending queue kept across full passes
(loops/pending_queue.py) and the allocation changes its cache knows (`WorkloadCache.changes`).

A control loop on the fake provider and a clock the test moves runs 160 steps of submissions (of
mixed priorities, so some join in the middle of the queue, and a high class that preempts),
cancels and holds through the API (which tells the loop), admissions and pods ending, with writes
the loop cannot know: a release, a workload cancelled by another connection, one cancelled while
the cycle runs (its admission's compare-and-set fails), and a restart (a fresh loop on the same
store). Every cycle the core is handed is checked:

* a full pass is handed the loop's kept queue, and it lists exactly the store's pending work in
  the store's order (read by the test's own query), object for object what the loop read;
* a second keeper, handed in lockstep a fresh list and whole snapshots (no changes), takes the
  very same decisions;
* the queue counted a resync on exactly the passes that follow a write the loop could not know
  (and on the first after a start), and snapshots carry changes on every cycle but the first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, or_, select, update

from gpupool.api.workloads import WorkloadSpec
from gpupool.config import parse_config
from gpupool.core.model import Allocation, ClusterSnapshot, PodPlacement, PodRequest, Workload, WorkloadStatus
from gpupool.core.scheduling.cycle import Admit, CycleResult, Policies, Stop
from gpupool.core.scheduling.pending import PendingQueue
from gpupool.errors import Conflict
from gpupool.providers.fake import FakeProvider
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops import scheduler as scheduler_module
from gpupool.server.loops import snapshot as snapshot_module
from gpupool.server.loops.control import ControlLoop
from gpupool.server.loops.fabric_view import FabricKeeper
from gpupool.server.loops.pending_queue import StoreQueue, store_key
from gpupool.server.loops.snapshot import StoreView, WorkloadCache
from gpupool.server.orm import WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import jobs, workloads
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

ADMIN = Principal("admin", None)
CONFIG = "scheduling:\n  placement: first-fit\n"


class Checked:
    """A control loop whose every core cycle is checked against a keeper handed fresh lists."""

    def __init__(self, tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1_000_000.0
        self.url = url
        self.provider = FakeProvider("4x4xH100", clock=lambda: self.now, duration_s=120.0)
        settings = Settings(data_dir=tmp_path, database_url=url, cycle_interval_s=0.05)
        self.rt = Runtime(settings=settings, store=Store.open(url), provider=self.provider,
                          clock=lambda: self.now, config=parse_config(CONFIG))
        bootstrap(self.rt)
        self.read: StoreView | None = None
        self.cycles = self.full_passes = self.with_changes = self.resyncs = 0
        self.stops = 0
        self.unknown = True
        """A write the loop could not know happened since the last full pass (or it just started)."""
        self.race: Callable[[CycleResult], None] | None = None
        real_load = scheduler_module.load

        def load(*args: Any, **kwargs: Any) -> StoreView:
            self.read = real_load(*args, **kwargs)
            return self.read

        monkeypatch.setattr(scheduler_module, "load", load)
        self.start()

    def start(self) -> None:
        """A fresh loop on the same store (a restart), its keeper's cycles checked."""
        self.loop = ControlLoop(self.rt)
        self.loop.recovered = self.loop.reconciler.recover()
        scheduler = self.loop.scheduler
        keeper, shadow = scheduler.keeper, FabricKeeper(self.rt)
        real_cycle, real_discard = keeper.cycle, keeper.discard
        self.unknown, self.first = bool(self.store_pending()), True  # a new loop knows nothing of it
        self.serial = -1

        def cycle(snapshot: ClusterSnapshot, pending: Sequence[Workload], policies: Policies, now_s: float,
                  rng: random.Random, audit: bool = False, undoable: bool = False) -> CycleResult:
            assert self.read is not None
            state = rng.getstate()
            handed = list(pending)  # as handed: the queue changes once admissions are written
            result = real_cycle(snapshot, pending, policies, now_s, rng, audit=audit, undoable=undoable)
            self.check(snapshot, pending, handed, self.read)
            fresh_rng = random.Random()
            fresh_rng.setstate(state)
            fresh = shadow.cycle(dataclasses.replace(snapshot, changes=None), list(self.read.pending)
                                 if isinstance(pending, PendingQueue) else list(pending),
                                 policies, now_s, fresh_rng, audit=audit, undoable=undoable)
            assert result.decisions == fresh.decisions, "the cycle decides as one handed fresh lists"
            self.stops += sum(isinstance(d, Stop) for d in result.decisions)
            if self.race is not None:
                race, self.race = self.race, None
                race(result)
            return result

        def discard() -> None:
            real_discard()
            shadow.discard()

        keeper.cycle = cycle  # type: ignore[method-assign]
        keeper.discard = discard  # type: ignore[method-assign]

    def check(self, snapshot: ClusterSnapshot, pending: Sequence[Workload], handed: list[Workload],
              read: StoreView) -> None:
        self.cycles += 1
        kept = self.loop.scheduler.cache.pending
        if snapshot.changes is not None:
            self.with_changes += 1
            assert snapshot.changes.serial == self.serial + 1, "each follows the snapshot handed before"
        else:
            assert self.first, "the cache vouches for the allocations on every cycle but the first"
        self.serial = -1 if snapshot.changes is None else snapshot.changes.serial
        self.first = False
        if not isinstance(pending, PendingQueue):
            return  # a cycle of arrivals: the few read, as before
        self.full_passes += 1
        assert isinstance(pending, StoreQueue) and pending is kept.queue, "a full pass hands the kept queue"
        assert all(map(lambda a, b: a is b, handed, read.pending)) and len(handed) == len(read.pending)
        assert [w.id for w in handed] == self.store_pending(), "the store's pending work, in its order"
        assert handed == sorted(handed, key=store_key)
        assert kept.last_resynced == self.unknown, (
            "a resync on exactly the passes after a write the loop could not know")
        self.resyncs += kept.last_resynced
        self.unknown = False

    def store_pending(self) -> list[str]:
        with self.rt.store.read() as session:
            return list(session.scalars(
                select(WorkloadRow.id).where(
                    WorkloadRow.status == WorkloadStatus.PENDING.value, WorkloadRow.held == "",
                    WorkloadRow.waiting_on == "",
                    or_(WorkloadRow.not_before_s.is_(None), WorkloadRow.not_before_s <= self.now))
                .order_by(WorkloadRow.priority.desc(), WorkloadRow.submit_s, WorkloadRow.id)))

    def submit(self, rng: random.Random) -> str:
        spec: dict[str, Any] = {"command": ["train"], "resources": {"gpus": rng.choice([0.5, 1, 2, 4])},
                                "priority": rng.choice([-5, 0, 0, 5])}
        if rng.random() < 0.05:
            spec["priority_class"] = "high"
        return workloads.submit(self.rt, ADMIN, WorkloadSpec.model_validate(spec)).id

    def queued(self, workload_id: str) -> bool:
        """Whether the loop's kept queue holds `workload_id`, or the loop was told it joined (or will
        be, at its next read): then its leaving, unknown to the loop, shows at the next full pass."""
        kept = self.loop.scheduler.cache.pending
        told = workload_id in kept.expected or any(w.id == workload_id for w in self.rt.submitted)
        return told or workload_id in kept.queue.by_id()

    def behind_the_back(self, workload_id: str) -> None:
        """Cancel a pending workload on a connection of its own, as another process would; one the
        loop's queue holds is a write the loop could not know."""
        self.unknown |= self.queued(workload_id)
        engine = create_engine(self.url)
        try:
            with engine.begin() as conn:
                conn.execute(update(WorkloadRow).where(WorkloadRow.id == workload_id,
                                                       WorkloadRow.status == WorkloadStatus.PENDING.value)
                             .values(status=WorkloadStatus.CANCELLED.value))
        finally:
            engine.dispose()


def test_the_kept_queue_and_changes_decide_as_fresh_lists(tmp_path: Path, db_url: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pool = Checked(tmp_path, db_url, monkeypatch)
    try:
        rng = random.Random(11)
        submitted: list[str] = []
        lost: list[str] = []
        held: list[str] = []

        def cancel_one_admitted(result: CycleResult) -> None:
            admitted = [d.workload_id for d in result.decisions if isinstance(d, Admit)]
            if admitted:
                pool.behind_the_back(admitted[0])  # its admission's compare-and-set then fails
                lost.append(admitted[0])
            else:
                pool.race = cancel_one_admitted

        for step in range(160):
            for _ in range(rng.randrange(4)):
                submitted.append(pool.submit(rng))
            if step % 9 == 4 and submitted:  # the API tells the loop: no resync
                with contextlib.suppress(Conflict):  # it may have ended already
                    workloads.cancel(pool.rt, ADMIN, submitted.pop(rng.randrange(len(submitted))))
            if step % 13 == 6:
                pending = pool.store_pending()
                if pending:  # held by the API (the loop is told); released later (it is not)
                    jobs.hold(pool.rt, ADMIN, pending[0])
                    held.append(pending[0])
            if step % 13 == 12 and held:
                jobs.release(pool.rt, ADMIN, held.pop(0))
                pool.unknown = True
            if step % 23 == 11:
                pending = pool.store_pending()
                if pending:
                    pool.behind_the_back(pending[-1])
            if step in (40, 110):
                pool.race = cancel_one_admitted
            if step == 80:
                pool.start()
            pool.now += rng.choice([0.5, 5.0, 30.0])
            pool.loop.step()
        assert pool.full_passes >= 60 and pool.cycles >= pool.full_passes
        assert pool.with_changes >= pool.cycles - 2, "changes on all cycles but the first of each loop"
        assert len(lost) == 2, "two admissions lost their compare-and-set to another writer"
        assert 10 <= pool.resyncs < pool.full_passes // 4, "resyncs only where the loop could not know"
        assert pool.stops >= 10, "preempted work went back to pending (the loop knows: no resync)"
        assert pool.loop.scheduler.cache.pending.rebuilds == 0
        with pool.rt.store.read() as session:
            statuses = list(session.scalars(select(WorkloadRow.status)))
        assert statuses.count(WorkloadStatus.SUCCEEDED.value) >= 40, "work came and went"
    finally:
        pool.rt.store.close()


def test_a_store_queue_takes_each_joiner_at_its_place_and_logs_in_that_order() -> None:
    """Joiners of every priority land where the store's order puts them, and the log a cycle reads
    gives what joined in the queue's order (as a comparison of lists finds them)."""
    def w(i: int, priority: int, submit_s: float) -> Workload:
        return Workload(id=f"w{i:03d}", pods=(PodRequest("p0", cpu_milli=1000, memory_mib=1024),), tenant="t",
                        priority=priority, submit_time_s=submit_s)

    queue = StoreQueue([w(1, 0, 1.0), w(2, 0, 2.0), w(3, -5, 0.5)])
    assert queue.ids() == ["w001", "w002", "w003"]
    at = queue.position
    queue.join([w(4, 0, 3.0), w(5, 5, 4.0), w(6, -5, 0.1)])
    queue.pop("w002")
    queue.add(w(7, 0, 2.5))
    assert queue.ids() == ["w005", "w001", "w007", "w004", "w006", "w003"]
    changes = queue.changes_since(at)
    assert changes is not None
    assert [(joined, c.id) for joined, c in changes] == [
        (False, "w002"), (True, "w005"), (True, "w007"), (True, "w004"), (True, "w006")]


def test_the_cache_numbers_its_changes_and_hands_none_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Allocations noted and dropped come back as one snapshot's changes, in the snapshot's order,
    each numbered one after the last; none on the first, after a node change, or once more ended
    since the last cycle than the bound lets it hold (a pool with nothing pending runs no cycle)."""
    monkeypatch.setattr(snapshot_module, "MAX_CHANGES_SLACK", 0)
    nodes = frozenset({"n0"})
    cache = WorkloadCache()
    snapshot_module._changed_allocations(cache, [], nodes)
    assert cache.changes() is None, "the first snapshot: the keeper compares"

    def admit(wid: str) -> Allocation:
        w = Workload(id=wid, pods=(PodRequest("p0", cpu_milli=1000, memory_mib=1024),), tenant="t")
        cache.admitted(w, [f"{wid}-a1-r0"], [PodPlacement(pod="r0", node="n0", slices=(), cpu_milli=1000,
                                                          memory_mib=1024)], 5.0)
        return cache.allocations()[wid][1]

    second, first, third = admit("w2"), admit("w1"), admit("w3")
    changes = cache.changes()
    assert changes is not None and changes.serial == 0
    assert changes.started == (first, second, third) and changes.ended == ()
    active = [("w1", "w1-a1-r0", 0), ("w3", "w3-a1-r0", 0)]
    assert snapshot_module._changed_allocations(cache, active, nodes) == []  # w2 ended
    changes = cache.changes()
    assert changes is not None and (changes.serial, changes.started, changes.ended) == (1, (), (second,))
    snapshot_module._changed_allocations(cache, [], nodes)  # both end: more than the bound holds
    assert cache.changes() is None
    fourth = admit("w4")
    changes = cache.changes()
    assert changes is not None and (changes.serial, changes.started) == (0, (fourth,))
    snapshot_module._changed_allocations(cache, [("w4", "w4-a1-r0", 0)], frozenset({"n0", "n1"}))
    assert cache.changes() is None, "a node came: placements are read again, the keeper compares"
