"""The data plane's loop: a thread of its own that keeps the router in step with the store and scales.

Once a second it (1) reads the services, their ready replicas (serving/endpoints.py) and the active
tenant tokens, and hands them to the router (which changes only what differs); (2) samples each
service's traffic as the router sees it; (3) runs the autoscaler (core/autoscale.py) for each service
with a target and writes a changed replica count with `set_desired`, a compare-and-set on the
service row's version (a write that lost is decided again on the next tick, from a fresh read).
Nothing here blocks the control loop: the router's calls and the store's reads happen on this thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, replace

from sqlalchemy import delete, or_, select, update

from gpupool.api.services import ProbeKind, ServiceLive, ServiceSpec
from gpupool.api.workloads import STORED
from gpupool.core.autoscale import AutoscalePolicy, AutoscaleState, Decision, Sample, ScaleMetric, decide
from gpupool.errors import InvalidInput, StoreUnavailable
from gpupool.server.dataplane.haproxy import find_haproxy
from gpupool.server.dataplane.model import Backend, Probe, Route, ServiceTraffic
from gpupool.server.dataplane.plane import DataPlane
from gpupool.server.db import Fenced
from gpupool.server.leader import Leadership
from gpupool.server.orm import ServiceEventRow, ServiceRow, ServiceTrafficRow, TokenRow
from gpupool.server.runtime import Runtime
from gpupool.server.serving.endpoints import ready_endpoints, set_desired

log = logging.getLogger("gpupool.dataplane")
TICK_S = 1.0
STABLE_WINDOW_S = 60.0
REPORT_FRESH_S = 5.0
"""A server's traffic row older than this is not counted (its server stopped or cannot write)."""
REPORT_FORGET_S = 60.0
"""The leader deletes rows older than this (a server that went away)."""


@dataclass(frozen=True, slots=True)
class ServiceView:
    id: str
    route: Route
    version: int
    desired: int
    policy: AutoscalePolicy | None
    backends: tuple[Backend, ...]


@dataclass(frozen=True, slots=True)
class ServiceRates:
    """What /metrics shows of one service."""

    requests_per_s: float
    traffic: ServiceTraffic


def _probe(spec: ServiceSpec) -> Probe:
    p = spec.readiness
    if p is None:
        return Probe(path=None)
    return Probe(path=p.path if p.kind is ProbeKind.HTTP else None, interval_s=p.period_s,
                 success_threshold=p.success_threshold, failure_threshold=p.failure_threshold,
                 timeout_s=p.timeout_s)


def _policy(row: ServiceRow) -> AutoscalePolicy | None:
    if row.target_concurrency:
        return AutoscalePolicy(target_per_replica=row.target_concurrency, min_replicas=row.min_replicas,
                               max_replicas=row.max_replicas)
    if row.target_rps:
        return AutoscalePolicy(target_per_replica=row.target_rps, min_replicas=row.min_replicas,
                               max_replicas=row.max_replicas, metric=ScaleMetric.RPS)
    return None


class DataPlaneLoop:
    def __init__(self, rt: Runtime, plane: DataPlane, leadership: Leadership | None = None) -> None:
        self.rt = rt
        self.plane = plane
        self.leadership = leadership
        """With several servers on one store (docs/ha.md) every server routes, but only the
        leader's autoscaler writes, fenced by its epoch: a follower's traffic is not counted."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._routes: list[Route] = []
        self._backends: dict[str, tuple[Backend, ...]] = {}
        self._tokens: dict[str, str] = {}
        self._samples: dict[str, deque[Sample]] = {}
        self._states: dict[str, AutoscaleState] = {}
        self._undecided: set[str] = set()
        """Services whose last decision failed (each logged once until one succeeds)."""
        self._last_total: dict[str, tuple[float, int]] = {}
        self._ids: dict[str, str] = {}
        self.rates: dict[str, ServiceRates] = {}
        self._cold: list[tuple[str, float]] = []
        self._cold_lock = threading.Lock()
        self._others_seen: dict[tuple[str, str], int] = {}
        """(server, service id) -> its router's request count when the leader last read it."""
        self._others_added: dict[str, int] = {}
        """service id -> requests the other servers' routers answered since this server leads."""
        plane.proxy.on_cold_start = self._cold_start

    def start(self) -> None:
        self.plane.start()
        self._thread = threading.Thread(target=self._run, name="gpupool-dataplane", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.plane.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick(self.rt.clock())
            except StoreUnavailable:
                pass
            except Exception:  # the loop must outlive any one bad tick
                log.exception("data plane tick failed; trying again")
            self._stop.wait(max(0.0, TICK_S - (time.monotonic() - started)))

    @property
    def url(self) -> str:
        """Where services answer: http://HOST:PORT, before /s/<tenant>/<service>/."""
        return self.plane.url

    @property
    def router(self) -> str:
        """haproxy or in-process: which router serves (the start note, `config show --server`)."""
        return self.plane.kind.value

    @property
    def router_note(self) -> str:
        """haproxy, or in-process with why (GET /pool, `gpupool node ls`)."""
        return self.plane.router

    def live(self) -> dict[str, ServiceLive]:
        """Each service's numbers at the last tick (the dashboard's service page and history)."""
        return {service: ServiceLive(requests_per_s=round(r.requests_per_s, 3), in_flight=r.traffic.in_flight,
                                     latency_p50_ms=r.traffic.latency_p50_ms,
                                     latency_p99_ms=r.traffic.latency_p99_ms,
                                     latency_mean_ms=r.traffic.latency_avg_ms)
                for service, r in dict(self.rates).items()}

    def _cold_start(self, service: str, seconds: float) -> None:
        with self._cold_lock:  # called on the proxy's thread: written to the store by the next tick
            self._cold.append((service, seconds))

    # ------------------------------------------------------------------ one tick
    def tick(self, now_s: float) -> None:
        views, tokens = self._read(now_s)
        self._apply(views, tokens)
        epoch: int | None = None
        traffic = self.plane.traffic()
        if self.leadership is not None:
            epoch = self.leadership.acting_epoch()
            if epoch is None:  # a follower routes and reports; the leader decides the replica counts
                self._others_seen.clear()
                self._report(views, traffic, now_s)
                return
            traffic = self._with_others(views, traffic, now_s)
        writes: list[tuple[ServiceView, Decision]] = []
        for view in views:
            seen = traffic.get(view.route.service)
            if seen is None:
                continue
            self._sample(view.route.service, seen, now_s)
            if view.policy is None:
                continue
            state = self._states.get(view.id, AutoscaleState())
            history = list(self._samples[view.route.service])
            try:
                decision = decide(view.policy, history, len(view.backends), view.desired, state, now_s)
            except Exception:  # one service's decision never stops the others' (they share the tick)
                if view.id not in self._undecided:
                    self._undecided.add(view.id)
                    log.exception("service %s: its autoscaling decision failed; its replicas stay as they "
                                  "are while it fails", view.route.service)
                continue
            self._undecided.discard(view.id)
            self._states[view.id] = decision.state
            if decision.changed:
                writes.append((view, decision))
        try:
            with self.rt.store.fenced(epoch):
                self._write(writes, now_s)
        except Fenced:
            if self.leadership is not None and epoch is not None:
                self.leadership.lost(epoch)

    def _report(self, views: list[ServiceView], traffic: dict[str, ServiceTraffic], now_s: float) -> None:
        """This server's router's numbers, one row per service (written only by this server)."""
        assert self.leadership is not None
        me = self.leadership.server_id
        with self.rt.store.write() as session:
            for view in views:
                seen = traffic.get(view.route.service)
                if seen is None:
                    continue
                values = {"in_flight": seen.in_flight, "requests_total": seen.requests_total, "at_s": now_s}
                mine = (ServiceTrafficRow.server_id == me, ServiceTrafficRow.service_id == view.id)
                done = session.execute(update(ServiceTrafficRow).where(*mine).values(**values))
                if not done.rowcount:  # type: ignore[attr-defined]
                    session.add(ServiceTrafficRow(server_id=me, service_id=view.id, **values))

    def _with_others(self, views: list[ServiceView], traffic: dict[str, ServiceTraffic],
                     now_s: float) -> dict[str, ServiceTraffic]:
        """The leader's router's numbers plus the other servers' fresh ones (their requests counted by
        growth since the last read, so a server that appears or restarts adds no burst)."""
        assert self.leadership is not None
        me = self.leadership.server_id
        with self.rt.store.read() as session:
            rows = session.scalars(select(ServiceTrafficRow).where(ServiceTrafficRow.server_id != me)).all()
            stale = [(r.server_id, r.service_id) for r in rows if r.at_s < now_s - REPORT_FORGET_S]
            fresh = [(r.server_id, r.service_id, r.in_flight, r.requests_total)
                     for r in rows if r.at_s >= now_s - REPORT_FRESH_S]
        in_flight: dict[str, int] = {}
        for server, service_id, flying, total in fresh:
            in_flight[service_id] = in_flight.get(service_id, 0) + flying
            last = self._others_seen.get((server, service_id))
            if last is not None:
                self._others_added[service_id] = self._others_added.get(service_id, 0) + max(0, total - last)
            self._others_seen[(server, service_id)] = total
        if stale:
            with self.rt.store.write() as session:
                for server, service_id in stale:
                    session.execute(delete(ServiceTrafficRow).where(
                        ServiceTrafficRow.server_id == server, ServiceTrafficRow.service_id == service_id,
                        ServiceTrafficRow.at_s < now_s - REPORT_FORGET_S))
        out = dict(traffic)
        for view in views:
            own = traffic.get(view.route.service)
            if own is None:
                continue
            out[view.route.service] = replace(
                own, in_flight=own.in_flight + in_flight.get(view.id, 0),
                requests_total=own.requests_total + self._others_added.get(view.id, 0))
        return out

    def _read(self, now_s: float) -> tuple[list[ServiceView], dict[str, str]]:
        views = []
        with self.rt.store.read() as session:
            rows = list(session.scalars(select(ServiceRow).where(ServiceRow.state != "deleting")))
            for row in rows:
                spec = ServiceSpec.model_validate(row.spec, context=STORED)
                route = Route(f"{row.tenant}/{row.name}", row.tenant, public=bool(row.public),
                              probe=_probe(spec))
                backends = tuple(Backend(e.workload_id, e.host, e.port)
                                 for e in ready_endpoints(session, row.id))
                views.append(ServiceView(row.id, route, row.version, row.desired, _policy(row), backends))
            rows_ = session.execute(
                select(TokenRow.token_sha256, TokenRow.tenant)
                .where(TokenRow.tenant.is_not(None), TokenRow.revoked_s.is_(None),
                       TokenRow.scope == "full",
                       or_(TokenRow.expires_s.is_(None), TokenRow.expires_s > now_s))).all()
        return views, {digest: tenant for digest, tenant in rows_ if tenant is not None}

    def _apply(self, views: list[ServiceView], tokens: dict[str, str]) -> None:
        if tokens != self._tokens:  # first: a revoked token stops working even if a route fails to apply
            self.plane.set_tokens(tokens)
            self._tokens = tokens
        routes = sorted((v.route for v in views), key=lambda r: r.service)
        if routes != self._routes:
            self.plane.set_routes(routes)
            self._routes = routes
            gone = set(self._backends) - {r.service for r in routes}
            for name in gone:
                del self._backends[name]
                self._samples.pop(name, None)
        self._ids = {v.route.service: v.id for v in views}
        for view in views:
            if self._backends.get(view.route.service) != view.backends:
                self.plane.set_backends(view.route.service, view.backends)
                self._backends[view.route.service] = view.backends

    def _sample(self, service: str, seen: ServiceTraffic, now_s: float) -> None:
        last = self._last_total.get(service)
        rps = 0.0
        if last is not None and now_s > last[0]:
            rps = max(0, seen.requests_total - last[1]) / (now_s - last[0])
        self._last_total[service] = (now_s, seen.requests_total)
        sample = Sample(now_s, float(seen.in_flight), rps)
        history = self._samples.setdefault(service, deque())
        history.append(sample)
        while history and history[0].at_s <= now_s - STABLE_WINDOW_S:
            history.popleft()
        self.rates[service] = ServiceRates(requests_per_s=rps, traffic=seen)

    def _write(self, writes: list[tuple[ServiceView, Decision]], now_s: float) -> None:
        with self._cold_lock:
            cold, self._cold = self._cold, []
        if not writes and not cold:
            return
        with self.rt.store.write() as session:
            for view, decision in writes:
                why = decision.reason.split(": ", 1)[-1]
                if not set_desired(session, view.id, decision.desired, why, view.version, now=now_s):
                    log.info("service %s: its row moved on; deciding again next tick", view.route.service)
                    self._states.pop(view.id, None)
            for service, seconds in cold:
                service_id = self._ids.get(service)
                if service_id is not None:
                    session.add(ServiceEventRow(service_id=service_id, reason="cold_start", at_s=now_s,
                                                message=f"cold start: the first held request waited "
                                                        f"{seconds:.2f} s for a ready replica"))


def from_settings(rt: Runtime, leadership: Leadership | None = None) -> DataPlaneLoop | None:
    """The loop `gpupool up --serve-port` runs, or None when no service traffic is routed."""
    s = rt.settings
    if not s.serve_port:
        return None
    binary: str | None = "" if s.serve_router == "auto" else None
    if s.serve_router == "haproxy":
        binary = find_haproxy()
        if binary is None:
            raise InvalidInput("--serve-router haproxy: haproxy is not installed; install the haproxy "
                               "package or use --serve-router auto")
    # several servers on one machine (and one data directory) each run a router of their own
    where = s.data_dir / ("dataplane" if leadership is None else f"dataplane-{s.serve_port}")
    plane = DataPlane(where, s.serve_host, s.serve_port,
                      cold_start_limit_s=s.serve_cold_start_s, haproxy=binary)
    return DataPlaneLoop(rt, plane, leadership)
