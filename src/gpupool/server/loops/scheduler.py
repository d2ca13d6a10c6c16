"""The scheduling step: snapshot from the store, the core cycle, short writes, then launches.

Order matters for the crash-restart promise: pods are written as `launching` (with their node and
slices) in one transaction *before* the provider is asked to start them, and no provider call
happens inside a transaction.
"""

from __future__ import annotations

import inspect
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpupool.core.model import PodPlacement, PodRequest, Workload, WorkloadStatus
from gpupool.core.quota import DEVICE_MILLI, QuotaConfig, QuotaTracker, cluster_queue_of
from gpupool.core.scheduling.cycle import CycleResult, Policies, order_pending, run_cycle
from gpupool.errors import GpupoolError
from gpupool.providers.base import PodLaunch
from gpupool.server.loops.snapshot import StoreView, WorkloadCache, load
from gpupool.server.orm import PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.events import transition
from gpupool.server.services.workloads import stop_pods
from gpupool.server.states import EventReason, PodState

log = logging.getLogger("gpupool.scheduler")
_CYCLE_TAKES_QUOTA = "quota" in inspect.signature(run_cycle).parameters


@dataclass(frozen=True, slots=True)
class CycleStats:
    admitted: int
    pending: int
    seconds: float


def within_quota(pending: Sequence[Workload], view: StoreView) -> list[Workload]:
    """Pending work whose queue quota still has room, taken in the core's order, greedily.

    Used while the core cycle takes no quota input: a queue is never pushed past its quota.
    """
    config: QuotaConfig = view.quota
    tracker = QuotaTracker(config)
    route = config.route()
    for alloc in view.snapshot.allocations:
        cq = cluster_queue_of(config, route, alloc.workload)
        if cq:
            tracker.add(cq, {DEVICE_MILLI: alloc.workload.total_device_milli})
    chosen = []
    for workload in order_pending(pending):
        cq = cluster_queue_of(config, route, workload)
        demand = {DEVICE_MILLI: workload.total_device_milli}
        if cq is None or tracker.fits(cq, demand) is not None:
            continue
        tracker.add(cq, demand)
        chosen.append(workload)
    return chosen


class Scheduler:
    """One call of `cycle()` admits what fits now and hands it to the provider."""

    def __init__(self, rt: Runtime, policies: Policies, seed: int = 0) -> None:
        self.rt = rt
        self.policies = policies
        self.rng = random.Random(seed)
        self.cache = WorkloadCache()

    def cycle(self) -> CycleStats:
        start = time.perf_counter()
        view = load(self.rt, self.cache)
        if not view.pending:
            return CycleStats(0, 0, time.perf_counter() - start)
        if _CYCLE_TAKES_QUOTA:
            result = run_cycle(view.snapshot, view.pending, self.policies, self.rt.clock(), self.rng,
                               quota=view.quota)  # type: ignore[call-arg]
        else:
            result = run_cycle(view.snapshot, within_quota(view.pending, view), self.policies,
                               self.rt.clock(), self.rng)
        launches = self._record(result, view)
        self._launch(launches)
        return CycleStats(len(result.admitted), len(view.pending), time.perf_counter() - start)

    def _record(self, result: CycleResult, view: StoreView) -> list[PodLaunch]:
        """Admissions and rejections in one short transaction; returns the pods to launch."""
        now = self.rt.clock()
        launches: list[PodLaunch] = []
        by_id = {w.id: w for w in view.pending}
        with self.rt.store.write() as session:
            for admission in result.admitted:
                row = session.get(WorkloadRow, admission.workload_id)
                if row is None or row.status != WorkloadStatus.PENDING.value:
                    continue  # cancelled while the cycle ran
                row.attempt += 1
                row.admitted_s = now
                world = len(admission.placements)
                for placement in admission.placements:
                    rank = int(placement.pod.removeprefix("r"))
                    pod_id = f"{row.id}-a{row.attempt}-r{rank}"
                    request = by_id[row.id].pods[rank]
                    session.add(PodRow(
                        id=pod_id, workload_id=row.id, attempt=row.attempt, name=placement.pod, rank=rank,
                        status=PodState.LAUNCHING.value, node=placement.node,
                        slices=[{"device_index": s.device_index, "compute_milli": s.compute_milli,
                                 "memory_mib": s.memory_mib} for s in placement.slices],
                        cpu_milli=request.cpu_milli, memory_mib=request.memory_mib, message="",
                        created_s=now,
                    ))
                    launches.append(_pod_launch(row, pod_id, placement, rank, world, request))
                transition(session, row, WorkloadStatus.ADMITTED.value, EventReason.ADMITTED,
                           f"Placed on {', '.join(sorted({p.node for p in admission.placements}))}.", now)
            for rejection in result.rejected:
                row = session.get(WorkloadRow, rejection.workload_id)
                if row is None or row.status != WorkloadStatus.PENDING.value:
                    continue
                if rejection.final and view.unschedulable_nodes == 0:
                    transition(session, row, WorkloadStatus.FAILED.value, rejection.reason.value,
                               rejection.message, now)
                    row.finished_s = now
                elif row.reason != rejection.reason.value:
                    row.reason, row.message = rejection.reason.value, rejection.message[:1024]
        return launches

    def _launch(self, launches: list[PodLaunch]) -> None:
        """Ask the provider (outside any transaction), then record what started."""
        started: list[str] = []
        failed: dict[str, str] = {}
        for launch in launches:
            if launch.workload_id in failed:
                continue
            try:
                self.rt.provider.launch(launch)
                started.append(launch.pod_id)
            except GpupoolError as exc:
                failed[launch.workload_id] = exc.message
        if not launches:
            return
        now = self.rt.clock()
        to_stop: list[str] = []
        with self.rt.store.write() as session:
            for pod_id in started:
                pod = session.get(PodRow, pod_id)
                if pod is not None and pod.status == PodState.LAUNCHING.value:
                    pod.status = PodState.RUNNING.value
            for launch in launches:
                row = session.get(WorkloadRow, launch.workload_id)
                if row is None or row.status != WorkloadStatus.ADMITTED.value:
                    continue
                if launch.workload_id in failed:
                    to_stop += stop_pods(session, row, PodState.FAILED, now)
                    transition(session, row, WorkloadStatus.FAILED.value, EventReason.LAUNCH_FAILED,
                               f"The provider could not start it: {failed[launch.workload_id]}", now)
                    row.finished_s = now
                else:
                    row.started_s = now
                    transition(session, row, WorkloadStatus.RUNNING.value, EventReason.LAUNCHED,
                               "Started.", now)
        for pod_id in to_stop:
            self.rt.provider.stop(pod_id, grace_s=0)


def _pod_launch(row: WorkloadRow, pod_id: str, placement: PodPlacement, rank: int, world: int,
                request: PodRequest) -> PodLaunch:
    spec = row.spec
    env = {str(k): str(v) for k, v in dict(spec.get("env", {})).items()}
    env.update({"GPUPOOL_WORKLOAD_ID": row.id, "GPUPOOL_POD_ID": pod_id, "GPUPOOL_TENANT": row.tenant})
    return PodLaunch(
        pod_id=pod_id, workload_id=row.id, node=placement.node, command=tuple(spec["command"]),
        slices=placement.slices, cpu_milli=request.cpu_milli, memory_mib=request.memory_mib, env=env,
        workdir=str(spec.get("workdir", "")), rank=rank, world_size=world,
    )
