"""The services' controller: each pass makes every service's replicas match its row.

A pass (1) writes back the probe outcomes that came in, (2) forgets replicas whose workload ended,
replacing them by count, (3) records where running replicas answer, (4) creates or removes replica
workloads through the batch path (`workloads.prepare` + `submit_writer.commit`, `workloads.cancel`)
so admission, quotas, preemption and metering treat them as any workload, within the rollout's
surge and unavailable bounds, (5) hands due probes to the prober (never waiting for one), and (6)
sets the service's state: ready, pending (replicas still coming), or degraded with the last error.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.orm import Session

from gpupool.api.services import ProbeSpec, ServiceSpec
from gpupool.api.workloads import STORED
from gpupool.core.model import WorkloadStatus
from gpupool.core.scheduling.packing import emptiest_first
from gpupool.errors import Conflict, GpupoolError, Unavailable
from gpupool.server.orm import PodRow, ServiceReplicaRow, ServiceRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import workloads as workload_cases
from gpupool.server.services.submit_writer import commit
from gpupool.server.serving.probes import Prober, ProbeResult
from gpupool.server.serving.services import event
from gpupool.server.serving.specs import acting_for, replica_spec

log = logging.getLogger("gpupool.serving")
FINAL = frozenset(s.value for s in WorkloadStatus if s.is_final)
READINESS, LIVENESS = "readiness", "liveness"
STABLE_RUN_S = 600.0
"""A replica that ends after running this long is not a crash: its replacement starts at once."""
BACKOFF_FIRST_S, BACKOFF_MAX_S = 10.0, 300.0
"""After a service's second crash in a row its next replica waits 10 s, then 20, 40, ... at most
300 (as Kubernetes backs off a container that crashes)."""


def backoff_s(crashes: int) -> float:
    """How long the replica after `crashes` crashes in a row waits: none after the first."""
    return 0.0 if crashes <= 1 else min(BACKOFF_FIRST_S * 2 ** (crashes - 2), BACKOFF_MAX_S)


@dataclass(frozen=True, slots=True)
class Crashes:
    """A service's replicas that ended in a row before serving for STABLE_RUN_S."""

    count: int
    at_s: float
    """When the last one ended."""
    not_before_s: float
    """No replica of it is created before this time."""
    last: str
    """What the last one's workload said when it ended."""


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica as a pass reads it."""

    workload_id: str
    generation: int
    port: int
    host: str
    ready: str
    failures: int
    last_error: str
    status: str
    started_s: float | None
    node: str
    pod_id: str
    message: str = ""
    """Its workload's last message (why it ended, once it did)."""
    ready_s: float | None = None
    """When it first passed its readiness probe (None: never)."""
    finished_s: float | None = None

    @property
    def serving(self) -> bool:
        return self.ready == "ready" and self.status == WorkloadStatus.RUNNING.value


class ServiceGone(Conflict):
    """A replica's service was deleted, or began to be, after the controller read it."""


class Controller:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.prober = Prober(rt.config.serving.probe_concurrency)
        self._due: dict[tuple[str, str], float] = {}
        self._liveness_failures: dict[str, int] = {}
        self._refused: dict[str, str] = {}
        """service id -> why its last replica could not be created ('' once one could)."""
        self._crashes: dict[str, Crashes] = {}
        """service id -> its replicas that crashed in a row (none once one made since serves, or one
        ran STABLE_RUN_S)."""

    def step(self) -> int:
        """One pass over every service; returns how many there are."""
        now = self.rt.clock()
        with self.rt.store.read() as session:
            services = list(session.scalars(select(ServiceRow).where(ServiceRow.state != "deleting")))
        specs = {row.id: ServiceSpec.model_validate(row.spec, context=STORED) for row in services}
        self._apply(self.prober.results(), specs, now)
        for row in services:
            try:
                self._reconcile(row, specs[row.id], now)
            except Unavailable:
                raise
            except Exception:  # one service's trouble must not stop the others'
                log.exception("service %s/%s: reconcile failed; trying again next pass", row.tenant, row.name)
        return len(services)

    def close(self) -> None:
        self.prober.close()

    # ---------------------------------------------------------------- reading and bookkeeping

    def _read(self, session: Session, service_id: str) -> list[Replica]:
        rows = session.execute(
            select(ServiceReplicaRow, WorkloadRow.status, WorkloadRow.started_s, WorkloadRow.message,
                   WorkloadRow.finished_s)
            .join(WorkloadRow, WorkloadRow.id == ServiceReplicaRow.workload_id)
            .where(ServiceReplicaRow.service_id == service_id)
            .order_by(ServiceReplicaRow.created_s, ServiceReplicaRow.workload_id)
        ).all()
        ids = [r.workload_id for r, *_ in rows]
        nodes: dict[str, tuple[str, str]] = {}
        if ids:
            for wid, node, pod_id in session.execute(
                select(PodRow.workload_id, PodRow.node, PodRow.id)
                .where(PodRow.workload_id.in_(ids))
                .order_by(PodRow.created_s)
            ):
                nodes[wid] = (node, pod_id)  # the newest pod's
        return [
            Replica(
                r.workload_id,
                r.generation,
                r.port,
                r.host,
                r.ready,
                r.failures,
                r.last_error,
                status,
                started,
                *nodes.get(r.workload_id, ("", "")),
                message=message or "",
                ready_s=r.ready_s,
                finished_s=finished,
            )
            for r, status, started, message, finished in rows
        ]

    def _settle(self, row: ServiceRow, replicas: list[Replica], now: float) -> list[Replica]:
        """Forget ended replicas; record the address of running ones; a replica sent back to pending
        (preempted) starts its probes afresh. Returns the live replicas as they now are."""
        live: list[Replica] = []
        with self.rt.store.write() as session:
            for r in replicas:
                if r.status in FINAL:
                    session.execute(
                        delete(ServiceReplicaRow).where(ServiceReplicaRow.workload_id == r.workload_id)
                    )
                    self._forget(r.workload_id)
                    if r.ready != "draining":
                        event(session, row.id, "replica_replaced", self._ended(row.id, r, now), now)
                    continue
                running = r.status == WorkloadStatus.RUNNING.value
                if running and not r.host and r.node:
                    host = self.rt.provider.pod_address(r.node, r.pod_id)
                    session.execute(
                        update(ServiceReplicaRow)
                        .where(ServiceReplicaRow.workload_id == r.workload_id)
                        .values(host=host)
                    )
                    r = _with(r, host=host)
                elif not running and (r.host or r.ready == "ready"):
                    session.execute(
                        update(ServiceReplicaRow)
                        .where(ServiceReplicaRow.workload_id == r.workload_id)
                        .values(host="", ready="starting", successes=0, failures=0)
                    )
                    self._forget(r.workload_id)
                    r = _with(r, host="", ready="starting", failures=0)
                live.append(r)
        return live

    def _ended(self, service_id: str, r: Replica, now: float) -> str:
        """Count a replica that ended unasked (a crash, unless it ran STABLE_RUN_S) and say how it is
        replaced: at once, or after the backoff of the crashes in a row."""
        ended = r.finished_s if r.finished_s is not None else now
        ran = ended - r.started_s if r.started_s is not None else 0.0
        said = f"replica {r.workload_id} {r.status}" + (f" ({r.message})" if r.message else "")
        if ran >= STABLE_RUN_S:
            self._crashes.pop(service_id, None)
            return f"{said}; a new replica replaces it"
        before = self._crashes.get(service_id)
        count = (before.count if before is not None else 0) + 1
        wait = backoff_s(count)
        self._crashes[service_id] = Crashes(count, ended, ended + wait, r.message or r.status)
        if not wait:
            return f"{said}; a new replica replaces it"
        return (f"{said}, the {_nth(count)} in a row to end within {STABLE_RUN_S / 60:g} minutes of "
                f"starting; the next replica starts in {wait:g} s (the wait doubles with each crash, "
                f"up to {BACKOFF_MAX_S:g} s)")

    def _forget(self, workload_id: str) -> None:
        for kind in (READINESS, LIVENESS):
            self._due.pop((workload_id, kind), None)
        self._liveness_failures.pop(workload_id, None)

    # ---------------------------------------------------------------- the count

    def _reconcile(self, row: ServiceRow, spec: ServiceSpec, now: float) -> None:
        with self.rt.store.read() as session:
            replicas = self._read(session, row.id)
        live = self._settle(row, replicas, now)
        active = [r for r in live if r.ready != "draining"]
        used = None
        if self.rt.config.serving.pack_replicas and len(active) > row.desired:
            used = self._used({r.node for r in active if r.node})
        remove, create = plan(
            row.desired, row.generation, spec.rollout.max_surge, spec.rollout.max_unavailable, active, used
        )
        crashes = self._crashes.get(row.id)
        if crashes is not None and any(r.serving and (r.ready_s or 0.0) >= crashes.at_s for r in active):
            self._crashes.pop(row.id, None)  # one made since the last crash serves: no loop (any more)
            crashes = None
        if crashes is not None and now < crashes.not_before_s:
            create = 0  # backing off: the pool is not asked for a replica that would crash again
        for r in remove:
            self._remove(
                row,
                r,
                "scaled down"
                if r.generation == row.generation
                else f"replaced by generation {row.generation}",
                now,
            )
        for _ in range(create):
            if not self._create(row, spec, now):
                break
        self._probe(spec, [r for r in active if r not in remove], now, row.tenant)
        self._state(row, spec, [r for r in active if r not in remove], now)

    def _used(self, nodes: set[str]) -> dict[str, float]:
        """Devices in use on each node (its running and launching pods' slices), read at a scale-down."""
        used = dict.fromkeys(nodes, 0.0)
        if not nodes:
            return used
        with self.rt.store.read() as session:
            for node, slices in session.execute(
                select(PodRow.node, PodRow.slices)
                .where(PodRow.node.in_(sorted(nodes)), PodRow.finished_s.is_(None))
            ):
                used[node] += sum(int(s.get("compute_milli", 0)) for s in slices or ()) / 1000
        return used

    def _create(self, row: ServiceRow, spec: ServiceSpec, now: float) -> bool:
        tenant = row.tenant
        try:
            with self.rt.store.read() as session:
                port = self._free_port(session)
            submission = workload_cases.prepare(
                self.rt,
                acting_for(tenant),
                replica_spec(spec, tenant, port),
                service_class=str(row.spec.get("priority_class") or "") or None,
            )
            values = dict(
                workload_id=submission.id,
                service_id=row.id,
                generation=row.generation,
                port=port,
                host="",
                ready="starting",
                successes=0,
                failures=0,
                last_error="",
                created_s=now,
                ready_s=None,
            )

            def link(conn: Connection) -> None:
                # Compare-and-set in the replica's own transaction: the service is still there and
                # not being deleted (`services.remove` marks it so, then cancels the replicas it
                # lists: one stored after that list would outlive the service). The update takes
                # the row's lock, so a delete that starts meanwhile lists this replica.
                held = conn.execute(update(ServiceRow)
                                    .where(ServiceRow.id == row.id, ServiceRow.state != "deleting")
                                    .values(version=ServiceRow.version))
                if held.rowcount != 1:
                    raise ServiceGone(f"service {row.tenant}/{row.name} is being deleted")
                conn.execute(insert(ServiceReplicaRow).values(**values))

            submission.also = link
            commit(self.rt, [submission])
            if submission.error is not None:
                raise submission.error
        except ServiceGone:
            return False  # nothing was stored; the service and its events are going
        except GpupoolError as exc:
            if self._refused.get(row.id) != exc.message:
                self._refused[row.id] = exc.message
                with self.rt.store.write() as session:
                    event(
                        session,
                        row.id,
                        "replica_refused",
                        f"a replica could not be created: {exc.message}",
                        now,
                    )
            return False
        self._refused[row.id] = ""
        return True

    def _free_port(self, session: Session) -> int:
        """A port no live replica of the pool holds, from a random point of the range (two pools on
        one machine rarely try the same first)."""
        serving = self.rt.config.serving
        used = set(
            session.scalars(
                select(ServiceReplicaRow.port)
                .join(WorkloadRow, WorkloadRow.id == ServiceReplicaRow.workload_id)
                .where(WorkloadRow.status.not_in(FINAL))
            )
        )
        start = secrets.randbelow(serving.port_count)
        for step in range(serving.port_count):
            port = serving.port_base + (start + step) % serving.port_count
            if port not in used:
                return port
        raise Unavailable(
            f"Every replica port ({serving.port_base}-{serving.port_base + serving.port_count - 1}) "
            "is held; widen serving.port_count."
        )

    def _remove(self, row: ServiceRow, r: Replica, why: str, now: float) -> None:
        with self.rt.store.write() as session:
            session.execute(
                update(ServiceReplicaRow)
                .where(ServiceReplicaRow.workload_id == r.workload_id)
                .values(ready="draining")
            )
            event(session, row.id, "replica_removed", f"replica {r.workload_id} removed: {why}", now)
        with contextlib.suppress(Conflict):  # it ended meanwhile
            workload_cases.cancel(self.rt, acting_for(row.tenant), r.workload_id)
        self._forget(r.workload_id)

    # ---------------------------------------------------------------- probes and state

    def _probe(self, spec: ServiceSpec, active: list[Replica], now: float, tenant: str) -> None:
        probes: list[tuple[str, ProbeSpec]] = [(READINESS, spec.readiness_probe)]
        if spec.liveness is not None:
            probes.append((LIVENESS, spec.liveness))
        for r in active:
            if r.status != WorkloadStatus.RUNNING.value or not r.host or r.started_s is None:
                continue
            for kind, probe in probes:
                key = (r.workload_id, kind)
                due = self._due.get(key, r.started_s + probe.initial_delay_s)
                if now >= due and self.prober.start(r.workload_id, kind, probe, r.host, r.port, tenant):
                    self._due[key] = now + probe.period_s

    def _apply(self, results: list[ProbeResult], specs: dict[str, ServiceSpec], now: float) -> None:
        """Write the probes' outcomes: readiness moves a replica between starting/unready and ready;
        liveness failing failure_threshold times in a row replaces it (cancelled after the commit)."""
        if not results:
            return
        doomed: list[tuple[str, str]] = []
        with self.rt.store.write() as session:
            for result in results:
                replica = session.get(ServiceReplicaRow, result.workload_id)
                if replica is None or replica.ready == "draining" or replica.service_id not in specs:
                    continue
                spec = specs[replica.service_id]
                if result.kind == LIVENESS and spec.liveness is not None:
                    if self._liveness(session, replica, spec.liveness, result, now):
                        tenant = session.scalar(
                            select(ServiceRow.tenant).where(ServiceRow.id == replica.service_id)
                        )
                        doomed.append((tenant or "", replica.workload_id))
                elif result.kind == READINESS:
                    _readiness(session, replica, spec.readiness_probe, result, now)
        for tenant, workload_id in doomed:
            with contextlib.suppress(Conflict):  # it ended meanwhile
                workload_cases.cancel(self.rt, acting_for(tenant), workload_id)
            self._forget(workload_id)

    def _liveness(
        self, session: Session, replica: ServiceReplicaRow, probe: ProbeSpec, result: ProbeResult, now: float
    ) -> bool:
        """Count the outcome; True when the replica is to be replaced (marked draining, with its event)."""
        wid = replica.workload_id
        failures = 0 if result.ok else self._liveness_failures.get(wid, 0) + 1
        self._liveness_failures[wid] = failures
        if failures < probe.failure_threshold:
            return False
        replica.ready, replica.last_error = "draining", result.error[:1024]
        event(
            session,
            replica.service_id,
            "replica_replaced",
            f"replica {wid} failed its liveness probe {failures} times ({result.error}); replacing it",
            now,
        )
        return True

    def _state(self, row: ServiceRow, spec: ServiceSpec, active: list[Replica], now: float) -> None:
        threshold = spec.readiness_probe.failure_threshold
        failing = [r for r in active if not r.serving and r.failures >= threshold and r.last_error]
        ready = sum(1 for r in active if r.serving)
        old = any(r.generation != row.generation for r in active)
        refused = self._refused.get(row.id, "")
        crashes = self._crashes.get(row.id)
        if failing:
            state, error = "degraded", failing[0].last_error
        elif crashes is not None and crashes.count > 1 and ready < row.desired:
            state, error = "degraded", (f"its replicas crash: {crashes.count} in a row ended within "
                                        f"{STABLE_RUN_S / 60:g} minutes of starting, the last: "
                                        f"{crashes.last}")
        elif refused and ready < row.desired:
            state, error = "degraded", refused
        elif ready >= row.desired and not old:
            state, error = "ready", ""
        else:
            state, error = "pending", row.last_probe_error
        if (state, error) != (row.state, row.last_probe_error):
            with self.rt.store.write() as session:
                session.execute(
                    update(ServiceRow)
                    .where(ServiceRow.id == row.id, ServiceRow.state != "deleting")
                    .values(state=state, last_probe_error=error[:1024], updated_s=now)
                )
                if state != row.state:
                    event(
                        session,
                        row.id,
                        state,
                        f"{row.state} → {state}" + (f": {error}" if error else ""),
                        now,
                    )


def _readiness(
    session: Session, replica: ServiceReplicaRow, probe: ProbeSpec, result: ProbeResult, now: float
) -> None:
    if result.ok:
        replica.successes, replica.failures = replica.successes + 1, 0
        if replica.ready != "ready" and replica.successes >= probe.success_threshold:
            replica.ready, replica.ready_s, replica.last_error = "ready", now, ""
    else:
        replica.successes, replica.failures = 0, replica.failures + 1
        replica.last_error = result.error[:1024]
        if replica.ready == "ready" and replica.failures >= probe.failure_threshold:
            replica.ready = "unready"


def plan(
    desired: int,
    generation: int,
    max_surge: int,
    max_unavailable: int,
    active: list[Replica],
    used: Mapping[str, float] | None = None,
) -> tuple[list[Replica], int]:
    """(replicas to remove, how many to create): scale to `desired`, or during a rollout replace
    older generations while at most desired + max_surge replicas exist and at least desired -
    max_unavailable are serving. Removes the least useful first: not serving, then newest; with
    `used` (devices in use a node: `serving.pack_replicas`), serving ones on the emptiest node first
    (the core's `emptiest_first`), so whole nodes come free for wide batch gangs."""
    new = [r for r in active if r.generation == generation]
    old = [r for r in active if r.generation != generation]
    if not old:
        if len(new) > desired:
            ready = [r for r in reversed(new) if r.serving]
            if used is not None:
                ready = emptiest_first([(r, r.node) for r in ready], used)
            order = [r for r in reversed(new) if not r.serving] + ready
            return order[: len(new) - desired], 0
        return [], desired - len(new)
    serving = sum(1 for r in active if r.serving)
    spare = max(0, serving - (desired - max_unavailable))
    remove = [r for r in old if not r.serving]
    remove += [r for r in old if r.serving][:spare]
    remaining = len(active) - len(remove)
    create = max(0, min(desired - len(new), desired + max_surge - remaining))
    return remove, create


def _nth(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _with(r: Replica, **changes: object) -> Replica:
    return replace(r, **changes)  # type: ignore[arg-type]
