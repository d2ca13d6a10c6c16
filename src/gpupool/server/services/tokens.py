"""Bearer tokens: create (with a scope and a lifetime), list without secrets, revoke; the token file."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from pathlib import Path

from sqlalchemy import Select, func, or_, select
from sqlalchemy.orm import Session

from gpupool.api.tenants import TokenCreate, TokenInfo, TokenOut
from gpupool.errors import Conflict, InvalidInput, NotFound, did_you_mean
from gpupool.server.auth import Principal, Scope, new_token, token_sha256
from gpupool.server.orm import TenantRow, TokenRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import audit


def new_token_id() -> str:
    return "tok-" + secrets.token_hex(6)


def token_row(token: str, tenant: str | None, name: str, now: float, *, scope: Scope = Scope.FULL,
              expires_s: float | None = None, token_id: str | None = None) -> TokenRow:
    token_id = token_id or new_token_id()
    return TokenRow(id=token_id, token_sha256=token_sha256(token), tenant=tenant, name=name or token_id,
                    created_s=now, scope=scope.value, expires_s=expires_s)


def token_info(row: TokenRow) -> TokenInfo:
    return TokenInfo(id=row.id, tenant=row.tenant, name=row.name, scope=row.scope, created_s=row.created_s,
                     expires_s=row.expires_s, last_used_s=row.last_used_s, revoked_s=row.revoked_s)


def lock_tenant(session: Session, name: str) -> TenantRow:
    """The tenant's row, locked until the transaction ends (PostgreSQL; SQLite writes are serial)."""
    row = session.scalars(select(TenantRow).where(TenantRow.name == name).with_for_update()).first()
    if row is None:
        names = list(session.scalars(select(TenantRow.name)).all())
        raise NotFound(f"No tenant named {name!r}.{did_you_mean(name, names)}", tenant=name)
    return row


def lock_admin_tokens(session: Session) -> None:
    """The admin's token rows, locked until the transaction ends, in id order (two transactions
    never wait on each other's half): what reads the admin's tokens to decide a write (is a name
    taken, is another working token left) then holds until the write commits. There is always at
    least one (`bootstrap`); SQLite's writes are serial anyway."""
    session.execute(select(TokenRow.id).where(TokenRow.tenant.is_(None)).order_by(TokenRow.id)
                    .with_for_update()).all()


def _owner(tenant: str | None) -> str:
    return "the admin" if tenant is None else f"tenant {tenant!r}"


def _of(tenant: str | None) -> Select[TokenRow]:
    owned = TokenRow.tenant.is_(None) if tenant is None else TokenRow.tenant == tenant
    return select(TokenRow).where(owned)


def create_token(rt: Runtime, who: Principal, body: TokenCreate) -> TokenOut:
    """A new token, shown once; its name is unique among its owner's unrevoked tokens."""
    who.require_admin()
    if body.tenant is not None and Scope(body.scope) is Scope.FEDERATION:
        raise InvalidInput(f"A federation token acts for every tenant a hub serves, so only the admin owns "
                           f"one; create it with --admin --scope federation, not --tenant {body.tenant}.",
                           tenant=body.tenant)
    if body.tenant is not None and Scope(body.scope) is Scope.METRICS:
        # /metrics names every tenant and queue: a tenant's token must not read the others' use
        raise InvalidInput(f"A metrics token reads every tenant's series, so only the admin owns one; "
                           f"create it with --admin --scope metrics, not --tenant {body.tenant}.",
                           tenant=body.tenant)
    now = rt.clock()
    lifetime = None if body.never_expires else (body.expires_in_s or rt.settings.token_expiry_s)
    token = new_token()
    with rt.store.write() as session:
        if body.tenant is not None:  # two creates of one name cannot both pass the check
            lock_tenant(session, body.tenant)
        else:
            lock_admin_tokens(session)
        row = token_row(token, body.tenant, body.name, now, scope=Scope(body.scope),
                        expires_s=None if lifetime is None else now + lifetime)
        taken = session.scalars(_of(body.tenant).where(TokenRow.name == row.name,
                                                        TokenRow.revoked_s.is_(None))).first()
        if taken is not None:
            raise Conflict(f"{_owner(body.tenant).capitalize()} already has a token named {row.name!r}; "
                           "pick another --name or revoke that one first.", name=row.name)
        session.add(row)
        audit.record(session, who, "token.create", row.id, now,
                     f"owner={body.tenant or 'admin'} name={row.name} scope={row.scope}")
        info = token_info(row)
    return TokenOut(**info.model_dump(), token=token)


def list_tokens(rt: Runtime, who: Principal, tenant: str | None) -> list[TokenInfo]:
    """The admin sees every token (or one tenant's); a tenant sees only its own."""
    query = select(TokenRow).order_by(TokenRow.tenant, TokenRow.created_s, TokenRow.id)
    if who.tenant is not None or tenant is not None:
        query = query.where(TokenRow.tenant == who.tenant_for(tenant))
    with rt.store.read() as session:
        return [token_info(r) for r in session.scalars(query)]


def revoke_token(rt: Runtime, who: Principal, token_id: str) -> TokenInfo:
    """Revoke a token (idempotent); every server process refuses it within a second."""
    now = rt.clock()
    with rt.store.write() as session:
        row = session.get(TokenRow, token_id)
        if row is None or (who.tenant is not None and row.tenant != who.tenant):
            raise NotFound(f"No token {token_id!r}; list them with `gpupool token ls`.", token=token_id)
        if row.revoked_s is None and row.tenant is None:
            lock_admin_tokens(session)  # two admins revoking each other's last token: one is refused
            session.refresh(row)
        if row.revoked_s is None:
            if row.tenant is None:
                _keep_one_admin_token(session, row.id, now)
            row.revoked_s = now
            audit.record(session, who, "token.revoke", row.id, now,
                         f"owner={row.tenant or 'admin'} name={row.name}")
        info = token_info(row)
    rt.auth.forget()
    return info


def _keep_one_admin_token(session: Session, revoking: str, now: float) -> None:
    others = session.scalar(
        select(func.count()).select_from(TokenRow).where(
            TokenRow.tenant.is_(None), TokenRow.id != revoking, TokenRow.revoked_s.is_(None),
            TokenRow.scope == Scope.FULL.value,
            or_(TokenRow.expires_s.is_(None), TokenRow.expires_s > now)))
    if not others:
        raise Conflict(f"Token {revoking} is the last working admin token; create another one first "
                       "(gpupool token create --admin).", token=revoking)


def write_private_file(path: Path, text: str) -> None:
    """Replace `path` with `text`, mode 0600, atomically and durably: a temporary file in the same
    directory, fsync, rename over, fsync the directory. A crash leaves the old file or the new one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # created 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError as exc:
        raise InvalidInput(f"Cannot write {path} ({exc.strerror or exc}); make its directory writable "
                           "by the server's user.") from None
