"""Inference services (docs/services.md): create, list, show, update, scale and delete; a tenant's
own only (another tenant's service does not exist for it)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from gpupool.api.common import NAME_PATTERN, ErrorBody
from gpupool.api.services import (
    PartnersOut,
    ScaleRequest,
    ServiceHistoryOut,
    ServiceOut,
    ServiceSpec,
    ServiceUpdate,
)
from gpupool.server.dataplane.loop import DataPlaneLoop
from gpupool.server.deps import Rt, Who
from gpupool.server.serving import history as service_history
from gpupool.server.serving import services as cases

router = APIRouter(tags=["services"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody},
                                                 404: {"model": ErrorBody}, 422: {"model": ErrorBody}})
NameParam = Annotated[str, Path(min_length=1, max_length=63, pattern=NAME_PATTERN)]
TenantQuery = Annotated[str | None, Query(max_length=63, description="admin only: whose service")]


@router.post("/services", status_code=201, response_model=ServiceOut, responses={409: {"model": ErrorBody}})
def create_service(body: ServiceSpec, request: Request, rt: Rt, who: Who) -> ServiceOut:
    """Create a service; the controller starts its replicas (each one workload with its slice)."""
    return _with_url(request, cases.create(rt, who, body))


@router.get("/services", response_model=list[ServiceOut])
def list_services(request: Request, rt: Rt, who: Who, tenant: TenantQuery = None) -> list[ServiceOut]:
    """The caller's services, each with the router's live numbers; the admin's: every tenant's, or
    `tenant`'s."""
    return _with_live(request, cases.list_services(rt, who, tenant))


@router.get("/services/{name}", response_model=ServiceOut)
def get_service(name: NameParam, request: Request, rt: Rt, who: Who,
                tenant: TenantQuery = None) -> ServiceOut:
    """One service with its replicas (status, readiness, endpoint), its recent events and the router's
    live numbers."""
    return _with_live(request, [cases.get(rt, who, name, tenant)])[0]


def _with_live(request: Request, services: list[ServiceOut]) -> list[ServiceOut]:
    """Each with where it answers and the router's numbers now (none without a data plane)."""
    dataplane: DataPlaneLoop | None = request.app.state.dataplane
    if dataplane is None:
        return services
    live = dataplane.live()
    return [s.model_copy(update={"url": _url(dataplane, s), "live": live.get(f"{s.tenant}/{s.name}")})
            for s in services]


def _with_url(request: Request, service: ServiceOut) -> ServiceOut:
    """With the address its requests go to, where the pool serves a data plane."""
    dataplane: DataPlaneLoop | None = request.app.state.dataplane
    return service if dataplane is None else service.model_copy(update={"url": _url(dataplane, service)})


def _url(dataplane: DataPlaneLoop, service: ServiceOut) -> str:
    """The data plane's address of `service`: /s/<tenant>/<service>/ (dataplane.model.SERVICE_KEY)."""
    return f"{dataplane.url}/s/{service.tenant}/{service.name}/"


@router.get("/services/{name}/partners", response_model=PartnersOut)
def service_partners(name: NameParam, rt: Rt, who: Who, tenant: TenantQuery = None) -> PartnersOut:
    """Where the paired service's ready replicas answer now (prefill/decode pairs); the caller's own
    service only."""
    return cases.partners(rt, who, name, tenant)


@router.get("/services/{name}/history", response_model=ServiceHistoryOut)
def service_history_page(name: NameParam, request: Request, rt: Rt, who: Who, tenant: TenantQuery = None,
                         range: Annotated[str, Query(max_length=8, description="1h, 24h or 7d")] = "1h",
                         ) -> ServiceHistoryOut:
    """Its page on the dashboard: replicas ready and desired, requests/s, in flight and latency over
    the range, the router's live numbers, and its scale events; the caller's own service only."""
    dataplane = request.app.state.dataplane
    return service_history.query(rt, who, name, tenant, range, rt.clock(),
                                 None if dataplane is None else dataplane.live(),
                                 "none" if dataplane is None else dataplane.router)


@router.patch("/services/{name}", response_model=ServiceOut, responses={409: {"model": ErrorBody}})
def update_service(name: NameParam, body: ServiceUpdate, request: Request, rt: Rt, who: Who,
                   tenant: TenantQuery = None) -> ServiceOut:
    """Change fields of its spec; a change of what replicas run rolls them over within the rollout's
    max_surge and max_unavailable."""
    return _with_url(request, cases.update_spec(rt, who, name, body, tenant))


@router.post("/services/{name}/scale", response_model=ServiceOut, responses={409: {"model": ErrorBody}})
def scale_service(name: NameParam, body: ScaleRequest, request: Request, rt: Rt, who: Who,
                  tenant: TenantQuery = None) -> ServiceOut:
    """Set its desired replicas (clamped to its bounds); with expected_version, only if it is unchanged."""
    return _with_url(request, cases.scale(rt, who, name, body, tenant))


@router.delete("/services/{name}", response_model=ServiceOut)
def delete_service(name: NameParam, rt: Rt, who: Who, tenant: TenantQuery = None) -> ServiceOut:
    """Stop its replicas and delete it."""
    return cases.remove(rt, who, name, tenant)
