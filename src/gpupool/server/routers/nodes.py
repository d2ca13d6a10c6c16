"""Node routes: list, get, cordon, uncordon, drain, fail, heal; and the pool summary."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request, Response

from gpupool.api.common import ErrorBody
from gpupool.api.nodes import NodeOut, PoolSummary
from gpupool.server.deps import Rt, Who
from gpupool.server.services import node_faults, node_listing, pool
from gpupool.server.services import nodes as service

router = APIRouter(tags=["nodes"], responses={401: {"model": ErrorBody}})
NodeName = Annotated[str, Path(min_length=1, max_length=255)]
DeviceIndex = Annotated[int | None, Query(ge=0, le=1023, description="a device index; none = the whole node")]


@router.get("/nodes", response_model=list[NodeOut],
            responses={304: {"description": "unchanged since the ETag sent as If-None-Match"}})
def list_nodes(rt: Rt, who: Who, if_none_match: Annotated[str | None, Header()] = None) -> Response:
    """Every node with its devices' allocation; the answer's ETag lets a poller skip an unchanged
    listing (send it back as If-None-Match: 304, no body)."""
    found = node_listing.listing(rt, who)
    headers = {"ETag": found.etag, "Cache-Control": "private, no-cache"}
    if node_listing.etag_matches(if_none_match, found.etag):
        return Response(status_code=304, headers=headers)
    return Response(found.body, media_type="application/json", headers=headers)


@router.get("/nodes/{name}", response_model=NodeOut, responses={404: {"model": ErrorBody}})
def get_node(name: NodeName, rt: Rt, who: Who) -> NodeOut:
    return service.get_node(rt, who, name)


@router.post("/nodes/{name}/cordon", response_model=NodeOut,
             responses={403: {"model": ErrorBody}, 404: {"model": ErrorBody}})
def cordon(name: NodeName, rt: Rt, who: Who) -> NodeOut:
    return service.set_cordon(rt, who, name, cordoned=True)


@router.post("/nodes/{name}/uncordon", response_model=NodeOut,
             responses={403: {"model": ErrorBody}, 404: {"model": ErrorBody}})
def uncordon(name: NodeName, rt: Rt, who: Who) -> NodeOut:
    return service.set_cordon(rt, who, name, cordoned=False)


@router.post("/nodes/{name}/drain", response_model=NodeOut,
             responses={403: {"model": ErrorBody}, 404: {"model": ErrorBody}})
def drain(name: NodeName, rt: Rt, who: Who, now: Annotated[bool, Query()] = False) -> NodeOut:
    """Stop new placements and let the running work finish; `now=true` requeues it at once."""
    return service.drain(rt, who, name, now=now)


@router.post("/nodes/{name}/fail", response_model=NodeOut,
             responses={403: {"model": ErrorBody}, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
def fail(name: NodeName, rt: Rt, who: Who, device: DeviceIndex = None) -> NodeOut:
    """Inject a fault on a simulated or fake node (or one device): it turns unhealthy and its work is
    evicted. Refused (409) on real hardware. Kept across server restarts until healed."""
    return node_faults.fail(rt, who, name, device)


@router.post("/nodes/{name}/heal", response_model=NodeOut,
             responses={403: {"model": ErrorBody}, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
def heal(name: NodeName, rt: Rt, who: Who, device: DeviceIndex = None) -> NodeOut:
    """Clear the injected fault of one device, or without `device` every injected fault of the node."""
    return node_faults.heal(rt, who, name, device)


@router.get("/pool", response_model=PoolSummary)
def summary(request: Request, rt: Rt, who: Who) -> PoolSummary:
    """The pool at a glance; `router` says which router serves services (where --serve-port is set)."""
    dataplane = request.app.state.dataplane
    out = pool.summary(rt, who)
    return out if dataplane is None else out.model_copy(update={"router": dataplane.router_note})
