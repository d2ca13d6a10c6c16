"""The launch part of the loop: pods recorded `launching` go to the nodes' launch workers
(loops/launches.py), pods `waiting` on a stopping pod's devices are promoted once those are free,
and what came of each launch is recorded.

Every write is a compare-and-set on the state read (a cancel committed while a launch was in flight
wins), and no provider call happens inside a transaction: the launches are handed over after the
commit that recorded them, and their outcomes recorded by a later step (`record_launches`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Row, bindparam, case, select, update

from gpupool.api.events import EventReason
from gpupool.core.model import Slice, WorkloadStatus
from gpupool.pods import PodLaunch, PodSecret, nproc_per_node, torchrun_command
from gpupool.server.loops.launches import LaunchWorkers
from gpupool.server.loops.rows import P, busy_devices, states, unix_users
from gpupool.server.orm import PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import mounts, rendezvous, secrets
from gpupool.server.services.events import LOST, Move, apply_moves, not_made, transition
from gpupool.server.services.locks import lock_workloads
from gpupool.server.services.requeue import stop_pods
from gpupool.server.serving.pairs import pair_env
from gpupool.server.states import PodState

# The statements that record launches, built once (building one costs more than running it).
_LAUNCHED = select(P.c.id, P.c.status, P.c.attempt).where(P.c.id.in_(bindparam("ids", expanding=True)))
_STARTED = (update(PodRow).where(PodRow.id == bindparam("p_id"), PodRow.started_s.is_(None))
            # metered from its start, even a pod stopped (cancelled) while it was being launched
            .values(status=case((PodRow.status == PodState.LAUNCHING.value, PodState.RUNNING.value),
                                else_=PodRow.status), started_s=bindparam("p_started_s")))
_STOPPED_WHILE_LAUNCHED = select(PodRow.id).where(PodRow.id.in_(bindparam("ids", expanding=True)),
                                                  PodRow.status == PodState.STOPPING.value)
_NEVER_STARTED = (update(PodRow).where(
    PodRow.id == bindparam("p_id"), PodRow.started_s.is_(None),
    PodRow.status.in_((PodState.LAUNCHING.value, PodState.STOPPING.value)),
).values(status=PodState.FAILED.value, finished_s=bindparam("p_finished_s"), message=bindparam("p_message")))


def preempt_grace_s(rt: Runtime, spec: dict[str, Any]) -> float:
    """SIGTERM to SIGKILL when a pod of this spec's priority class is preempted."""
    return rt.config.grace_s(str(spec.get("priority_class") or ""))


class PodLauncher:
    """Builds pods' launches, hands them to `workers`, promotes waiting pods and records outcomes."""

    def __init__(self, rt: Runtime, workers: LaunchWorkers) -> None:
        self.rt = rt
        self.workers = workers
        self.waiting = True
        """Whether pods may be waiting for a stopping pod to release their devices (checked at start);
        set by the applier when it writes a waiting pod."""

    def submit(self, launches: list[PodLaunch]) -> None:
        """Hand launches (recorded `launching` by a committed transaction) to the nodes' launch
        workers; `record_launches` records what came of them."""
        self.workers.submit(secrets.with_values(self.rt, launches))  # values opened now, in memory only

    def pod_launch(self, row: Row[Any], pod_id: str, node: str, slices: tuple[Slice, ...], rank: int,
                   world: int, cpu_milli: int, memory_mib: int, unix_user: str = "",
                   gang: rendezvous.Gang | None = None, conn: Connection | None = None) -> PodLaunch:
        """The launch of pod `pod_id` of the workload `row` (read with its spec), rank `rank` of
        `world`, on `node` with `slices`: its command, environment and limits."""
        spec = row.spec
        env = {str(k): str(v) for k, v in dict(spec.get("env", {})).items()}
        env.update({"GPUPOOL_WORKLOAD_ID": row.id, "GPUPOOL_POD_ID": pod_id, "GPUPOOL_TENANT": row.tenant,
                    "GPUPOOL_ATTEMPT": str(row.attempt + 1 if row.status == WorkloadStatus.PENDING.value
                                           else row.attempt),
                    "GPUPOOL_PREEMPT_GRACE_S": f"{preempt_grace_s(self.rt, spec):g}"})
        if spec.get("submit_dir"):  # where `gpupool submit` ran (SLURM_SUBMIT_DIR); see agent/workdir.py
            env["GPUPOOL_SUBMIT_DIR"] = str(spec["submit_dir"])
        if spec.get("array_index") is not None:  # one task of `gpupool submit --array`
            env["GPUPOOL_ARRAY_INDEX"] = str(spec["array_index"])
        if spec["command"][-2:] == ["-m", "gpupool.remote.worker"]:  # a function's worker pod: the API's
            from gpupool.server.services import calls  # URL and its call token (services/calls.py)
            env.update(calls.pod_env(self.rt, pod_id))
        if spec.get("pair_with"):  # a prefill/decode pair's replica (docs/services.md), read in `conn`
            env.update(pair_env(self.rt, conn, row.tenant, spec, node))
        command = tuple(spec["command"])
        if spec.get("launcher") == "torchrun":  # `submit --launcher torchrun`: each pod one torch node
            command = torchrun_command(command, nnodes=world, node_rank=rank, nproc=nproc_per_node(slices),
                                       master_addr=gang.master_addr if gang else "127.0.0.1",
                                       master_port=gang.master_port if gang else 0)
        return PodLaunch(
            pod_id=pod_id, workload_id=row.id, node=node, command=command,
            slices=slices, cpu_milli=cpu_milli, memory_mib=memory_mib, env=env,
            workdir=str(spec.get("workdir", "")), rank=rank, world_size=world, tenant=row.tenant,
            unix_user=unix_user, on_behalf=bool(spec.get("on_behalf")),
            separate_stderr=bool(spec.get("separate_stderr", False)),
            **(gang.launch_fields(rank) if gang is not None else {}),
            image=str(spec.get("image") or ""), image_rootfs=self._image_rootfs(spec),
            serve_port=int(spec.get("serve_port") or 0),  # a service's replica (docs/services.md)
            **(_mounts_and_secrets(self.rt, row.tenant, spec) if "mounts" in spec or "secrets" in spec
               else {}),
        )

    def _image_rootfs(self, spec: dict[str, Any]) -> str:
        """The root filesystem of a pod's image, resolved now ('' when it has none, or when the image
        was removed since the submit: the agent then fails the pod with that reason)."""
        name = spec.get("image")
        rootfs = self.rt.images.rootfs(str(name)) if name else None
        return str(rootfs) if rootfs is not None else ""

    def promote_waiting(self) -> int:
        """Hand to the provider the waiting pods whose devices no stopping pod holds any more (a
        whole gang at once); returns how many workloads were started."""
        if not self.waiting:
            return 0
        launches: list[PodLaunch] = []
        with self.rt.store.write() as session:
            conn = session.connection()
            waiting = conn.execute(
                select(P.c.id, P.c.workload_id, P.c.rank, P.c.node, P.c.slices, P.c.cpu_milli,
                       P.c.memory_mib).where(P.c.status == PodState.WAITING.value)
            ).all()
            if not waiting:
                self.waiting = False
                return 0
            busy = busy_devices(conn)
            gangs: dict[str, list[Any]] = {}
            for pod in waiting:
                gangs.setdefault(pod.workload_id, []).append(pod)
            ready = {wid: pods for wid, pods in gangs.items()
                     if not any((p.node, s["device_index"]) in busy for p in pods for s in p.slices)}
            if not ready:
                return 0
            lock_workloads(conn, ready)  # before their pods are written
            ready = _still_waiting(conn, ready)  # each gang's promotion: a compare-and-set on the read
            if not ready:
                return 0
            conn.execute(update(P).where(P.c.workload_id.in_(ready), P.c.status == PodState.WAITING.value)
                         .values(status=PodState.LAUNCHING.value, message=""))
            rows = states(conn, list(ready), with_spec=True)
            accounts = unix_users(conn, {row.tenant for row in rows.values()})
            for wid, pods in ready.items():
                row = rows[wid]
                gang = rendezvous.recorded(self.rt, row, row.attempt, {p.rank: p.node for p in pods})
                for pod in pods:
                    slices = tuple(Slice(**s) for s in pod.slices)
                    launches.append(self.pod_launch(row, pod.id, pod.node, slices, pod.rank, len(pods),
                                                    pod.cpu_milli, pod.memory_mib,
                                                    accounts.get(row.tenant) or "", gang=gang, conn=conn))
        self.submit(launches)
        return len(ready)

    def record_launches(self) -> int:
        """Record the launch outcomes ready now; returns how many.

        A pod that started is metered from its own start, and its workload (still `admitted`, in the
        attempt the pod belongs to) runs; a pod stopped meanwhile (a cancel, a preemption) is stopped
        with the provider now that the provider knows it. A pod whose launch failed never ran, so it
        is final at once (its slices free, a cancel of it done) and its workload, when the pod is of
        its current attempt and it is still placed, fails with the reason. Every write is a
        compare-and-set on the state read: a cancel committed while the launch was in flight wins."""
        outcomes = self.workers.collect()
        if not outcomes:
            return 0
        now = self.rt.clock()
        workload_of = {o.launch.pod_id: o.launch.workload_id for o in outcomes}
        started = {o.launch.pod_id: o.started_s for o in outcomes if o.started_s is not None}
        failed = {o.launch.pod_id: o.why for o in outcomes if o.started_s is None}
        to_stop: list[str] = []
        failed_workloads: dict[str, str] = {}
        with self.rt.store.write() as session, session.no_autoflush:
            conn = session.connection()
            lock_workloads(conn, set(workload_of.values()))  # before their pods
            pods = {r.id: r for r in conn.execute(_LAUNCHED, {"ids": sorted(workload_of)})}
            if started:
                conn.execute(_STARTED, [{"p_id": pod_id, "p_started_s": at}
                                        for pod_id, at in started.items()])
                # Stopped while it was being launched: the provider may not have known it when asked.
                to_stop += conn.scalars(_STOPPED_WHILE_LAUNCHED, {"ids": sorted(started)}).all()
            for pod_id, why in failed.items():  # never started: nothing to wait for
                conn.execute(_NEVER_STARTED, {"p_id": pod_id, "p_finished_s": now,
                                              "p_message": f"Never started: {why}"[:1024]})
            read = states(conn, sorted(set(workload_of.values())), with_spec=False)
            first_start: dict[str, float] = {}
            for pod_id, workload_id in workload_of.items():
                pod, row = pods.get(pod_id), read.get(workload_id)
                if (pod is None or row is None or pod.status != PodState.LAUNCHING.value
                        or pod.attempt != row.attempt):
                    continue  # stopped meanwhile, or of an attempt the workload has left
                at = started.get(pod_id)
                if at is None:
                    failed_workloads.setdefault(workload_id, failed[pod_id])
                else:
                    first_start[workload_id] = min(at, first_start.get(workload_id, at))
            placed = (WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)
            for workload_id, why in failed_workloads.items():  # rare: the ORM path, with its pods
                orm_row = session.get(WorkloadRow, workload_id, with_for_update=True)
                if (orm_row is None or orm_row.status not in placed
                        or orm_row.attempt != read[workload_id].attempt):
                    continue
                to_stop += stop_pods(session, orm_row, PodState.FAILED, now)
                transition(session, orm_row, WorkloadStatus.FAILED.value, EventReason.LAUNCH_FAILED,
                           f"The provider could not start it: {why}", now)
                orm_row.finished_s = now
            session.flush()
            apply_moves(conn, [Move(workload_id, WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value,
                                    EventReason.LAUNCHED, "Started.", now, columns=(("started_s", at),))
                               for workload_id, at in first_start.items()
                               if workload_id not in failed_workloads
                               and read[workload_id].status == WorkloadStatus.ADMITTED.value])
        if failed:
            self.rt.capacity_may_have_changed()
        for pod_id in [*to_stop, *failed]:  # a failed launch may have left something
            self.rt.provider.stop(pod_id, grace_s=0)
        return len(outcomes)


def _still_waiting(conn: Connection, ready: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The gangs of `ready` (read before their workloads were locked) whose pods all still wait: a
    gang a change reached since (a cancel stopped its pods) is not launched, its moves to launching
    lost (`not_made`)."""
    now_in: dict[str, str] = {r.id: r.status for r in conn.execute(
        select(P.c.id, P.c.status).where(P.c.workload_id.in_(ready)))}
    kept: dict[str, list[Any]] = {}
    for wid, pods in ready.items():
        changed = [p.id for p in pods if now_in.get(p.id) != PodState.WAITING.value]
        for pod_id in changed:
            not_made("pod", LOST, pod_id, PodState.WAITING.value, PodState.LAUNCHING.value, "promoted")
        if not changed:
            kept[wid] = pods
    return kept


def _mounts_and_secrets(rt: Runtime, tenant: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A launch's mounts (with the roots that allow them now) and secret references (values are
    added by secrets.with_values, just before the launch)."""
    return {"mounts": mounts.pod_mounts(rt.config, tenant, spec.get("mounts", [])),
            "secrets": tuple(PodSecret(str(s["name"]), str(s.get("env", "")), str(s.get("path", "")))
                             for s in spec.get("secrets", []))}
