"""A tenant's secrets: create (or replace), list and delete, their values sealed at rest
(server/secretbox.py); checked at submit and opened only for the launch of that tenant's pods.

No answer, event, log line or stored spec ever holds a value: a spec names its secrets, and the
values travel from the store to the node's launcher in memory, just before each launch. A tenant
sees and uses only its own secrets: another tenant's secret reads as one that does not exist (the
same 404 and sentence), so a name cannot be probed. The admin may create, list (names and keys) and
delete any tenant's secrets, and, like everyone else, never read a value back.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.api.mounts import SecretUse
from gpupool.api.secrets import SecretCreate, SecretDeleted, SecretOut
from gpupool.errors import Conflict, Forbidden, GpupoolError, InvalidInput, NotFound, did_you_mean
from gpupool.pods import PodLaunch, PodSecret, secret_injection
from gpupool.server.auth import Principal, Scope
from gpupool.server.orm import SecretRow
from gpupool.server.runtime import Runtime
from gpupool.server.secretbox import SecretBox
from gpupool.server.services import audit
from gpupool.server.services.tokens import lock_tenant

log = logging.getLogger("gpupool.secrets")
_boxes: dict[Path, SecretBox] = {}
_boxes_lock = threading.Lock()


def box(rt: Runtime) -> SecretBox:
    """The pool's SecretBox (its key file in the data directory, read on first use)."""
    with _boxes_lock:
        return _boxes.setdefault(rt.settings.data_dir, SecretBox(rt.settings.data_dir))


def _out(row: SecretRow) -> SecretOut:
    return SecretOut(tenant=row.tenant, name=row.name, keys=list(row.keys), created_s=row.created_s,
                     updated_s=row.updated_s)


def _missing(tenant: str, name: str, session: Session) -> NotFound:
    """The one answer for a secret the caller's tenant does not have, whoever else may have one."""
    names = list(session.scalars(select(SecretRow.name).where(SecretRow.tenant == tenant)).all())
    return NotFound(f"Tenant {tenant!r} has no secret named {name!r}.{did_you_mean(name, names)} List them "
                    "with `gpupool secret ls`.", secret=name)


def create(rt: Runtime, who: Principal, body: SecretCreate) -> SecretOut:
    """Store a new secret (409 when the name is taken, unless `replace`). Only the tenant's own tokens
    create or replace its secrets: the work that uses one gets its keys as variables, so whoever
    writes the keys chooses variables of the tenant's own pods (LD_PRELOAD, say), which would run
    their code as the tenant's account."""
    if who.on_behalf is not None:
        owner = body.tenant or who.tenant or "default"
        raise Forbidden(f"Tenant {owner}'s secrets are created and replaced with one of its own tokens only: "
                        "their keys become variables of its pods, so whoever writes them chooses what those "
                        f"pods run with. The admin may list and delete them (gpupool secret delete NAME "
                        f"--tenant {owner}).")
    tenant = who.tenant_for(body.tenant)
    data = {key: base64.b64decode(text) for key, text in body.data.items()}
    sealed = box(rt).seal(tenant, body.name, data)
    keys = sorted(data)
    now = rt.clock()
    try:
        with rt.store.write() as session:
            lock_tenant(session, tenant)  # a tenant being deleted takes its secrets with it
            replaced = 0
            if body.replace:  # a blind overwrite: it depends on nothing read
                replaced = session.connection().execute(
                    update(SecretRow).where(SecretRow.tenant == tenant, SecretRow.name == body.name)
                    .values(keys=keys, sealed=sealed, updated_s=now, revision=SecretRow.revision + 1)
                ).rowcount
            if not replaced:
                session.add(SecretRow(tenant=tenant, name=body.name, keys=keys, sealed=sealed, created_s=now,
                                      updated_s=now, revision=0))
                session.flush()
            audit.record(session, who, "secret.replace" if replaced else "secret.create",
                         f"{tenant}/{body.name}", now, f"keys={','.join(keys)}")
            row = session.scalars(select(SecretRow).where(SecretRow.tenant == tenant,
                                                          SecretRow.name == body.name)).one()
            return _out(row)
    except IntegrityError:
        raise Conflict(f"Tenant {tenant!r} already has a secret named {body.name!r}; replace it with "
                       "`gpupool secret create --replace`, or delete it first.", secret=body.name) from None


def list_secrets(rt: Runtime, who: Principal, tenant: str | None) -> list[SecretOut]:
    """A tenant's own secrets (names and keys); the admin's: every tenant's, or one's."""
    query = select(SecretRow).order_by(SecretRow.tenant, SecretRow.name)
    if who.tenant is not None or tenant is not None:  # a tenant naming another is refused (403)
        query = query.where(SecretRow.tenant == (who.tenant_for(tenant) if who.tenant else tenant))
    with rt.store.read() as session:
        return [_out(r) for r in session.scalars(query)]


def delete_secret(rt: Runtime, who: Principal, name: str, tenant: str | None) -> SecretDeleted:
    """Delete one: 404 when the caller's tenant (or the admin's `tenant`) has none of that name."""
    owner = who.tenant_for(tenant)  # a tenant naming another is refused (403); the admin's: default
    now = rt.clock()
    with rt.store.write() as session:
        removed = session.connection().execute(delete(SecretRow).where(SecretRow.tenant == owner,
                                                          SecretRow.name == name)).rowcount
        if not removed:
            raise _missing(owner, name, session)
        audit.record(session, who, "secret.delete", f"{owner}/{name}", now)
    return SecretDeleted(tenant=owner, name=name)


def check_user(who: Principal, tenant: str, uses: Sequence[SecretUse]) -> None:
    """Only the tenant's own tokens put its secrets into work. The admin and a federation hub act
    for a tenant, and neither reads a value: work they start or change with the tenant's secrets
    could print them into logs they may read. Forbidden with the sentence."""
    if uses and (who.is_admin or who.scope is Scope.FEDERATION):
        by = "the admin's token" if who.is_admin else "a federation token"
        raise Forbidden(f"Work that uses tenant {tenant}'s secrets is started or changed with one of "
                        f"{tenant}'s own tokens only, not {by}: no one but the tenant reads a secret's "
                        "value, and such work could print it into its logs. Submit it as the tenant, "
                        "or leave the secrets out.")


def check_uses(rt: Runtime, tenant: str, uses: Sequence[SecretUse]) -> None:
    """At submit: every secret named is the tenant's and can be given as asked (InvalidInput or
    NotFound with the sentence); nothing is stored but the names."""
    if not uses:
        return
    names = sorted({u.name for u in uses})
    with rt.store.read() as session:
        rows = {r.name: r for r in session.scalars(select(SecretRow).where(
            SecretRow.tenant == tenant, SecretRow.name.in_(names)))}
        for use in uses:
            if use.name not in rows:
                raise _missing(tenant, use.name, session)
    targets: dict[str, str] = {}
    for use in uses:
        row = rows[use.name]
        data = box(rt).open(tenant, use.name, row.sealed)
        try:
            env, files = secret_injection(PodSecret(use.name, use.env, use.path, data))
        except ValueError as exc:
            raise InvalidInput(f"{str(exc)[0].upper()}{str(exc)[1:]}.", field="secrets") from None
        for target in [*env, *(f"/run/secrets/{f}" for f in files)]:
            if target in targets:
                raise InvalidInput(f"Secrets {targets[target]!r} and {use.name!r} both give {target}; give "
                                   "one of them another variable or path.", field="secrets")
            targets[target] = use.name


def with_values(rt: Runtime, launches: list[PodLaunch]) -> list[PodLaunch]:
    """The launches with their secrets' values filled in (read and opened now, just before they are
    handed to the nodes); a secret deleted since the submit is left empty, and its node refuses the
    pod with the sentence. Launches without secrets pass untouched (no store read)."""
    wanted = {(launch.tenant, s.name) for launch in launches for s in launch.secrets}
    if not wanted:
        return launches
    tenants = sorted({t for t, _ in wanted})
    with rt.store.read() as session:
        rows = {(r.tenant, r.name): r.sealed for r in session.scalars(
            select(SecretRow).where(SecretRow.tenant.in_(tenants),
                                    SecretRow.name.in_(sorted({n for _, n in wanted}))))}
    opened: dict[tuple[str, str], dict[str, bytes]] = {}
    for key, sealed in rows.items():
        if key not in wanted:  # the same name of another tenant that has a launch here too
            continue
        try:
            opened[key] = box(rt).open(key[0], key[1], sealed)
        except GpupoolError as exc:  # its pods are refused as for a deleted secret; the log says why
            log.warning("%s", exc.message)
    return [launch if not launch.secrets else dataclasses.replace(launch, secrets=tuple(
        dataclasses.replace(s, data=opened.get((launch.tenant, s.name))) for s in launch.secrets))
        for launch in launches]
