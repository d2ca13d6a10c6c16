"""The scheduling step: snapshot from the store, the core cycle, short writes, then launches.

Order matters for the crash-restart promise: pods are written as `launching` (with their node and
slices) in one transaction *before* the provider is asked to start them, and no provider call
happens inside a transaction.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, bindparam, insert, select, update

from gpupool.core.model import Node, PodPlacement, PodRequest, Workload, WorkloadStatus
from gpupool.core.scheduling.cycle import (
    Admission,
    CycleResult,
    Policies,
    Rejection,
)
from gpupool.core.scheduling.keeper import ViewKeeper
from gpupool.errors import GpupoolError
from gpupool.providers.base import PodLaunch
from gpupool.server.loops.snapshot import MAX_PENDING_PER_CYCLE, StoreView, WorkloadCache, load
from gpupool.server.orm import Base, PodRow, TenantRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import enforcement
from gpupool.server.services.events import Move, apply_moves, transition
from gpupool.server.services.workloads import stop_pods
from gpupool.server.states import EventReason, PodState

log = logging.getLogger("gpupool.scheduler")
FULL_RESCAN_S = 10.0
ARRIVAL_MARGIN_S = 10.0
ARRIVALS_PER_CYCLE = 128
"""A cycle that looks at new arrivals only takes at most this many, first in the core's order;
the rest go to the next cycles. A burst of submissions is then decided in several short cycles,
as if the loop had run during the burst, rather than one long one that holds up the API (which
shares the interpreter with the loop). Full passes read up to MAX_PENDING_PER_CYCLE."""
"""New arrivals are read from (newest seen - margin), so a slow commit is never skipped."""
LAUNCH_THREADS = 4
RECORD_CHUNK = 64
_W = Base.metadata.tables["workloads"]
_INSERT_POD = insert(Base.metadata.tables["pods"])
_INSERT_EVENT = insert(Base.metadata.tables["events"])
_SET_REASON = update(_W).where(
    _W.c.id == bindparam("r_id"), _W.c.status == WorkloadStatus.PENDING.value,
    _W.c.reason != bindparam("r_reason"),
).values(
    reason=bindparam("r_reason"), message=bindparam("r_message"))


@dataclass(frozen=True, slots=True)
class CycleStats:
    admitted: int
    pending: int
    seconds: float


class Scheduler:
    """One call of `cycle()` admits what fits now and hands it to the provider."""

    def __init__(self, rt: Runtime, policies: Policies, seed: int = 0) -> None:
        self.rt = rt
        self.policies = policies
        self.rng = random.Random(seed)
        self.cache = WorkloadCache()
        self.keeper = ViewKeeper()
        """The core's view of the pool, kept from cycle to cycle and brought up to date with each
        snapshot, so a cycle costs what changed rather than the size of the pool."""
        self._inadmissible: set[str] = set()
        self._horizon_s: float | None = None
        self._last_full_s = float("-inf")
        self._last_nodes: tuple[Node, ...] = ()
        self._launcher: ThreadPoolExecutor | None = None
        self._reasons: dict[str, str] = {}
        """The reason last stored for pending work this loop set aside (see `_record`)."""

    def cycle(self, capacity_changed: bool = True) -> CycleStats:
        """Admit what fits now.

        Like Kueue's best-effort FIFO, work that did not fit is set aside until capacity may have
        changed (a pod ended, a cancel, an uncordon, a quota change, a node change) and only new
        arrivals are examined meanwhile; a full pass also runs every FULL_RESCAN_S.
        """
        start = time.perf_counter()
        now = self.rt.clock()
        full = capacity_changed or self._horizon_s is None or now - self._last_full_s > FULL_RESCAN_S
        if full:
            self._inadmissible.clear()
            self._last_full_s = now
        limit = MAX_PENDING_PER_CYCLE if full else ARRIVALS_PER_CYCLE
        view = load(self.rt, self.cache, since_s=None if full else self._horizon_s,
                    skip=frozenset(self._inadmissible), limit=limit)
        if view.snapshot.nodes != self._last_nodes:
            self._last_nodes = view.snapshot.nodes
            if not full:
                self._horizon_s = None  # nodes changed: look at everything next cycle
        more = not full and len(view.pending) >= limit
        if more:
            # More arrivals wait beyond this cycle's share: keep the horizon where it is (what is
            # decided now is admitted or set aside, so the next cycle reads the ones after it) and
            # run again soon, after the loop's rest.
            self.rt.wake.set()
        elif full or view.pending:
            newest = max((w.submit_time_s for w in view.pending), default=now) - ARRIVAL_MARGIN_S
            self._horizon_s = newest if self._horizon_s is None else max(self._horizon_s, newest)
        candidates = [w for w in view.pending if w.id not in self._inadmissible]
        if not candidates:
            return CycleStats(0, len(view.pending), time.perf_counter() - start)
        # the core enforces the queues' quotas itself (Kueue semantics)
        policies = dataclasses.replace(self.policies, quota=view.quota)
        result = self.keeper.cycle(view.snapshot, candidates, policies, now, self.rng)
        self._inadmissible.update(r.workload_id for r in result.rejected if not r.final or more)
        launches = self._record(result, view)
        self._launch(launches)
        return CycleStats(len(result.admitted), len(candidates), time.perf_counter() - start)

    def _record(self, result: CycleResult, view: StoreView) -> list[PodLaunch]:
        """Admissions and rejections in short transactions of bulk statements, RECORD_CHUNK of each
        at a time so that submissions are never kept waiting on the store's write lock for long;
        returns the pods to launch (after every chunk is committed)."""
        now = self.rt.clock()
        by_id = {w.id: w for w in view.pending}
        admissions, rejections = result.admitted, result.rejected
        launches: list[PodLaunch] = []
        for start in range(0, max(len(admissions), len(rejections)), RECORD_CHUNK):
            if start:
                time.sleep(0)  # let a waiting submission batch take the write lock in between
            launches += self._record_some(admissions[start:start + RECORD_CHUNK],
                                          rejections[start:start + RECORD_CHUNK], view, by_id, now)
        return launches

    def _record_some(self, admissions: Sequence[Admission], rejections: Sequence[Rejection],
                     view: StoreView, by_id: dict[str, Workload], now: float) -> list[PodLaunch]:
        """One transaction: one read of the rows' states, one UPDATE per kind of change, one INSERT
        of pods and one of events; returns the pods to launch."""
        launches: list[PodLaunch] = []
        pods: list[dict[str, object]] = []
        allocated: list[tuple[str, list[str], list[PodPlacement]]] = []
        moves: list[Move] = []
        reasons: list[dict[str, object]] = []
        notes: list[dict[str, object]] = []
        limits = _LimitNotes(self.rt) if admissions else None
        with self.rt.store.write() as session:
            conn = session.connection()
            admitted = _states(conn, [a.workload_id for a in admissions], with_spec=True)
            accounts = _unix_users(conn, {row.tenant for row in admitted.values()})
            final = view.unschedulable_nodes == 0
            rejected = _states(conn, [r.workload_id for r in rejections if r.final and final],
                               with_spec=False)
            for admission in admissions:
                row = admitted.get(admission.workload_id)
                if row is None or row.status != WorkloadStatus.PENDING.value:
                    continue  # cancelled while the cycle ran
                self._reasons.pop(row.id, None)
                attempt = row.attempt + 1
                world = len(admission.placements)
                in_order = sorted(admission.placements, key=lambda p: int(p.pod.removeprefix("r")))
                allocated.append((row.id, [f"{row.id}-a{attempt}-{p.pod}" for p in in_order], in_order))
                for placement in admission.placements:
                    rank = int(placement.pod.removeprefix("r"))
                    pod_id = f"{row.id}-a{attempt}-r{rank}"
                    request = by_id[row.id].pods[rank]
                    pods.append(dict(
                        id=pod_id, workload_id=row.id, attempt=attempt, name=placement.pod, rank=rank,
                        status=PodState.LAUNCHING.value, node=placement.node,
                        slices=[{"device_index": s.device_index, "compute_milli": s.compute_milli,
                                 "memory_mib": s.memory_mib} for s in placement.slices],
                        cpu_milli=request.cpu_milli, memory_mib=request.memory_mib, message="",
                        created_s=now, exit_code=None, finished_s=None,
                    ))
                    launches.append(_pod_launch(row, pod_id, placement, rank, world, request,
                                                accounts.get(row.tenant) or ""))
                    assert limits is not None
                    notes += limits.events(row.id, pod_id, placement.node, request, now)
                moves.append(Move(
                    row.id, row.status, WorkloadStatus.ADMITTED.value, EventReason.ADMITTED,
                    f"Placed on {', '.join(sorted({p.node for p in admission.placements}))}.", now,
                    columns=(("attempt", attempt), ("admitted_s", now)),
                ))
            if pods:
                conn.execute(_INSERT_POD, pods)
            if notes:
                conn.execute(_INSERT_EVENT, notes)
            for rejection in rejections:
                if rejection.final and final:
                    row = rejected.get(rejection.workload_id)
                    if row is not None and row.status == WorkloadStatus.PENDING.value:
                        moves.append(Move(row.id, row.status, WorkloadStatus.FAILED.value,
                                          rejection.reason.value, rejection.message, now,
                                          columns=(("finished_s", now),)))
                elif self._reasons.get(rejection.workload_id) != rejection.reason.value:
                    # The row's reason is set only where it differs (the UPDATE checks): the rows of
                    # work that waits cycle after cycle for the same reason are not even read.
                    reasons.append({"r_id": rejection.workload_id, "r_reason": rejection.reason.value,
                                    "r_message": rejection.message[:1024]})
            apply_moves(conn, moves)
            if reasons:
                conn.execute(_SET_REASON, reasons)
        self._remember_reasons(reasons, view)
        for workload_id, pod_ids, placements in allocated:
            self.cache.admitted(by_id[workload_id], pod_ids, placements, now)
        return launches

    def _remember_reasons(self, recorded: list[dict[str, object]], view: StoreView) -> None:
        """Note the reasons now stored (after their commit), forgetting work no longer pending."""
        if len(self._reasons) > 2 * len(view.pending) + 1024:
            still = {w.id for w in view.pending} | self._inadmissible
            self._reasons = {k: v for k, v in self._reasons.items() if k in still}
        for item in recorded:
            self._reasons[str(item["r_id"])] = str(item["r_reason"])

    def _launch(self, launches: list[PodLaunch]) -> None:
        """Ask the provider (outside any transaction), then record what started."""
        if not launches:
            return
        started, failed = self._start_all(launches)
        now = self.rt.clock()
        to_stop: list[str] = []
        with self.rt.store.write() as session, session.no_autoflush:
            conn = session.connection()
            if started:
                conn.execute(
                    update(PodRow).where(PodRow.id.in_(started), PodRow.status == PodState.LAUNCHING.value)
                    .values(status=PodState.RUNNING.value)
                )
            states = _states(conn, sorted({launch.workload_id for launch in launches}), with_spec=False)
            moves: list[Move] = []
            for row in states.values():
                if row.status != WorkloadStatus.ADMITTED.value:
                    continue
                if row.id in failed:  # rare: the ORM path, with its pods
                    orm_row = session.get(WorkloadRow, row.id)
                    assert orm_row is not None
                    to_stop += stop_pods(session, orm_row, PodState.FAILED, now)
                    transition(session, orm_row, WorkloadStatus.FAILED.value, EventReason.LAUNCH_FAILED,
                               f"The provider could not start it: {failed[row.id]}", now)
                    orm_row.finished_s = now
                else:
                    moves.append(Move(row.id, row.status, WorkloadStatus.RUNNING.value,
                                      EventReason.LAUNCHED, "Started.", now, columns=(("started_s", now),)))
            apply_moves(conn, moves)
        for pod_id in to_stop:
            self.rt.provider.stop(pod_id, grace_s=0)

    def _start_all(self, launches: list[PodLaunch]) -> tuple[list[str], dict[str, str]]:
        """Ask the provider to start each pod: (started pod ids, failed workload -> why).

        A provider that sets `concurrent_launch = True` (the local one) gets up to LAUNCH_THREADS
        launches at once: a launch mostly waits on fork/exec and file writes, which release the GIL.
        Pods of a gang whose sibling failed may still start; they are stopped with it.
        """
        started: list[str] = []
        failed: dict[str, str] = {}

        def one(launch: PodLaunch) -> None:
            if launch.workload_id in failed:
                return
            try:
                self.rt.provider.launch(launch)
                started.append(launch.pod_id)
            except GpupoolError as exc:
                failed[launch.workload_id] = exc.message

        if len(launches) > 1 and getattr(self.rt.provider, "concurrent_launch", False):
            if self._launcher is None:
                self._launcher = ThreadPoolExecutor(LAUNCH_THREADS, thread_name_prefix="gpupool-launch")
            list(self._launcher.map(one, launches))
        else:
            for launch in launches:
                one(launch)
        return started, failed


def _states(conn: Connection, ids: Sequence[str], *, with_spec: bool) -> dict[str, Row[Any]]:
    """id, status, attempt, reason and tenant (and the spec, for launches) of the workloads `ids`,
    in one query."""
    if not ids:
        return {}
    columns = [_W.c.id, _W.c.status, _W.c.attempt, _W.c.reason, _W.c.tenant]
    if with_spec:
        columns.append(_W.c.spec)
    return {r.id: r for r in conn.execute(select(*columns).where(_W.c.id.in_(set(ids))))}


class _LimitNotes:
    """The `limits_unenforced` events of one transaction's admissions (node layers computed once)."""

    def __init__(self, rt: Runtime) -> None:
        self._missing = rt.provider.missing_capabilities()
        self._nodes = {n.name: n for n in rt.nodes()}
        self._sentences: dict[tuple[str, bool, bool], list[str]] = {}

    def events(self, workload_id: str, pod_id: str, node_name: str, request: PodRequest,
               now: float) -> list[dict[str, object]]:
        node = self._nodes.get(node_name)
        if node is None:
            return []
        key = (node_name, *enforcement.limits_asked(request))
        sentences = self._sentences.get(key)
        if sentences is None:
            layers = enforcement.node_layers(node, self._missing)
            sentences = self._sentences[key] = enforcement.unenforced(node, layers, request)
        admitted = WorkloadStatus.ADMITTED.value
        return [{"workload_id": workload_id, "pod_id": pod_id, "from_status": admitted,
                 "to_status": admitted, "reason": EventReason.LIMITS_UNENFORCED.value,
                 "message": sentence[:1024], "at_s": now} for sentence in sentences]


def _unix_users(conn: Connection, tenants: set[str]) -> dict[str, str | None]:
    """The Unix account the admin mapped to each of `tenants` (None: the pool's own account)."""
    if not tenants:
        return {}
    return dict(conn.execute(select(TenantRow.name, TenantRow.unix_user)
                             .where(TenantRow.name.in_(tenants))).all())


def _pod_launch(row: Row[Any], pod_id: str, placement: PodPlacement, rank: int, world: int,
                request: PodRequest, unix_user: str = "") -> PodLaunch:
    spec = row.spec
    env = {str(k): str(v) for k, v in dict(spec.get("env", {})).items()}
    env.update({"GPUPOOL_WORKLOAD_ID": row.id, "GPUPOOL_POD_ID": pod_id, "GPUPOOL_TENANT": row.tenant})
    if spec.get("submit_dir"):  # where `gpupool submit` ran (Slurm's SLURM_SUBMIT_DIR); see agent/workdir.py
        env["GPUPOOL_SUBMIT_DIR"] = str(spec["submit_dir"])
    return PodLaunch(
        pod_id=pod_id, workload_id=row.id, node=placement.node, command=tuple(spec["command"]),
        slices=placement.slices, cpu_milli=request.cpu_milli, memory_mib=request.memory_mib, env=env,
        workdir=str(spec.get("workdir", "")), rank=rank, world_size=world, tenant=row.tenant,
        unix_user=unix_user, separate_stderr=bool(spec.get("separate_stderr", False)),
    )
