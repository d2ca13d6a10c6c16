"""The hub's workload routes: the pool's API, answered from the hub's record and by forwarding to the
member that holds each workload (under the hub's id). Tenants, tokens and the rest are the hub's own
pool routes (server/routers), so one token works at the hub as at a pool."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from gpupool.api.common import ErrorBody
from gpupool.api.nodes import ModelUsage, PoolSummary, TenantUsage
from gpupool.api.usage import UsageOut, UsageRowOut
from gpupool.api.workloads import STORED, EventOut, WorkloadCreated, WorkloadSpec, WorkloadUpdate
from gpupool.errors import Conflict, InvalidInput, NotFound, Unavailable
from gpupool.federation.hub import FEDERATION_ID_ENV, Hub
from gpupool.federation.members import MemberLink, MemberUnreachable
from gpupool.server.auth import Principal
from gpupool.server.deps import Who
from gpupool.server.orm import FedWorkloadRow


class MemberOut(BaseModel):
    name: str
    url: str
    region: str
    state: str = "up"
    note: str = ""
    capacity_gpus: float
    allocated_gpus: float
    pending: int
    running: int
    placed_here: int
    price_gpu_hour: float
    currency: str


def add_pools(summaries: list[dict[str, Any]], who: Principal) -> PoolSummary:
    """The members' summaries as one pool's. The hub reads them with its federation token, which sees
    every tenant: a tenant's answer counts its own workloads only (from each member's per-tenant
    rows: running and pending), as a member's own summary does."""
    models: dict[tuple[str, bool], dict[str, Any]] = {}
    tenants: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    for summary in summaries:
        for m in summary.get("by_model", []):
            into = models.setdefault((m["model"], m["simulated"]), {**m, "devices": 0, "allocated_gpus": 0.0})
            into["devices"] += m["devices"]
            into["allocated_gpus"] += m["allocated_gpus"]
        for t in summary.get("by_tenant", []):
            if not who.may_see(t["tenant"]):
                continue
            into = tenants.setdefault(t["tenant"], {"tenant": t["tenant"], "allocated_gpus": 0.0,
                                                    "running": 0, "pending": 0})
            for key in ("allocated_gpus", "running", "pending"):
                into[key] += t[key]
        if who.is_admin:
            for status, n in summary.get("workloads", {}).items():
                counts[status] = counts.get(status, 0) + int(n)
    if not who.is_admin:
        own = tenants.get(who.actor, {"running": 0, "pending": 0})
        counts = {status: int(own[status]) for status in ("running", "pending") if own[status]}
    for m in models.values():
        m["utilisation"] = m["allocated_gpus"] / m["devices"] if m["devices"] else 0.0
    capacity = sum(float(s.get("capacity_gpus", 0.0)) for s in summaries)
    allocated = sum(float(s.get("allocated_gpus", 0.0)) for s in summaries)
    return PoolSummary(
        simulated=any(s.get("simulated", False) for s in summaries),
        nodes=sum(int(s.get("nodes", 0)) for s in summaries),
        devices=sum(int(s.get("devices", 0)) for s in summaries),
        capacity_gpus=capacity, allocated_gpus=allocated,
        utilisation=allocated / capacity if capacity else 0.0,
        by_model=[ModelUsage.model_validate(m) for m in models.values()],
        by_tenant=[TenantUsage.model_validate(t) for t in tenants.values()],
        workloads=counts, fabric=False, federation=True)


class FederationUsageOut(BaseModel):
    """`gpupool usage` at a hub, per member and per region (each a total of that member's metering)."""

    members: dict[str, UsageRowOut]
    currencies: dict[str, str] = Field(default_factory=dict, description=(
        "each member's currency: a region's or the whole sum is given only where one currency is used"))
    regions: dict[str, UsageRowOut]
    total: UsageRowOut | None
    missing: list[str] = Field(description="members that did not answer: their usage is not in these sums")


_SUMMED = ("pods", "device_hours", "memory_gib_hours", "cost", "dedicated_cost", "saving")


def member_usage(hub: Hub, who: Principal, params: dict[str, str]) -> list[tuple[MemberLink, UsageOut]]:
    """Each answering member's usage for `who` (a tenant: its own, through the hub's token)."""
    out = []
    for link in hub.links:
        if not link.state.up:
            continue
        try:
            answer = link.call("GET", "/usage", tenant=who.tenant, params=params)
        except MemberUnreachable:
            continue
        if answer.status_code == 200:
            out.append((link, UsageOut.model_validate(answer.json())))
    return out


def merge_usage(parts: list[UsageOut]) -> UsageOut:
    """Rows with the same grouping key added up (priced only when every part's was); the window spans
    all parts. Conflict when the parts price in different currencies: their costs do not add up."""
    currencies = sorted({p.currency for p in parts})
    if len(currencies) > 1:
        raise Conflict(f"The member pools price in different currencies ({', '.join(currencies)}), so their "
                       "costs cannot be added up; GET /federation/usage (gpupool usage at the hub) gives "
                       "each member's total in its own currency.")
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for part in parts:
        for row in part.rows:
            data = row.model_dump()
            key = tuple(v for k, v in data.items() if k not in _SUMMED and k != "priced")
            into = rows.setdefault(key, {**data, **{k: 0 for k in _SUMMED}})
            into["priced"] = into["priced"] and data["priced"]
            for k in _SUMMED:
                into[k] += data[k]
    total = {**parts[0].total.model_dump(), **{k: sum(getattr(p.total, k) for p in parts) for k in _SUMMED},
             "priced": all(p.total.priced for p in parts)}
    return UsageOut(since_s=min(p.since_s for p in parts), until_s=max(p.until_s for p in parts),
                    by=parts[0].by, currency=parts[0].currency,
                    rows=[UsageRowOut.model_validate(r) for r in rows.values()],
                    total=UsageRowOut.model_validate(total))


class PlacementOut(BaseModel):
    """Where the hub's record places one workload (`state`: queued, placed, done or cancelled)."""

    id: str
    tenant: str
    state: str
    status: str
    member: str | None
    member_id: str | None
    moves: int
    held: str = Field(default="", description="a hold asked at the hub: user or admin ('' for none)")
    checkpoint_s: float | None = Field(default=None, description=(
        "the mark of the last checkpoint the hub holds of it (the next member resumes from it)"))


def hub_router(hub: Hub) -> APIRouter:
    router = APIRouter()
    errors: dict[int | str, dict[str, Any]] = {404: {"model": ErrorBody}}

    @router.post("/workloads", status_code=201, response_model=WorkloadCreated, tags=["federation"])
    def submit(spec: WorkloadSpec, who: Who) -> WorkloadCreated:
        return WorkloadCreated(id=hub.submit(who, spec), status="pending", tasks=None)

    @router.get("/workloads", tags=["federation"])
    def list_workloads(
        who: Who,
        status: Annotated[list[str] | None, Query(max_length=6)] = None,
        tenant: Annotated[list[str] | None, Query(max_length=64)] = None,
        fields: Annotated[str, Query(pattern="^(all|id)$")] = "all",
        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
        offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
        full: bool = False,
        id_prefix: Annotated[str | None, Query(max_length=64)] = None,
        workload_id: Annotated[list[str] | None, Query(max_length=64)] = None,
        since_s: Annotated[float | None, Query(ge=0, le=1e11)] = None,
        name: Annotated[str | None, Query(max_length=63)] = None,
        queue: Annotated[list[str] | None, Query(max_length=64)] = None,
        array_id: Annotated[list[str] | None, Query(max_length=64)] = None,
    ) -> dict[str, Any]:
        from sqlalchemy import func, select

        unsupported = [flag for flag, value in (("name", name), ("queue", queue), ("array_id", array_id))
                       if value]
        if unsupported:
            raise InvalidInput(f"A federation hub does not filter workloads by {', '.join(unsupported)} yet; "
                               "list them without it (gpupool ls) or ask the member that holds them.")

        wanted = {s.lower() for part in status or () for s in part.split(",") if s}
        tenants = [t for part in tenant or () for t in part.split(",") if t]
        query = select(FedWorkloadRow)
        if who.tenant is not None:
            query = query.where(FedWorkloadRow.tenant == who.tenant)
        elif tenants:
            query = query.where(FedWorkloadRow.tenant.in_(tenants))
        if wanted:
            query = query.where(FedWorkloadRow.status.in_(wanted))
        if id_prefix:
            query = query.where(FedWorkloadRow.id.startswith(id_prefix, autoescape=True))
        if workload_id:
            query = query.where(FedWorkloadRow.id.in_([w for part in workload_id for w in part.split(",")]))
        if since_s is not None:
            query = query.where(FedWorkloadRow.submit_s >= since_s)
        with hub.store.read() as session:
            total = int(session.scalar(select(func.count()).select_from(query.subquery())) or 0)
            rows = list(session.scalars(query.order_by(FedWorkloadRow.submit_s).offset(offset).limit(limit)))
            if fields == "id":
                return {"items": [], "ids": [r.id for r in rows], "total": total, "limit": limit,
                        "offset": offset}
            items = [view_of(row, row.view, full=full) for row in rows]
        return {"items": items, "ids": None, "total": total, "limit": limit, "offset": offset}

    @router.get("/workloads/{workload_id}", responses=errors, tags=["federation"])
    def get(workload_id: str, who: Who) -> dict[str, Any]:
        row = hub.row(who, workload_id)
        return view_of(row, hub.fresh_view(row), full=True)

    @router.post("/workloads/{workload_id}/cancel", responses=errors, tags=["federation"])
    def cancel(workload_id: str, who: Who) -> dict[str, Any]:
        row = hub.cancel(who, workload_id)
        return view_of(row, hub.fresh_view(row) if row.state != "cancelled" else row.view, full=True)

    conflict: dict[int | str, dict[str, Any]] = {**errors, 409: {"model": ErrorBody}}

    def act(who: Principal, workload_id: str, what: str, **kw: Any) -> Any:
        """A job-control act through the hub: the member's answer under the hub's id (its refusal as
        it said it), or the hub's own record when no member holds the workload yet."""
        row, answer = hub.control(who, workload_id, what, **kw)
        if answer is None:
            return view_of(row, row.view, full=True)
        if answer.status_code != 200:
            return JSONResponse(answer.json(), status_code=answer.status_code)
        return view_of(row, answer.json(), full=True)

    @router.post("/workloads/{workload_id}/hold", responses=conflict, tags=["federation"])
    def hold(workload_id: str, who: Who) -> Any:
        """Keep it from being placed (at the hub) or admitted (on the member holding it) until released."""
        return act(who, workload_id, "hold")

    @router.post("/workloads/{workload_id}/release", responses=conflict, tags=["federation"])
    def release(workload_id: str, who: Who) -> Any:
        return act(who, workload_id, "release")

    @router.post("/workloads/{workload_id}/requeue", responses=conflict, tags=["federation"])
    def requeue(workload_id: str, who: Who, hold: bool = False) -> Any:
        return act(who, workload_id, "requeue", hold_after=hold)

    @router.patch("/workloads/{workload_id}", responses=conflict, tags=["federation"])
    def update(workload_id: str, change: WorkloadUpdate, who: Who) -> Any:
        return act(who, workload_id, "update", change=change.model_dump(mode="json", exclude_none=True))

    @router.get("/workloads/{workload_id}/events", response_model=list[EventOut], responses=errors,
                tags=["federation"])
    def events(workload_id: str, who: Who) -> list[EventOut]:
        row = hub.row(who, workload_id)
        out = [EventOut(id=-e.id, workload_id=row.id, pod_id="", from_status="", to_status="",
                        reason=e.reason, reason_text="", message=e.message, at_s=e.at_s)
               for e in hub.events(row.id)]
        answer = _forward(hub, row, "GET", "events", None)
        if answer is not None and answer.status_code == 200:
            out += [EventOut.model_validate({**e, "workload_id": row.id}) for e in answer.json()]
        return sorted(out, key=lambda e: e.at_s)

    @router.get("/workloads/{workload_id}/logs", responses=errors, tags=["federation"])
    def logs(workload_id: str, who: Who, request: Request) -> Any:
        row = hub.row(who, workload_id)
        answer = _forward(hub, row, "GET", "logs", dict(request.query_params))
        if answer is None:
            raise NotFound(f"Workload {workload_id!r} has no logs yet: it is not placed on a member.",
                           workload_id=workload_id)
        body = answer.json()
        if answer.status_code == 200:
            body["workload_id"] = row.id
        return JSONResponse(body, status_code=answer.status_code)

    @router.get("/federation/workloads/{workload_id}", response_model=PlacementOut, responses=errors,
                tags=["federation"])
    def placement(workload_id: str, who: Who) -> PlacementOut:
        row = hub.row(who, workload_id)
        carried = hub.checkpoint_mark(row.id)
        return PlacementOut(id=row.id, tenant=row.tenant, state=row.state, status=row.status,
                            member=row.member, member_id=row.member_id, moves=row.moves, held=row.held,
                            checkpoint_s=carried)

    @router.get("/usage", response_model=UsageOut, tags=["federation"])
    def usage(who: Who, request: Request) -> UsageOut:
        """The members' metering added up (rows with the same key summed); members that do not answer
        are left out and named in each row's absence by GET /federation/usage."""
        parts = member_usage(hub, who, dict(request.query_params))
        if not parts:
            raise Unavailable("No member answers for its usage now; try again later (gpupool fed ls).")
        return merge_usage([u for _, u in parts])

    @router.get("/federation/usage", response_model=FederationUsageOut, tags=["federation"])
    def federation_usage(who: Who, request: Request) -> FederationUsageOut:
        parts = member_usage(hub, who, dict(request.query_params))
        answered = {link.name for link, _ in parts}
        regions: dict[str, list[UsageOut]] = {}
        for link, part in parts:
            regions.setdefault(link.config.region, []).append(part)
        def summed(found: list[UsageOut]) -> UsageRowOut | None:  # none across currencies
            return merge_usage(found).total if len({u.currency for u in found}) == 1 else None

        sums = {region: summed(found) for region, found in regions.items()}
        return FederationUsageOut(
            members={link.name: part.total for link, part in parts},
            currencies={link.name: part.currency for link, part in parts},
            regions={region: total for region, total in sums.items() if total is not None},
            total=summed([u for _, u in parts]) if parts else None,
            missing=[link.name for link in hub.links if link.name not in answered])

    @router.get("/pool", response_model=PoolSummary, tags=["federation"])
    def pool(who: Who) -> PoolSummary:
        """The members' summaries as last read, added up (the dashboard's overview and `gpupool top`
        at the hub show the federation's capacity); a tenant sees only its own row per tenant."""
        return add_pools([link.state.summary for link in hub.links if link.state.up and link.state.summary],
                         who)

    @router.get("/federation/members", response_model=list[MemberOut], tags=["federation"])
    def members(who: Who) -> list[MemberOut]:
        """Any token of the hub: names, regions, capacity, queues and prices are no tenant's secret;
        the members' addresses and why one is down (which may name them) are the admin's."""
        table = member_table(hub)
        if who.is_admin:
            return table
        return [m.model_copy(update={"url": "", "note": "unreachable" if m.note else ""}) for m in table]

    return router


def member_table(hub: Hub) -> list[MemberOut]:
    from sqlalchemy import func, select

    with hub.store.read() as session:
        placed = dict(session.execute(select(FedWorkloadRow.member, func.count()).where(
            FedWorkloadRow.state == "placed").group_by(FedWorkloadRow.member)).tuples().all())
    now = hub.clock()
    return [MemberOut(name=link.name, url=link.config.url, region=link.config.region,
                      state="up" if link.state.up else "down", note=link.state.note,
                      capacity_gpus=link.state.capacity_gpus, allocated_gpus=link.state.allocated_gpus,
                      pending=link.state.pending, running=link.state.running,
                      placed_here=int(placed.get(link.name, 0)),
                      price_gpu_hour=link.config.price_now(now), currency=link.config.currency)
            for link in hub.links]


def _forward(hub: Hub, row: FedWorkloadRow, method: str, leaf: str, params: Any) -> Any:
    link = hub.by_name.get(row.member or "")
    if link is None or not row.member_id:
        return None
    try:
        return link.call(method, f"/workloads/{row.member_id}/{leaf}", tenant=row.tenant, params=params)
    except MemberUnreachable as exc:
        raise Unavailable(f"The member holding {row.id} does not answer now ({exc}); "
                          "try again later.") from None


def view_of(row: FedWorkloadRow, view: dict[str, Any] | None, *, full: bool) -> dict[str, Any]:
    """The workload as the hub shows it: the member's copy under the hub's id, or, before a member
    holds it, a pending workload that says why."""
    if view is not None and row.state in ("placed", "done", "cancelled"):
        out = dict(view)
        out["id"] = row.id
        if row.state == "cancelled":
            out["status"] = "cancelled"
        if "spec" in out:
            env = {k: v for k, v in out["spec"].get("env", {}).items() if k != FEDERATION_ID_ENV}
            out["spec"] = {**out["spec"], "env": env}
        if not full:
            out.pop("spec", None)
        return out
    spec = WorkloadSpec.model_validate(row.spec, context=STORED)
    out = {
        "id": row.id, "name": spec.name, "tenant": row.tenant, "queue": spec.queue,
        "status": "cancelled" if row.state == "cancelled" else "pending", "priority": spec.priority,
        "attempt": 0, "reason": "federation_queued" if row.state == "queued" else "federation_" + row.state,
        "message": "at the hub, to be offered to a member" if row.state == "queued" else "",
        "exit_code": None, "submit_s": row.submit_s, "admitted_s": None, "started_s": None,
        "finished_s": None, "simulated": False, "pods": [],
        "request": {"replicas": spec.replicas, "resources": spec.resources.model_dump(mode="json"),
                    "priority_class": spec.priority_class, "time_limit_s": spec.time_limit_s,
                    "topology": spec.topology},
    }
    out["held"] = row.held
    if full:
        out["spec"] = spec.model_dump(mode="json")
    return out

