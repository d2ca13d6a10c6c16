"""Remote functions through a hub (`@pool.function`, `pool.session` against the hub's URL): the hub
opens each session on the member its placement policy ranks first that takes it, as the caller's
tenant, and forwards the session's calls there. A session keeps its member's id; a call's id at the
hub is the session's id and the member's call id joined by a dot, so a call is found without a
table of its own. The worker pod talks to its member only (its call token is the member's). A
session is not moved when its member fails: its calls fail as when a worker is lost."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError

from gpupool.api.calls import MAX_WAIT_S, SessionCreate
from gpupool.api.workloads import WorkloadSpec
from gpupool.errors import NotFound, Unavailable
from gpupool.federation.hub import Hub
from gpupool.federation.members import MemberLink, MemberUnreachable
from gpupool.federation.placement import candidates
from gpupool.server.auth import Principal
from gpupool.server.deps import Who
from gpupool.server.orm import FedSessionRow
from gpupool.server.services.calls import refuse_admin_session

_SEP = "."


def calls_router(hub: Hub) -> APIRouter:
    router = APIRouter(prefix="/calls", tags=["federation"])

    @router.post("/sessions", status_code=201)
    def open_session(body: SessionCreate, who: Who) -> Any:
        refuse_admin_session(who, body.tenant)  # the member sees the tenant, not the admin, behind the hub
        tenant = who.tenant_for(body.tenant)
        spec = WorkloadSpec.model_validate({  # what placement ranks members by: the session's workload
            "command": ["python3", "-m", "gpupool.remote.worker"], "queue": body.queue,
            "priority": body.priority, "priority_class": body.priority_class,
            "time_limit_s": body.time_limit_s, "image": body.image,
            "resources": body.resources.model_dump(mode="json")})
        ranked = candidates(hub.config, hub.links, tenant, spec, hub.clock())
        if not ranked.members:
            raise Unavailable(f"No member can take this session under {ranked.policy}: "
                              + "; ".join(ranked.refused))
        sent = body.model_dump(mode="json", exclude_none=True)
        sent.pop("tenant", None)  # the member's tenant is the one the hub's token names
        answer: Any = None
        for name in ranked.members:
            link = hub.by_name[name]
            try:
                answer = link.call("POST", "/calls/sessions", tenant=tenant, json=sent)
            except MemberUnreachable:
                continue
            if answer.status_code != 201:
                continue
            out = dict(answer.json())
            try:
                with hub.store.write() as session:
                    session.add(FedSessionRow(id=out["id"], tenant=tenant, member=name, at_s=hub.clock()))
            except IntegrityError:  # another member's session of the same id (12 random hex digits)
                link.call("POST", f"/calls/sessions/{out['id']}/close", tenant=tenant)
                continue
            return _session_out(out)
        if answer is None:
            raise Unavailable("No member answers now; try again later (gpupool fed ls).")
        return JSONResponse(answer.json(), status_code=answer.status_code)

    @router.get("/sessions/{session_id}")
    def get_session(session_id: str, who: Who) -> Any:
        return _forward(hub, who, session_id, "GET", f"/calls/sessions/{session_id}", None, _session_out)

    @router.post("/sessions/{session_id}/calls", status_code=201)
    def submit_call(session_id: str, body: dict[str, Any], who: Who,
                    wait_s: float = Query(0.0, ge=0, le=MAX_WAIT_S)) -> Any:
        return _forward(hub, who, session_id, "POST", f"/calls/sessions/{session_id}/calls",
                        {"wait_s": wait_s}, _call_out, json=body, wait_s=wait_s)

    @router.post("/sessions/{session_id}/close")
    def close_session(session_id: str, who: Who) -> Any:
        return _forward(hub, who, session_id, "POST", f"/calls/sessions/{session_id}/close", None,
                        _session_out)

    @router.get("/{call_id}")
    def get_call(call_id: str, who: Who, wait_s: float = Query(0.0, ge=0, le=MAX_WAIT_S)) -> Any:
        session_id, member_call = _split(call_id)
        return _forward(hub, who, session_id, "GET", f"/calls/{member_call}", {"wait_s": wait_s}, _call_out,
                        wait_s=wait_s)

    @router.post("/{call_id}/cancel")
    def cancel_call(call_id: str, who: Who) -> Any:
        session_id, member_call = _split(call_id)
        return _forward(hub, who, session_id, "POST", f"/calls/{member_call}/cancel", None, _call_out)

    return router


def _split(call_id: str) -> tuple[str, str]:
    session_id, sep, member_call = call_id.partition(_SEP)
    if not sep or not member_call:
        raise NotFound(f"No call {call_id!r} at this hub; a call's id is the one its submission answered.")
    return session_id, member_call


def _session(hub: Hub, who: Principal, session_id: str) -> tuple[FedSessionRow, MemberLink]:
    with hub.store.read() as session:
        row = session.get(FedSessionRow, session_id)
        if row is None or not who.may_see(row.tenant):  # another tenant's reads as unknown
            raise NotFound(f"No session {session_id!r} at this hub.", session=session_id)
        session.expunge(row)
    link = hub.by_name.get(row.member)
    if link is None:
        raise NotFound(f"Session {session_id!r} was on member {row.member!r}, which the federation no longer "
                       "lists.", session=session_id)
    return row, link


def _forward(hub: Hub, who: Principal, session_id: str, method: str, path: str, params: Any,
             shape: Any, *, json: Any = None, wait_s: float = 0.0) -> Any:
    row, link = _session(hub, who, session_id)
    try:
        answer = link.call(method, path, tenant=row.tenant, json=json, params=params, timeout_s=wait_s + 10.0)
    except MemberUnreachable as exc:
        raise Unavailable(f"The member holding session {session_id} does not answer now ({exc}); "
                          "try again later.") from None
    body = answer.json()
    if answer.status_code >= 300:
        return JSONResponse(body, status_code=answer.status_code)
    if body.get("session_id", session_id) != session_id and "id" in body and shape is _call_out:
        raise NotFound(f"No call of session {session_id!r} with that id.")  # a call of another session
    return JSONResponse(shape(body), status_code=answer.status_code)


def _call_out(call: dict[str, Any]) -> dict[str, Any]:
    """A member's call under the hub's id: its session's id, a dot, the member's call id."""
    return {**call, "id": f"{call['session_id']}{_SEP}{call['id']}"}


def _session_out(session: dict[str, Any]) -> dict[str, Any]:
    out = dict(session)
    if out.get("call"):
        out["call"] = _call_out(out["call"])
    return out
