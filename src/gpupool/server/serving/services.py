"""Service use cases behind /v1/services: create, list, show, update, scale and delete.

The controller (controller.py) does the rest: it makes the replicas match the row. Every write
that depends on what was read states the version it read (a compare-and-set on `version`).
"""

from __future__ import annotations

import contextlib
import secrets
from typing import Any

from pydantic import ValidationError
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.api.services import (
    PartnersOut,
    ReplicaOut,
    ScaleRequest,
    ServiceEventOut,
    ServiceOut,
    ServiceSpec,
    ServiceUpdate,
)
from gpupool.core.model import WorkloadStatus
from gpupool.errors import Conflict, InvalidInput, NotFound
from gpupool.server.auth import Principal
from gpupool.server.orm import (
    PodRow,
    QueueRow,
    ServiceEventRow,
    ServiceReplicaRow,
    ServiceRow,
    TenantRow,
    WorkloadRow,
)
from gpupool.server.runtime import Runtime
from gpupool.server.services import audit
from gpupool.server.services import workloads as workload_cases
from gpupool.server.services.secrets import check_user as check_secret_user
from gpupool.server.serving.endpoints import clamp, ready_endpoints, set_desired
from gpupool.server.serving.specs import acting_for, replica_spec, service_class

SHOWN_EVENTS = 50
RUN_FIELDS = frozenset(
    {
        "command",
        "resources",
        "port_env",
        "env",
        "workdir",
        "image",
        "constraints",
        "mounts",
        "secrets",
        "priority_class",
        "readiness",
        "liveness",
    }
)
"""Fields whose change makes new replicas (a rollout); the others apply to the ones running."""
CODE_FIELDS = frozenset({"command", "env", "workdir", "image", "mounts", "port_env"})
"""What the replicas run and with: the admin changing one makes the service's work the admin's too
(`on_behalf`); resources, probes, class or placement do not."""


def new_service_id() -> str:
    return "s-" + secrets.token_hex(6)


def create(rt: Runtime, who: Principal, spec: ServiceSpec) -> ServiceOut:
    """Store the service (its replicas follow from the controller); 409 when the tenant has one of
    that name, 404 for an unknown queue, 422 for what a replica could never run as."""
    tenant = who.tenant_for(spec.tenant)
    if spec.on_behalf is not None:
        raise InvalidInput("on_behalf is set by the server on a service the admin creates for a tenant; "
                           "leave it out.", field="on_behalf")
    check_secret_user(who, tenant, spec.secrets)
    spec = spec.model_copy(update={"on_behalf": who.on_behalf})  # its replicas' account (specs.py)
    chosen = service_class(rt.config, spec.priority_class, tenant, who.max_priority)
    _check_runnable(rt, tenant, spec, chosen)
    now = rt.clock()
    stored = {
        **spec.model_dump(mode="json", exclude_defaults=True),
        "tenant": tenant,
        "priority_class": chosen,
    }
    try:
        _store_new(rt, who, tenant, spec, stored, now)
    except IntegrityError:  # created at the same moment by another request (the unique index)
        raise _taken(tenant, spec.name) from None
    rt.wake.set()
    return get(rt, who, spec.name, tenant)


def _taken(tenant: str, name: str) -> Conflict:
    return Conflict(f"Tenant {tenant} already has a service {name!r}; change it with `gpupool service "
                    f"update {name}` or delete it first.", service=name)


def _store_new(rt: Runtime, who: Principal, tenant: str, spec: ServiceSpec, stored: dict[str, Any],
               now: float) -> None:
    with rt.store.write() as session:
        if session.get(QueueRow, (tenant, spec.queue)) is None:
            raise NotFound(
                f"Tenant {tenant} has no queue {spec.queue!r}; see `gpupool queue ls`.", queue=spec.queue
            )
        if _find(session, tenant, spec.name) is not None:
            raise _taken(tenant, spec.name)
        check_partner(session, tenant, spec)
        row = ServiceRow(
            id=new_service_id(),
            tenant=tenant,
            name=spec.name,
            spec=stored,
            generation=1,
            version=1,
            desired=spec.initial_replicas,
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            target_concurrency=spec.target_concurrency,
            target_rps=spec.target_rps,
            public=spec.public,
            state="pending",
            last_probe_error="",
            created_s=now,
            updated_s=now,
        )
        session.add(row)
        session.flush()
        event(session, row.id, "created", f"created with {row.desired} replica(s) wanted", now)
        if who.is_admin:
            audit.record(session, who, "service.create", f"{tenant}/{spec.name}", now)


def check_partner(session: Session, tenant: str, spec: ServiceSpec) -> None:
    """A pair's partner is looked up among the tenant's own services only (another tenant's service of
    that name is never it). It may not exist yet (either half may be created first); when it does, it
    must have the opposite role. 422 otherwise.

    The tenant's row is locked first (PostgreSQL runs transactions concurrently): two halves created
    at once are checked one after the other, so neither misses the other's role."""
    if spec.role is None or spec.pair_with is None:
        return
    session.execute(select(TenantRow.name).where(TenantRow.name == tenant).with_for_update())
    partner = _find(session, tenant, spec.pair_with)
    if partner is None:
        return
    role = partner.spec.get("role")
    if role != spec.role.opposite.value:
        has = f"role {role}" if role else "no role"
        raise InvalidInput(
            f"Service {spec.pair_with!r} has {has}, so a {spec.role.value} service cannot pair with it: "
            f"pair_with must name a {spec.role.opposite.value} service of tenant {tenant} (or one not "
            f"created yet).",
            field="pair_with",
        )


def partners(rt: Runtime, who: Principal, name: str, tenant: str | None) -> PartnersOut:
    """The ready endpoints of the service's partner (GET /v1/services/{name}/partners): the caller's
    own service only (404 for another tenant's), and its partner within that same tenant."""
    with rt.store.read() as session:
        row = visible(session, who, name, tenant)
        pair_with = row.spec.get("pair_with")
        if not pair_with:
            raise InvalidInput(
                f"Service {name!r} is not half of a prefill/decode pair, so it has no partners; create "
                "it with --role and --pair-with.",
                field="name",
            )
        partner = _find(session, row.tenant, str(pair_with))
        found = [] if partner is None else ready_endpoints(session, partner.id)
        return PartnersOut(
            service=row.name, role=str(row.spec.get("role") or ""), pair_with=str(pair_with),
            exists=partner is not None,
            endpoints=sorted(f"{e.host}:{e.port}" for e in found),
        )


def _check_runnable(rt: Runtime, tenant: str, spec: ServiceSpec, chosen: str) -> None:
    """Refuse now what a replica could never run as: the same checks as a submission of it."""
    workload_cases.prepare(
        rt, acting_for(tenant), replica_spec(spec, tenant, rt.config.serving.port_base), service_class=chosen
    )


def list_services(rt: Runtime, who: Principal, tenant: str | None) -> list[ServiceOut]:
    with rt.store.read() as session:
        query = select(ServiceRow).order_by(ServiceRow.tenant, ServiceRow.name)
        if who.tenant is not None:
            query = query.where(ServiceRow.tenant == who.tenant)
        elif tenant is not None:
            query = query.where(ServiceRow.tenant == tenant)
        return [to_out(session, row, detail=False) for row in session.scalars(query)]


def get(rt: Runtime, who: Principal, name: str, tenant: str | None) -> ServiceOut:
    with rt.store.read() as session:
        return to_out(session, visible(session, who, name, tenant), detail=True)


def update_spec(
    rt: Runtime, who: Principal, name: str, body: ServiceUpdate, tenant: str | None
) -> ServiceOut:
    """Change fields of the spec: bounds, targets and `public` apply at once; a change of what the
    replicas run moves the service to its next generation (the controller rolls the replicas over)."""
    now = rt.clock()
    with rt.store.write() as session:
        row = visible(session, who, name, tenant, lock=True)
        merged = {**row.spec, **body.changes}
        try:
            spec = ServiceSpec.model_validate({k: v for k, v in merged.items() if k != "replicas"})
        except ValidationError as exc:
            raise InvalidInput(f"The updated service would be invalid: {_first_error(exc)}.") from None
        chosen = service_class(
            rt.config, body.changes.get("priority_class", spec.priority_class), row.tenant, who.max_priority
        )
        stored = {
            **spec.model_dump(mode="json", exclude_defaults=True),
            "tenant": row.tenant,
            "priority_class": chosen,
        }
        rolls = any(stored.get(k) != row.spec.get(k) for k in RUN_FIELDS)
        writes = any(stored.get(k) != row.spec.get(k) for k in CODE_FIELDS)
        if writes and who.on_behalf is not None:  # what runs is now the admin's too (never cleared)
            spec = spec.model_copy(update={"on_behalf": who.on_behalf})
            stored["on_behalf"] = who.on_behalf
        if rolls:
            check_secret_user(who, row.tenant, spec.secrets)  # what runs with them would change
            _check_runnable(rt, row.tenant, spec, chosen)
        version = row.version
        values: dict[str, Any] = dict(
            spec=stored,
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            desired=clamp(row.desired, spec.min_replicas, spec.max_replicas),
            target_concurrency=spec.target_concurrency,
            target_rps=spec.target_rps,
            public=spec.public,
            version=version + 1,
            updated_s=now,
            generation=row.generation + 1 if rolls else row.generation,
        )
        if (
            session.connection()
            .execute(
                update(ServiceRow)
                .where(ServiceRow.id == row.id, ServiceRow.version == version)
                .values(**values)
            )
            .rowcount
            != 1
        ):
            raise Conflict(f"Service {name} changed while this update was made; read it again and retry.")
        changed = ", ".join(sorted(body.changes))
        event(
            session,
            row.id,
            "updated",
            f"updated {changed}" + (f"; rolling out generation {values['generation']}" if rolls else ""),
            now,
        )
    rt.wake.set()
    return get(rt, who, name, tenant)


def scale(rt: Runtime, who: Principal, name: str, body: ScaleRequest, tenant: str | None) -> ServiceOut:
    """Set desired (clamped to [min, max]) over the version the caller read (`expected_version`), or
    over the version read here; 409 when another write came between."""
    with rt.store.write() as session:
        row = visible(session, who, name, tenant)
        expected = row.version if body.expected_version is None else body.expected_version
        reason = body.reason or f"asked by {who.actor}"
        if not set_desired(session, row.id, body.replicas, reason, expected, now=rt.clock()):
            raise Conflict(
                f"Service {name} is at version {row.version}, not {expected}: it changed since it "
                "was read; read it again (`gpupool service show`) and retry.",
                version=row.version,
                expected_version=expected,
            )
    rt.wake.set()
    return get(rt, who, name, tenant)


def remove(rt: Runtime, who: Principal, name: str, tenant: str | None) -> ServiceOut:
    """Cancel every replica through the workloads' own cancel, then delete the service (its events
    go with it; its replicas' workloads stay in the listing, cancelled)."""
    with rt.store.write() as session:  # first, so the controller makes no new replica meanwhile
        row = visible(session, who, name, tenant, lock=True)
        row.state = "deleting"
        row.version += 1
        shown = to_out(session, row, detail=False)
        live = _live_replicas(session, row.id)
    for workload_id in live:
        with contextlib.suppress(Conflict):  # it ended meanwhile
            workload_cases.cancel(rt, acting_for(row.tenant), workload_id)
    with rt.store.write() as session:
        session.execute(delete(ServiceRow).where(ServiceRow.id == row.id))
        if who.is_admin:
            audit.record(session, who, "service.delete", f"{row.tenant}/{name}", rt.clock())
    rt.wake.set()
    return shown


def _live_replicas(session: Session, service_id: str) -> list[str]:
    finals = [s.value for s in WorkloadStatus if s.is_final]
    return list(
        session.scalars(
            select(ServiceReplicaRow.workload_id)
            .join(WorkloadRow, WorkloadRow.id == ServiceReplicaRow.workload_id)
            .where(ServiceReplicaRow.service_id == service_id, WorkloadRow.status.not_in(finals))
        )
    )


def _find(session: Session, tenant: str, name: str, *, lock: bool = False) -> ServiceRow | None:
    query = select(ServiceRow).where(ServiceRow.tenant == tenant, ServiceRow.name == name)
    return session.scalars(query.with_for_update() if lock else query).first()


def visible(
    session: Session, who: Principal, name: str, tenant: str | None, *, lock: bool = False
) -> ServiceRow:
    """The service `name` of the caller's tenant (the admin's: of `tenant`, default `default`);
    NotFound otherwise: a tenant learns nothing of another's services."""
    owner = who.tenant or tenant or "default"
    row = _find(session, owner, name, lock=lock)
    if row is None or row.state == "deleting":
        raise NotFound(f"No service {name!r}; list yours with `gpupool service ls`.", service=name)
    return row


def event(session: Session, service_id: str, reason: str, message: str, at_s: float) -> None:
    session.add(ServiceEventRow(service_id=service_id, reason=reason, message=message[:1024], at_s=at_s))


def to_out(session: Session, row: ServiceRow, *, detail: bool) -> ServiceOut:
    replicas = _replicas(session, row.id)
    events: list[ServiceEventOut] = []
    if detail:
        events = [
            ServiceEventOut(reason=e.reason, message=e.message, at_s=e.at_s)
            for e in reversed(
                session.scalars(
                    select(ServiceEventRow)
                    .where(ServiceEventRow.service_id == row.id)
                    .order_by(ServiceEventRow.id.desc())
                    .limit(SHOWN_EVENTS)
                ).all()
            )
        ]
    return ServiceOut(
        id=row.id,
        name=row.name,
        tenant=row.tenant,
        state=row.state,
        desired=row.desired,
        ready_replicas=sum(1 for r in replicas if r.ready == "ready" and r.status == "running"),
        min_replicas=row.min_replicas,
        max_replicas=row.max_replicas,
        target_concurrency=row.target_concurrency,
        target_rps=row.target_rps,
        public=row.public,
        generation=row.generation,
        version=row.version,
        last_probe_error=row.last_probe_error,
        created_s=row.created_s,
        updated_s=row.updated_s,
        spec=dict(row.spec),
        replicas=replicas if detail else [],
        events=events,
    )


def _replicas(session: Session, service_id: str) -> list[ReplicaOut]:
    finals = [s.value for s in WorkloadStatus if s.is_final]
    rows = session.execute(
        select(ServiceReplicaRow, WorkloadRow.status, WorkloadRow.attempt)
        .join(WorkloadRow, WorkloadRow.id == ServiceReplicaRow.workload_id)
        .where(ServiceReplicaRow.service_id == service_id, WorkloadRow.status.not_in(finals))
        .order_by(ServiceReplicaRow.created_s, ServiceReplicaRow.workload_id)
    ).all()
    nodes = (
        dict(
            session.execute(
                select(PodRow.workload_id, PodRow.node).where(
                    PodRow.workload_id.in_([r.workload_id for r, _, _ in rows])
                )
            ).all()
        )
        if rows
        else {}
    )
    return [
        ReplicaOut(
            workload_id=r.workload_id,
            status=status,
            ready=r.ready,
            generation=r.generation,
            node=nodes.get(r.workload_id, ""),
            host=r.host,
            port=r.port,
            last_error=r.last_error,
        )
        for r, status, _ in rows
    ]


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg', '')}" if where else str(first.get("msg", ""))

