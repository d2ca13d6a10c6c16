"""Bearer-token authentication: tokens are random, stored only as SHA-256, mapped to a principal.

A resolved token is remembered for CACHE_TTL_S only, so a revocation made by any server process
sharing the store takes effect everywhere within that time; expiry is checked on every request
against the clock. The last use of each token and refused authentications are kept in memory
and written in the background at a bounded rate (never one store write per request).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

from sqlalchemy import or_, select, update

from gpupool.errors import Forbidden, Unauthorized
from gpupool.server.db import Store
from gpupool.server.orm import AuditRow, TenantRow, TokenRow

log = logging.getLogger("gpupool.auth")

TOKEN_PREFIX = "gp_"
ON_BEHALF_HEADER = "X-Gpupool-On-Behalf-Of"
"""The tenant a federation-scope token acts for (Scope.FEDERATION)."""
FEDERATION_ID_ENV = "GPUPOOL_FEDERATION_ID"
"""In a federation hub's copy's environment: the hub's id of the workload it is a copy of."""
_W = r"/api/v1/workloads"
_ID = r"/[^/]+"
_C = r"/api/v1/calls"
FEDERATION_ROUTES: tuple[tuple[str, re.Pattern[str], bool], ...] = tuple(
    (method, re.compile(path), needs_tenant) for method, path, needs_tenant in (
        ("POST", _W, True), ("GET", _W, True), ("GET", _W + _ID, True), ("GET", _W + _ID + "/events", True),
        ("GET", _W + _ID + "/logs", True), ("POST", _W + _ID + "/cancel", True),
        ("POST", _W + _ID + "/release", True), ("POST", _W + _ID + "/hold", True),
        ("POST", _W + _ID + "/requeue", True), ("PATCH", _W + _ID, True),
        ("GET", _W + _ID + "/checkpoint", True), ("PUT", _W + _ID + "/checkpoint", True),
        ("POST", _C + "/sessions", True), ("GET", _C + "/sessions" + _ID, True),
        ("POST", _C + "/sessions" + _ID + "/calls", True), ("POST", _C + "/sessions" + _ID + "/close", True),
        ("GET", _C + r"/(?!worker/)[^/]+", True), ("POST", _C + r"/(?!worker/)[^/]+/cancel", True),
        ("GET", r"/api/v1/usage", False), ("GET", r"/api/v1/pool", False), ("GET", r"/api/v1/health", False)))
"""(method, path, whether a tenant must be named) a federation token may call: nothing else."""
CACHE_TTL_S = 0.5
"""How long a resolved token is trusted without looking at the store again (revocations)."""
LAST_USED_FLUSH_S = 5.0
"""Tokens' last use is written at most this often."""
REFUSAL_WINDOW_S = 60.0
"""Refused authentications are written at most once per window, coalesced with a count."""
_RefusalKey = tuple[str, str, str, str, str]
MAX_REFUSAL_KEYS = 64
"""Distinct (address, reason, token) groups kept per window; the rest are counted together."""
REFUSED_TTL_S = 60.0
"""How long a token found unknown or revoked is refused without looking at the store again."""
MAX_REFUSED_KEPT = 4096
"""Refused tokens remembered at once (the oldest goes first)."""
DIGESTS_MAX_AGE_S = 1.0
"""`may_be_valid` reads the store's token digests again when its copy is older than this."""


class Scope(StrEnum):
    FULL = "full"
    METRICS = "metrics"
    """May read /metrics and nothing else (for Prometheus)."""
    FEDERATION = "federation"
    """A federation hub's token (docs/federation.md): submits, reads and cancels work on behalf of a
    tenant it names in ON_BEHALF_HEADER, reads usage and the pool's summary; nothing more."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the admin (tenant None) or one tenant."""

    token_id: str
    tenant: str | None
    scope: Scope = Scope.FULL
    max_priority: int | None = None
    """The highest priority this caller may submit at; None: not limited (the admin)."""
    remote: str = ""
    """The client's address when known (for the audit log)."""

    @property
    def is_admin(self) -> bool:
        return self.tenant is None

    @property
    def actor(self) -> str:
        return "admin" if self.tenant is None else self.tenant

    @property
    def on_behalf(self) -> str | None:
        """Whose code this caller puts into a tenant's work when it is not the tenant's own token:
        "admin" or "federation" (a hub's token), else None. Such work runs as the tenant's on-behalf
        account (agent/identity.py), never as the account of the tenant's own pods."""
        if self.tenant is None:
            return "admin"
        return "federation" if self.scope is Scope.FEDERATION else None

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


CALL_TOKEN_PREFIX = "gpf_"
"""A pod's call token: it may only fetch its own workload's call inputs and post their results
(routers/calls.py) while that pod runs; no other route knows it (it is in no token table)."""


def call_token(key: bytes, pod_id: str) -> str:
    """The call token of one pod of a function workload: its id, signed with the pool's key."""
    mac = hmac.new(key, b"gpupool-call\0" + pod_id.encode(), hashlib.sha256).digest()
    return f"{CALL_TOKEN_PREFIX}{pod_id}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


def call_token_pod(key: bytes, authorization: str | None) -> str:
    """The pod a call token was made for; Unauthorized unless it is one signed with `key`."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token.startswith(CALL_TOKEN_PREFIX) or "." not in token:
        raise _refused("This route takes only the call token gpupool gives a function's worker pod.",
                       "not a call token")
    pod_id = token[len(CALL_TOKEN_PREFIX):].rpartition(".")[0]
    if not hmac.compare_digest(call_token(key, pod_id), token):
        raise _refused("The call token is not valid.", "bad call token")
    return pod_id


@dataclass(slots=True)
class _Known:
    principal: Principal
    expires_s: float | None
    checked: float
    """monotonic time of the store read this came from"""


def _digest(authorization: str) -> str:
    """The digest of an Authorization header's token, read as `Authenticator._resolve` reads it."""
    _scheme, _, token = authorization.partition(" ")
    return token_sha256(token.strip())


def _refused(message: str, reason: str, token_id: str = "") -> Unauthorized:
    error = Unauthorized(message, reason=reason)
    error.token_id = token_id  # type: ignore[attr-defined]  # for the audit, not the answer
    return error


class Authenticator:
    """Resolves a bearer token to a principal, with a short-lived cache (see CACHE_TTL_S)."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._clock = clock
        self._monotonic = monotonic
        self._known: dict[str, _Known] = {}
        self._refused_tokens: dict[str, tuple[float, str, str, str]] = {}
        """digest -> (monotonic time found, message, reason, token id) of a token found unknown or
        revoked: a client sending one bad token again and again (or the gate and the route both
        resolving a request's) costs the store one read a REFUSED_TTL_S. An unknown digest becomes
        a valid one only when a token of that very secret is made, and tokens are random."""
        self._digests: frozenset[str] = frozenset()
        self._digests_read = -float("inf")
        self._used: dict[str, float] = {}
        self._refusals: dict[_RefusalKey, int] = {}
        """(action, actor, address, reason, token id) -> how many, since the last write."""
        self._next_used_flush = 0.0
        self._next_refusal_flush = 0.0
        self._flushing = False
        self._lock = threading.Lock()
        self.federation_heard_s = monotonic()
        """When a federation token last called (monotonic; the start counts as heard): a member's
        fence holds the hub's work once this is older than its federation.fence."""

    def forget(self) -> None:
        """Drop every remembered token (after a revocation or a limit change in this process)."""
        with self._lock:
            self._known.clear()
            self._refused_tokens.clear()

    def known(self, authorization: str) -> bool:
        """Whether this header's token resolved here before (however long ago): no store read."""
        return _digest(authorization) in self._known

    def may_be_valid(self, authorization: str) -> bool:
        """Whether this header's token resolved here before, or is among the store's unrevoked
        tokens as last read (all their digests in one query, at most once a DIGESTS_MAX_AGE_S
        however many ask): for the gate, when an address has sent too many unknown tokens."""
        digest = _digest(authorization)
        if digest in self._known:
            return True
        mono = self._monotonic()
        if mono - self._digests_read > DIGESTS_MAX_AGE_S:
            with self._store.read() as session:
                self._digests = frozenset(session.scalars(
                    select(TokenRow.token_sha256).where(TokenRow.revoked_s.is_(None))))
            self._digests_read = mono
        return digest in self._digests

    def principal(self, authorization: str | None, *, remote: str | None = None,
                  scope: Scope = Scope.FULL, route: tuple[str, str] | None = None,
                  on_behalf: str | None = None) -> Principal:
        """The caller of a request, or Unauthorized / Forbidden.

        With `remote` (the client's address, "" if unknown) a refusal is recorded in the audit log;
        the submission fast path passes none because the route it hands refusals to records them.
        """
        try:
            who = self._resolve(authorization)
        except Unauthorized as exc:
            if remote is not None:
                self._note_refusal(remote, str(exc.details.get("reason", "")),
                                   str(getattr(exc, "token_id", "")))
            raise
        if who.scope != scope and who.scope == Scope.METRICS:
            if remote is not None:
                self.note_forbidden(replace(who, remote=remote), "a metrics token used on the API")
            raise Forbidden("This token may only read /metrics; use a full token for the API.")
        if who.scope == Scope.FEDERATION:  # a hub's token: only its routes, as the tenant it names
            self.federation_heard_s = self._monotonic()
            try:
                who = self._federated(who, route, on_behalf)
            except Forbidden:
                if remote is not None:
                    self.note_forbidden(replace(who, remote=remote), "a federation token off its routes")
                raise
        return replace(who, remote=remote) if remote else who

    def _federated(self, who: Principal, route: tuple[str, str] | None, on_behalf: str | None) -> Principal:
        method, path = route or ("", "")
        allowed = next((needs for m, pattern, needs in FEDERATION_ROUTES
                        if m == method and pattern.fullmatch(path)), None)
        if allowed is None:
            raise Forbidden("A federation token may only submit, read, cancel, hold, release, update and "
                            "requeue workloads, carry their checkpoints, forward remote-function calls, "
                            "and read usage and the pool's summary; use a full token for anything else.")
        if not on_behalf:
            if allowed:
                raise Forbidden(f"A federation token must name the tenant it acts for in {ON_BEHALF_HEADER}.")
            return who  # a read across the pool's tenants (usage, summary, health)
        with self._store.read() as session:
            limit = session.execute(select(TenantRow.max_priority).where(TenantRow.name == on_behalf)).first()
        if limit is None:
            raise Forbidden(f"There is no tenant {on_behalf[:64]!r} in this pool; create it here "
                            "(gpupool tenant create) before the hub sends its work.")
        return replace(who, tenant=on_behalf, max_priority=int(limit[0]))

    def _resolve(self, authorization: str | None) -> Principal:
        if not authorization:
            raise _refused(
                "No token given; send 'Authorization: Bearer TOKEN' (the CLI reads GPUPOOL_TOKEN).",
                "no token")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _refused("The Authorization header must read 'Bearer TOKEN'.", "malformed header")
        digest = token_sha256(token.strip())
        mono = self._monotonic()
        refused = self._refused_tokens.get(digest)
        if refused is not None and mono - refused[0] <= REFUSED_TTL_S:
            raise _refused(*refused[1:])
        known = self._known.get(digest)
        if known is None or mono - known.checked > CACHE_TTL_S:
            known = self._load(digest, mono)
        now = self._clock()
        if known.expires_s is not None and now >= known.expires_s:
            stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(known.expires_s))
            raise _refused(f"The token expired at {stamp}; ask the admin for a new one "
                           "(gpupool token create).", "expired", known.principal.token_id)
        self._used[known.principal.token_id] = now
        self._maybe_flush(mono)
        return known.principal

    def _load(self, digest: str, mono: float) -> _Known:
        with self._store.read() as session:
            row = session.execute(
                select(TokenRow.id, TokenRow.tenant, TokenRow.scope, TokenRow.expires_s,
                       TokenRow.revoked_s, TenantRow.max_priority)
                .outerjoin(TenantRow, TenantRow.name == TokenRow.tenant)
                .where(TokenRow.token_sha256 == digest)
            ).first()
        if row is None or row.revoked_s is not None:
            why = (("The token is not valid; ask the admin for a token (gpupool token create).",
                    "unknown token", "") if row is None else
                   ("The token was revoked; ask the admin for a new one (gpupool token create).",
                    "revoked", row.id))
            with self._lock:
                self._known.pop(digest, None)
                self._refused_tokens.pop(digest, None)
                while len(self._refused_tokens) >= MAX_REFUSED_KEPT:
                    del self._refused_tokens[next(iter(self._refused_tokens))]
                self._refused_tokens[digest] = (mono, *why)
            raise _refused(*why)
        principal = Principal(token_id=row.id, tenant=row.tenant, scope=Scope(row.scope),
                              max_priority=None if row.tenant is None else int(row.max_priority))
        known = _Known(principal, row.expires_s, mono)
        with self._lock:
            self._known[digest] = known
        return known

    # ------------------------------------------------------------ background writes

    def note_forbidden(self, who: Principal, reason: str) -> None:
        """Record a 403 (a valid token asking for what it may not have), coalesced as refusals are:
        probing with a tenant's token leaves a trace without a store write per request."""
        self._note(("auth.forbidden", who.actor, who.remote[:64], reason[:200], who.token_id))

    def note_throttled(self, remote: str) -> None:
        """Record a request refused unread because its address sent too many unknown tokens."""
        self._note_refusal(remote, "too many refused tokens from this address", "")

    def _note_refusal(self, remote: str, reason: str, token_id: str) -> None:
        self._note(("auth.refused", "", remote[:64], reason, token_id))

    def _note(self, key: _RefusalKey) -> None:
        with self._lock:
            if key not in self._refusals and len(self._refusals) >= MAX_REFUSAL_KEYS:
                key = (key[0], "", "(many addresses)", "", "")
            self._refusals[key] = self._refusals.get(key, 0) + 1
        self._maybe_flush(self._monotonic())

    def _maybe_flush(self, mono: float) -> None:
        due = ((self._used and mono >= self._next_used_flush)
               or (self._refusals and mono >= self._next_refusal_flush))
        if not due or self._flushing:
            return
        with self._lock:
            if self._flushing:
                return
            self._flushing = True
        threading.Thread(target=self._flush_due, args=(mono,), name="gpupool-auth-flush",
                         daemon=True).start()

    def _flush_due(self, mono: float) -> None:
        try:
            with self._lock:
                used: dict[str, float] = {}
                refusals: dict[_RefusalKey, int] = {}
                if mono >= self._next_used_flush:
                    used, self._used = self._used, {}
                    self._next_used_flush = mono + LAST_USED_FLUSH_S
                if mono >= self._next_refusal_flush and self._refusals:
                    refusals, self._refusals = self._refusals, {}
                    self._next_refusal_flush = mono + REFUSAL_WINDOW_S
            self._write(used, refusals)
        finally:
            self._flushing = False

    def flush(self) -> None:
        """Write every remembered last use and refusal now (at shutdown, and in tests)."""
        with self._lock:
            used, self._used = self._used, {}
            refusals, self._refusals = self._refusals, {}
        self._write(used, refusals)

    def _write(self, used: dict[str, float], refusals: dict[_RefusalKey, int]) -> None:
        if not used and not refusals:
            return
        now = self._clock()
        try:
            with self._store.write() as session:
                for token_id, at_s in sorted(used.items()):
                    session.execute(
                        update(TokenRow)
                        .where(TokenRow.id == token_id,
                               or_(TokenRow.last_used_s.is_(None), TokenRow.last_used_s < at_s))
                        .values(last_used_s=at_s))
                for (action, actor, remote, reason, token_id), count in sorted(refusals.items()):
                    session.add(AuditRow(at_s=now, actor=actor, token_id=token_id, action=action,
                                         target=token_id, detail=reason, remote=remote, count=count))
        except Exception as exc:  # the store's own error; losing these notes must not fail requests
            log.warning("recording token use and refused logins failed: %s", exc)
