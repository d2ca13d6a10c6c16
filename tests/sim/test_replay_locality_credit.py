"""The replay credits each job the time a cycle held it back for locality by reading the jobs held
(not every pending job on every cycle), and the result is the one the walk over every pending job
gave: every metric, on a backed-up fabric replay whose gangs wait for their leaf."""

from __future__ import annotations

import random
import sys
from typing import Any

from factories import cluster, pod
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.model import Workload
from gpupool.core.scheduling.cycle import Policies
from gpupool.core.topology_spec import Tier, TopologySpec
from gpupool.sim.comm import JobComm, ModelClass, default_comm_model
from gpupool.sim.comm_net import CommSetup
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import Replay, ReplayConfig

MODEL = default_comm_model()
FABRIC = fat_tree(4, 2, oversubscription=3.0)
NODES = tuple(cluster(12))


def _config(seed: int) -> ReplayConfig:
    """Gangs of whole nodes that prefer one leaf and may wait for it, beside single pods."""
    rng = random.Random(seed)
    jobs, profiles = [], {}
    at = 0.0
    for i in range(160):
        at += rng.expovariate(1 / 150.0)
        pods = rng.choice([1, 1, 1, 2, 2, 3])
        gpus = 8 if pods > 1 else rng.choice([1, 2, 4, 8])
        w = Workload(id=f"j{i:03d}", pods=tuple(pod(gpus, name=f"p{k}") for k in range(pods)),
                     tenant=f"t{rng.randrange(4)}", submit_time_s=at)
        jobs.append(TraceJob(w, at, rng.lognormvariate(7.0, 1.0)))
        if pods > 1:
            profiles[w.id] = JobComm(ModelClass.LANGUAGE, MODEL.classes[ModelClass.LANGUAGE])
    policies = Policies(placement="network-aware", ordering="drf", backfill=True,
                        topology_default=TopologySpec(preferred=Tier.LEAF), max_locality_wait_s=900.0)
    return ReplayConfig(NODES, tuple(jobs), policies, seed=seed, comm=CommSetup(FABRIC, MODEL, profiles))


class WalkEveryPending(Replay):
    """The credit as it was: every pending job looked at on every cycle."""

    def _credit_locality_waits(self, now_s: float) -> set[str]:
        held: set[str] = set()
        for wid, job in self.pending.items():
            if job.held_since_s is not None:
                job.locality_wait_s += now_s - job.held_since_s
                job.held_since_s = None
                held.add(wid)
        return held


class Watched(dict[str, Any]):
    """A pending dict that notes which functions walked it."""

    walkers: list[str]

    def items(self) -> Any:
        self.walkers.append(sys._getframe(1).f_code.co_name)
        return super().items()

    def values(self) -> Any:
        self.walkers.append(sys._getframe(1).f_code.co_name)
        return super().values()

    def __iter__(self) -> Any:
        self.walkers.append(sys._getframe(1).f_code.co_name)
        return super().__iter__()


def _result(replay: Replay) -> dict[str, Any]:
    result = replay.run()
    return {k: v for k, v in result.items() if k not in ("wall_s", "cycle_ms_mean")}


def test_the_held_jobs_are_credited_as_the_walk_over_every_pending_job_did() -> None:
    for seed in (1, 2):
        result = _result(Replay(_config(seed)))
        assert result["locality_waited_jobs"] > 5, result["locality_waited_jobs"]  # held for their leaf
        assert result == _result(WalkEveryPending(_config(seed)))


def test_the_credit_does_not_walk_every_pending_job() -> None:
    replay = Replay(_config(1))
    watched = Watched()
    watched.walkers = []
    replay.pending = watched
    replay.run()
    assert replay.cycles > 100
    assert "_credit_locality_waits" not in watched.walkers
