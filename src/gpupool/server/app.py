"""The FastAPI application: routes under /api/v1, one error shape, /metrics, and the loop's lifetime."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

import gpupool
from gpupool.api.common import ErrorBody
from gpupool.errors import Forbidden
from gpupool.providers.base import Provider
from gpupool.server import apidocs, http_errors, ui
from gpupool.server.auth import Scope
from gpupool.server.bodylimit import BodyLimit
from gpupool.server.dataplane import loop as dataplane_loop
from gpupool.server.dataplane.metrics import ServiceTrafficCollector
from gpupool.server.fastpath import SubmitFastPath
from gpupool.server.leader import Leadership, WakeRelay
from gpupool.server.loops.control import ControlLoop
from gpupool.server.loops.history import HistorySampler
from gpupool.server.loops.serving import ServingLoop
from gpupool.server.metrics import Metrics, RequestTimer
from gpupool.server.ratelimit import TenantGate
from gpupool.server.routers import (
    audit,
    calls,
    config,
    health,
    images,
    nodes,
    session,
    tenants,
    usage,
    workloads,
)
from gpupool.server.routers import events as event_routes
from gpupool.server.routers import execs as exec_routes
from gpupool.server.routers import fabric as fabric_routes
from gpupool.server.routers import history as history_routes
from gpupool.server.routers import secrets as secret_routes
from gpupool.server.routers import servers as server_routes
from gpupool.server.routers import services as service_routes
from gpupool.server.runtime import Runtime
from gpupool.server.services import node_faults
from gpupool.server.services.submit_writer import SubmitWriter
from gpupool.server.serving import history as service_history

API_PREFIX = "/api/v1"


def create_app(rt: Runtime, *, run_loop: bool = True, hub_router: APIRouter | None = None,
               leadership: Leadership | None = None,
               reopen_provider: Callable[[], Provider] | None = None) -> FastAPI:
    """An app over `rt`; with run_loop the control loop starts and stops with the app. A federation
    hub (src/gpupool/federation) passes its workload routes in `hub_router`: they answer before the
    pool's own, and the submission fast path (which writes to this pool's store) is left out. With
    `leadership` (several servers on one store) the loop acts only while this server leads."""
    metrics = Metrics(rt)
    if leadership is not None:
        metrics.is_leader.set(0)
        leadership.on_renew = metrics.lease_renew_seconds.observe
    relay = WakeRelay(rt.store, leadership) if leadership is not None and not rt.store.is_sqlite else None
    if relay is not None:  # --ha: a follower's write wakes the leader's loop (LISTEN/NOTIFY)
        rt.wake = relay.wake
        relay.on_woken = metrics.follower_wakes.inc
    loop = ControlLoop(rt, metrics, leadership, reopen_provider)
    writer = SubmitWriter(rt)
    sampler = HistorySampler(rt)
    serving = ServingLoop(rt, leadership)  # inference services' replicas and probes (docs/services.md)
    dataplane = dataplane_loop.from_settings(rt, leadership)  # --serve-port: docs/serving-dataplane.md
    if dataplane is not None:
        metrics.registry.register(ServiceTrafficCollector(dataplane))
    sampler.extra = lambda: service_history.points(rt, dataplane.live() if dataplane is not None else {})

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        node_faults.restore(rt)  # injected faults outlive a restart: back before the loop's first cycle
        if run_loop:
            loop.start()
            if leadership is not None:
                leadership.start()  # after the loop: it wakes the loop when it takes the lease
            if relay is not None:
                relay.start()
            sampler.start()  # a thread of its own: a minute's sample never waits on a cycle
            serving.start()
            if dataplane is not None:
                dataplane.start()
        try:
            yield
        finally:
            writer.stop()
            if run_loop:
                sampler.stop()
                if dataplane is not None:
                    dataplane.stop()
                serving.stop()
                loop.stop()
                if relay is not None:
                    relay.stop()
                if leadership is not None:
                    leadership.stop()  # after the loop stopped acting: the lease is released
            rt.auth.flush()  # tokens' last use and refused logins still held in memory

    app = FastAPI(
        title="gpupool",
        version=gpupool.__version__,
        summary="Pool accelerators and schedule work onto slices of them.",
        lifespan=lifespan,
        docs_url=None,  # apidocs serves /docs and /redoc from the pool itself, not a CDN
        redoc_url=None,
        openapi_url=f"{API_PREFIX}/openapi.json",
    )
    app.state.runtime = rt
    app.state.metrics = metrics
    app.state.loop = loop
    app.state.leadership = leadership
    app.state.wake_relay = relay
    app.state.submit_writer = writer
    app.state.history_sampler = sampler
    app.state.serving = serving
    app.state.dataplane = dataplane
    app.state.stopping = lambda: False  # the server that serves the app sets its own (event streams end)
    http_errors.install(app)
    too_large: dict[int | str, dict[str, Any]] = {
        413: {"model": ErrorBody, "description": "the request body is larger than the pool's limit"}}
    counted = {**too_large, 429: {"model": ErrorBody, "description": (
        "too_many_requests: the tenant sent more than this server's limit for each tenant "
        "(Retry-After says when to send it again); too_many_pending: at the tenant's max_pending")}}
    if hub_router is not None:
        app.include_router(hub_router, prefix=API_PREFIX, responses=dict(counted))
    app.include_router(health.router, prefix=API_PREFIX, responses=dict(too_large))
    for router in (workloads.router, nodes.router, tenants.router, audit.router,
                   config.router, session.router, usage.router, calls.router, fabric_routes.router,
                   images.router, secret_routes.router, history_routes.router, event_routes.router,
                   service_routes.router, server_routes.router, exec_routes.router):
        app.include_router(router, prefix=API_PREFIX, responses=dict(counted))  # tenants' requests counted
    app.include_router(health.router, include_in_schema=False)  # /health at the root too
    apidocs.install(app, f"{API_PREFIX}/openapi.json")
    ui.install(app)  # the dashboard at / and /ui/, a client of the routes above

    @app.get("/metrics", include_in_schema=False)
    def prometheus(request: Request) -> Response:
        if not rt.settings.metrics_public:  # it names every tenant and queue: admin or metrics tokens
            client = request.client
            who = rt.auth.principal(request.headers.get("authorization"), scope=Scope.METRICS,
                                    remote=client.host if client else "")
            request.state.principal = who  # its 403 below is audited
            if not who.is_admin:  # a tenant's metrics token (made before they were the admin's) too
                raise Forbidden("/metrics needs the admin token or an admin metrics token "
                                "(gpupool token create --admin --scope metrics).")
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(RequestTimer, metrics=metrics)
    if hub_router is None:
        app.add_middleware(SubmitFastPath, rt=rt, writer=writer, metrics=metrics)
    app.add_middleware(BodyLimit, limit_bytes=rt.settings.max_request_body_bytes)
    app.add_middleware(TenantGate, rt=rt)  # outermost: a tenant past its rate costs the least here
    return app
