"""The replay keeps its pending work in a `PendingQueue` and hands the cycle that very queue, so the
cycle's pending book reads its log of arrivals and departures instead of comparing whole lists: the
queue holds exactly the pending jobs after every batch of events (arrivals, admissions, preemptions
and requeues, refusals), the book reads the queue's log, and every metric is the one a replay that
hands each cycle a fresh list gets."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from factories import cluster, pod
from gpupool.core.model import Workload
from gpupool.core.scheduling.cycle import Policies
from gpupool.core.scheduling.pending import PendingQueue
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import Replay, ReplayConfig


def _config(seed: int) -> ReplayConfig:
    """A backed-up pool: more work than devices, priorities that preempt, gangs, and a few jobs that
    can never fit (refused for good)."""
    rng = random.Random(seed)
    jobs = []
    at = 0.0
    for i in range(220):
        at += rng.expovariate(1 / 40.0)
        pods = rng.choice([1, 1, 1, 2, 3])
        gpus = rng.choice([1, 2, 4, 8]) if pods == 1 else 8
        if i % 53 == 7:
            gpus = 16  # no node has 16 devices
        w = Workload(id=f"j{i:03d}", pods=tuple(pod(gpus, name=f"p{k}") for k in range(pods)),
                     tenant=f"t{rng.randrange(4)}", priority=rng.choice([0, 0, 0, 5]), submit_time_s=at)
        jobs.append(TraceJob(w, at, rng.lognormvariate(6.5, 1.0)))
    policies = Policies(placement="first-fit", ordering="drf", backfill=True, preemption=True)
    return ReplayConfig(tuple(cluster(6)), tuple(jobs), policies, seed=seed)


class Checked(Replay):
    """Checks after every batch that the queue holds exactly the pending jobs, and notes whether
    the cycle's book last read the queue itself."""

    batches = 0
    book_read_queue = 0

    def _batch(self, now_s: float, events: Sequence[Any]) -> None:
        super()._batch(now_s, events)
        assert list(self.pending_workloads.by_id()) == list(self.pending_workloads.ids())
        assert set(self.pending_workloads.by_id()) == set(self.pending), now_s
        queued = self.pending_workloads.by_id()
        assert all(queued[wid] is job.job.workload for wid, job in self.pending.items())
        self.batches += 1
        self.book_read_queue += self.view.pending_book.source is self.pending_workloads


class FreshList(Replay):
    """Each cycle handed a fresh list of the same workloads, in the same order (as before the queue)."""

    def _pending_for_cycle(self, now_s: float) -> Sequence[Workload]:
        return list(self.pending_workloads)


def _result(replay: Replay) -> dict[str, Any]:
    result = replay.run()
    return {k: v for k, v in result.items() if k not in ("wall_s", "cycle_ms_mean")}


def test_the_queue_holds_exactly_the_pending_jobs_and_decides_as_fresh_lists() -> None:
    for seed in (1, 2, 3):
        checked = Checked(_config(seed))
        kept = _result(checked)
        assert checked.batches > 100 and checked.book_read_queue > 100
        assert isinstance(checked._pending_for_cycle(0.0), PendingQueue)
        fresh = FreshList(_config(seed))
        assert _result(fresh) == kept, seed
        assert fresh.view.pending_book.source is None
        assert kept["preemptions"] > 0 and kept["rejected"] > 0  # requeues and refusals both left the queue
