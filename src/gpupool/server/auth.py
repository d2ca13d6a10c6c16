"""Bearer-token authentication: tokens are random, stored only as SHA-256, mapped to a principal."""

from __future__ import annotations

import hashlib
import secrets
import threading
from dataclasses import dataclass

from sqlalchemy import select

from gpupool.errors import Forbidden, Unauthorized
from gpupool.server.db import Store
from gpupool.server.orm import TokenRow

TOKEN_PREFIX = "gp_"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the admin (tenant None) or one tenant."""

    token_id: str
    tenant: str | None

    @property
    def is_admin(self) -> bool:
        return self.tenant is None

    def require_admin(self) -> None:
        if not self.is_admin:
            raise Forbidden("This needs the admin token; tenant tokens cannot manage the pool.")

    def tenant_for(self, requested: str | None) -> str:
        """The tenant an act applies to: a tenant token may only name itself."""
        if self.tenant is None:
            return requested or "default"
        if requested is not None and requested != self.tenant:
            raise Forbidden(f"This token belongs to tenant {self.tenant!r}; it cannot act for {requested!r}.")
        return self.tenant

    def may_see(self, tenant: str) -> bool:
        return self.tenant is None or self.tenant == tenant


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Authenticator:
    """Resolves a bearer token to a principal; remembers resolved hashes (tokens never change)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._known: dict[str, Principal] = {}
        self._lock = threading.Lock()

    def forget(self) -> None:
        with self._lock:
            self._known.clear()

    def principal(self, authorization: str | None) -> Principal:
        if not authorization:
            raise Unauthorized(
                "No token given; send 'Authorization: Bearer TOKEN' (the CLI reads GPUPOOL_TOKEN)."
            )
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("The Authorization header must read 'Bearer TOKEN'.")
        digest = token_sha256(token.strip())
        known = self._known.get(digest)
        if known is not None:
            return known
        with self._store.read() as session:
            row = session.scalars(select(TokenRow).where(TokenRow.token_sha256 == digest)).first()
            if row is None:
                raise Unauthorized(
                    "The token is not valid; ask the admin for a token (gpupool token create)."
                )
            principal = Principal(token_id=row.id, tenant=row.tenant)
        with self._lock:
            self._known[digest] = principal
        return principal
