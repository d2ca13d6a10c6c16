"""Fabric routes: the live fabric (every token reads it), link failure and repair, telemetry (admin)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gpupool.api.common import ErrorBody
from gpupool.api.fabric import FabricOut, LinkChangeOut, LinkRequest, TelemetryIn
from gpupool.core.fabric.telemetry import PortLoad
from gpupool.server.deps import Rt, Who
from gpupool.server.services import fabric_links, fabric_listing

router = APIRouter(prefix="/fabric", tags=["fabric"], responses={
    401: {"model": ErrorBody}, 404: {"model": ErrorBody},
    409: {"model": ErrorBody, "description": "the server runs without a fabric (gpupool up --fabric FILE)"},
})
_ADMIN: dict[int | str, dict[str, object]] = {403: {"model": ErrorBody}, 422: {"model": ErrorBody}}
WorkloadQuery = Annotated[str | None, Query(min_length=1, max_length=64, description=(
    "also give this workload's path (a tenant: its own only)"))]


@router.get("", response_model=FabricOut)
def get_fabric(rt: Rt, who: Who, workload: WorkloadQuery = None) -> FabricOut:
    """The fabric the pool runs on: `levels` (switches per tier: leaf, spine, core), `switches`,
    `nodes` (each pool node's fabric host, leaf domain, spine group and ports), `links` (every cable
    with `failed`, `degraded`, `load`, `available_gbps` and how many running `gangs` it carries) and,
    with `?workload=ID`, `gang`: that workload's nodes, domain, hops, bottleneck cable and its
    bandwidth, and every cable of its routes (link ids are NODE:PORT). Tenants read it too; a
    gang's path only for their own workloads."""
    return fabric_listing.fabric_out(rt, who, workload)


def _answer(change: fabric_links.LinkChange, rt: Rt) -> LinkChangeOut:
    fabric = fabric_links.live(rt)
    effects = change.effects
    return LinkChangeOut(links=[fabric_listing.link_id(fabric, key) for key in change.links],
                         changed=change.changed, requeued=effects.requeued, congested=effects.congested,
                         slowed=effects.slowed)


@router.post("/links/fail", response_model=LinkChangeOut, responses=_ADMIN)
def fail_link(body: LinkRequest, rt: Rt, who: Who) -> LinkChangeOut:
    """Fail one cable (admin): routes are recomputed (incrementally between switches), the
    scheduler stops using it, gangs cut off are requeued and gangs it slowed are told their new
    bottleneck (an event each)."""
    return _answer(fabric_links.set_link(rt, who, body.link, failed=True), rt)


@router.post("/links/heal", response_model=LinkChangeOut, responses=_ADMIN)
def heal_link(body: LinkRequest, rt: Rt, who: Who) -> LinkChangeOut:
    """Put a failed cable back (admin): routes recomputed, gangs whose bottleneck changed told."""
    return _answer(fabric_links.set_link(rt, who, body.link, failed=False), rt)


@router.post("/telemetry", response_model=LinkChangeOut, responses=_ADMIN)
def telemetry(body: TelemetryIn, rt: Rt, who: Who) -> LinkChangeOut:
    """Port load and error counts (admin; e.g. from perfquery on the subnet manager's host): each
    cable takes its busier end's load, an end that saw link_downed fails its cable (as fail-link
    does), and with fabric.migrate_on_congestion the gangs' bottleneck loads go to the next
    scheduling cycle, which checkpoint-requeues a gang whose bottleneck stayed above the threshold
    for fabric.congestion_for, to be placed away from it (`congested`: the gangs above it now)."""
    loads = {(p.node, p.port): PortLoad(p.node, p.port, 0.0, 0.0, p.utilization, dict(p.errors))
             for p in body.ports}
    return _answer(fabric_links.telemetry(rt, who, loads), rt)
