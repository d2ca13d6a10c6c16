"""A replay with a fabric and the communication model decides exactly the same whether backfill's
reservation search looks at the head's last reserved start first (`backfill.search_hints`) and a
stuck gang's search inside one leaf stops past the starts it would take
(`locality.bound_leaf_search`), or every search walks the end times from the start to the first
fit: every decision of every cycle, and every metric."""

from __future__ import annotations

import random
from typing import Any

import pytest

from factories import cluster, pod
from gpupool.core.fabric.generate import fat_tree
from gpupool.core.model import Workload
from gpupool.core.scheduling import backfill, locality
from gpupool.core.scheduling.cycle import CycleResult, Policies
from gpupool.core.state import ClusterState
from gpupool.core.topology_spec import Tier, TopologySpec
from gpupool.sim import replay as replay_module
from gpupool.sim.comm import JobComm, ModelClass, default_comm_model
from gpupool.sim.comm_net import CommSetup
from gpupool.sim.jobs import TraceJob
from gpupool.sim.replay import Replay, ReplayConfig

MODEL = default_comm_model()
FABRIC = fat_tree(4, 2, oversubscription=3.0)
"""4 leaves of 3 hosts, one uplink each."""
NODES = tuple(cluster(12))


def _jobs(seed: int) -> tuple[tuple[TraceJob, ...], dict[str, JobComm]]:
    """A backed-up pool: gangs of whole nodes and single pods of 1-8 devices from 5 tenants, most
    with no estimate of their own (history estimates, overdue runs corrected), some stating one."""
    rng = random.Random(seed)
    jobs, profiles = [], {}
    at = 0.0
    for i in range(220):
        at += rng.expovariate(1 / 120.0)
        pods = rng.choice([1, 1, 1, 1, 2, 2, 3, 4])
        gpus = 8 if pods > 1 else rng.choice([1, 2, 4, 8])
        duration = rng.lognormvariate(7.5, 1.2)
        stated = duration * rng.uniform(0.5, 2.0) if rng.random() < 0.3 else None
        w = Workload(id=f"j{i:03d}", pods=tuple(pod(gpus, name=f"p{k}") for k in range(pods)),
                     tenant=f"t{rng.randrange(5)}", submit_time_s=at, runtime_estimate_s=stated)
        jobs.append(TraceJob(w, at, duration))
        if pods > 1:
            cls = rng.choice([ModelClass.LANGUAGE, ModelClass.IMAGE])
            profiles[w.id] = JobComm(cls, MODEL.classes[cls])
    return tuple(jobs), profiles


def _run(seed: int, monkeypatch: pytest.MonkeyPatch, fast: bool) -> tuple[list[Any], dict, int, int]:
    """Every cycle's decisions, the metrics (wall time left out), how many device checks the
    reservation searches made and how many reservations inside one leaf were taken."""
    jobs, profiles = _jobs(seed)
    policies = Policies(placement="network-aware", ordering="drf", backfill=True, preemption=True,
                        topology_default=TopologySpec(preferred=Tier.LEAF), max_locality_wait_s=600.0)
    decided: list[Any] = []
    checks, leaves = [0], [0]
    cycle_on, device_check = replay_module.cycle_on, backfill._device_check
    with_domain = locality._with_domain

    def recorded(*args: Any) -> CycleResult:
        result = cycle_on(*args)
        decided.append((args[3], result.decisions))
        return result

    def counted(head: Workload, domains: Any = None) -> Any:
        check = device_check(head, domains)

        def run(state: ClusterState) -> bool:
            checks[0] += 1
            return check(state)

        return run

    def taken(*args: Any) -> Any:
        leaves[0] += 1
        return with_domain(*args)

    with monkeypatch.context() as mp:
        mp.setattr(replay_module, "cycle_on", recorded)
        mp.setattr(backfill, "_device_check", counted)
        mp.setattr(locality, "_with_domain", taken)
        mp.setattr(backfill, "search_hints", fast)
        mp.setattr(locality, "bound_leaf_search", fast)
        result = Replay(ReplayConfig(NODES, jobs, policies, seed=seed, check_invariants=True,
                                     comm=CommSetup(FABRIC, MODEL, profiles))).run()
    for volatile in ("wall_s", "cycle_ms_mean"):
        result.pop(volatile)
    return decided, result, checks[0], leaves[0]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_fabric_replay_decides_the_same_with_the_faster_searches(
    seed: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast, fast_result, fast_checks, fast_leaves = _run(seed, monkeypatch, fast=True)
    plain, plain_result, plain_checks, plain_leaves = _run(seed, monkeypatch, fast=False)
    reserves = sum(1 for _, ds in plain for d in ds if type(d).__name__ == "Reserve")
    assert reserves > 50  # the pool is backed up: heads are reserved cycle after cycle
    assert plain_leaves > 0  # gangs are reserved inside one leaf too
    assert fast == plain
    assert fast_result == plain_result
    assert fast_leaves == plain_leaves
    assert fast_checks < plain_checks  # the searches were cut short often enough to matter
