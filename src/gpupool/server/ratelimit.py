"""Each tenant's requests to the API, bounded (moving windows, the `limits` library in memory).

One server is one Python process: the API, the scheduling loop and every tenant's calls share it.
Without a bound, one tenant's client sending as fast as it could (a loop of submissions, listings,
log reads) took the API from everyone else. Each tenant's token (scope `full`) is counted against
`Settings.tenant_request_rate` (GPUPOOL_TENANT_REQUEST_RATE, e.g. "100/second;3000/minute"), a
listing counting as one request more per 20 rows it asks for (`request_cost`); past
it the request is answered 429 `too_many_requests` with Retry-After, before anything of it is done,
and the client library waits and sends it again. The admin, metrics tokens and a federation hub's
token (which acts for tenants, and is bounded at the hub's own API) are not counted. A tenant's
requests are also counted open until answered, at most `Settings.tenant_open_requests` at once
(GPUPOOL_TENANT_OPEN_REQUESTS): a followed stream, long poll or exec holds a connection and a file
descriptor for as long as it lasts. The windows and counts are kept per server process: with
several servers (HA) each counts what it serves.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from limits import RateLimitItem, parse_many
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from gpupool.errors import GpupoolError, InvalidInput, TooManyRequests, Unauthorized
from gpupool.server.auth import ON_BEHALF_HEADER
from gpupool.server.http_errors import gpupool_error_response
from gpupool.server.settings import DEFAULT_TENANT_REQUEST_RATE

if TYPE_CHECKING:
    from gpupool.server.auth import Principal
    from gpupool.server.runtime import Runtime

API_PATH = "/api/"
_ON_BEHALF = ON_BEHALF_HEADER.lower().encode()
WORKER_PATH = "/api/v1/calls/worker/next"
"""A function's worker pods' one route: its call token is checked there (a signature, no store read)."""


def parse_rate(text: str, what: str = "--tenant-request-rate (GPUPOOL_TENANT_REQUEST_RATE)",
               ) -> tuple[RateLimitItem, ...]:
    """'100/second;3000/minute' -> its windows; '' or 'off' -> none (not bounded)."""
    if text.strip().lower() in ("", "off"):
        return ()
    try:
        return tuple(parse_many(text))
    except ValueError:
        raise InvalidInput(f"{what} must be requests per window such as '100/second' or "
                           f"'100/second;3000/minute' ('off': not bounded), not {text!r}.") from None


SWEEP_S = 1.0
"""How often (at most) `SweptMemoryStorage` drops the entries that have left every window."""


class SweptMemoryStorage(MemoryStorage):
    """`limits`' storage in memory, swept of expired entries at most once a SWEEP_S in the thread
    that counts, where the library starts a timer thread 10 ms after any count to sweep every key.
    Under steady requests that sweep ran a hundred times a second: with 2,000 keys it took 0.28 of a
    core, and with 20,000 (one per address that sent a made-up token, say) 0.79
    (`bench/rate_storage.py`). The library's sweep also kept every key it emptied, so the keys it
    went over were every key ever counted; this one drops them. The counts do not depend on the
    sweep, only the memory held does. Counts are taken on the server's event loop, one at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.timer.cancel()  # the library's first sweep, started with it
        self._next_sweep = 0.0

    def _MemoryStorage__schedule_expiry(self) -> None:  # the library's hook, called by each count
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_S
            self._MemoryStorage__expire_events()  # type: ignore[attr-defined]
            for key in [key for key, entries in self.events.items() if not entries]:
                del self.events[key]


class TenantRates:
    """Counts each tenant's requests; `check` raises TooManyRequests past a window's limit."""

    def __init__(self, rate: str = DEFAULT_TENANT_REQUEST_RATE, *, open_requests: int = 0) -> None:
        self.items = parse_rate(rate)
        self._limiter = MovingWindowRateLimiter(SweptMemoryStorage()) if self.items else None
        self._smallest = min((item.amount for item in self.items), default=1)
        self.max_open = open_requests
        """How many requests each tenant may have open at once (0: not bounded)."""
        self.open: dict[str, int] = {}
        """tenant -> its requests being answered now (counted ones only; the event loop's alone)."""

    @property
    def off(self) -> bool:
        return self._limiter is None and not self.max_open

    def admit(self, who: Principal, cost: int = 1) -> Callable[[], None]:
        """`check` the request, then count it open until the returned release is called (once it is
        answered, however it ends); TooManyRequests when its tenant has `max_open` open already."""
        tenant = _counted(who)
        if not self.max_open or tenant is None:
            self.check(who, cost)
            return _nothing
        if self.open.get(tenant, 0) >= self.max_open:
            raise TooManyRequests(
                f"Tenant {tenant} has {self.max_open} requests open on this server (followed event and "
                "log streams, long polls, execs), its limit; end some of them and send this again (the "
                "gpupool client waits and does), or ask the admin to raise it "
                "(GPUPOOL_TENANT_OPEN_REQUESTS).", retry_after_s=1, limit=f"{self.max_open} open")
        self.check(who, cost)
        self.open[tenant] = self.open.get(tenant, 0) + 1

        return functools.partial(count_down, self.open, tenant)

    def check(self, who: Principal, cost: int = 1) -> None:
        """Count a request of `who` (a tenant's full token) as `cost` requests, or refuse it: nothing
        counted then."""
        limiter = self._limiter
        tenant = _counted(who)
        if limiter is None or tenant is None:
            return
        cost = min(cost, self._smallest)  # a request as large as a window's whole limit still passes alone
        for item in self.items:  # every window first, so a refused request takes no place in any
            if not limiter.test(item, "tenant", tenant, cost=cost):
                wait_s = _wait_s(limiter, item, "tenant", tenant)
                raise TooManyRequests(
                    f"Tenant {tenant} sent more than {item.amount} requests in {_window(item)} (a "
                    f"listing counts one more per {ROWS_PER_REQUEST} rows it asks for), this server's "
                    f"limit for each tenant; wait {wait_s} s and send it again (the gpupool client "
                    "does), or ask the admin to raise it (GPUPOOL_TENANT_REQUEST_RATE).",
                    retry_after_s=wait_s, limit=str(item))
        for item in self.items:
            limiter.hit(item, "tenant", tenant, cost=cost)

    def check_address(self, address: str) -> None:
        """TooManyRequests once `address` has had more tokens refused than a tenant may send
        requests: each unknown token costs a store read, and without this bound a stranger sending
        made-up tokens took the API from everyone. The gate then reads no token of that address
        that is not among the pool's tokens (`Authenticator.may_be_valid`)."""
        limiter = self._limiter
        if limiter is None:
            return
        key = address_key(address)
        for item in self.items:
            if not limiter.test(item, "refused", key):
                wait_s = _wait_s(limiter, item, "refused", key)
                raise TooManyRequests(
                    f"More than {item.amount} requests from {address or 'this address'} in "
                    f"{_window(item)} carried a token this pool does not know; this one was not "
                    f"read. Check GPUPOOL_TOKEN (gpupool token create makes one) and send it again "
                    f"in {wait_s} s.", retry_after_s=wait_s, limit=str(item))

    def note_refused(self, address: str) -> None:
        """Count a request from `address` whose token was refused (unknown, revoked, expired)."""
        if self._limiter is not None:
            key = address_key(address)
            for item in self.items:
                self._limiter.hit(item, "refused", key)


def address_key(address: str) -> str:
    """What a client address is counted as: itself, or for IPv6 its /64 (one host's or one
    network's, which can send from any of 2^64 addresses)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if ip.version == 4:
        return address
    if ip.ipv4_mapped is not None:  # an IPv4 client on an IPv6 socket
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))


def count_down(counts: dict[str, int], key: str) -> None:
    """One less of `key` in `counts`, which keeps no key at 0 (so it holds only what is open now)."""
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


class Slots:
    """Work that holds much memory while it runs (a checkpoint read into the server), at most
    `per_key` of one key's and `total` of all at once: `take` refuses past either (TooManyRequests,
    nothing done) rather than queue, since every taker waits in one of the server's threads. Taken
    from those threads, so counted under a lock."""

    def __init__(self, total: int, per_key: int, what: str) -> None:
        self.total, self.per_key, self.what = total, per_key, what
        self.open: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, key: str, whose: str) -> Callable[[], None]:
        """One slot of `key` (`whose`: how a refusal names it); the returned call gives it back."""
        with self._lock:
            if self.open.get(key, 0) >= self.per_key:
                raise TooManyRequests(f"{whose} has {self.per_key} {self.what} under way on this server, the "
                                      "most at once; send this again when it is answered.",
                                      retry_after_s=1, limit=f"{self.per_key} at once")
            if sum(self.open.values()) >= self.total:
                raise TooManyRequests(f"This server has {self.total} {self.what} under way, the most at "
                                      "once; send this again in a moment.", retry_after_s=1,
                                      limit=f"{self.total} at once")
            self.open[key] = self.open.get(key, 0) + 1
        return functools.partial(self._give_back, key)

    def _give_back(self, key: str) -> None:
        with self._lock:
            count_down(self.open, key)


def _counted(who: Principal) -> str | None:
    """The tenant whose count a request of `who` goes to: a tenant's full token's; None for the
    admin, metrics tokens and federation hubs (which act for tenants and are bounded at the hub)."""
    return who.tenant if who.scope == "full" else None  # (auth.Scope.FULL)


def _nothing() -> None:
    return None


def _wait_s(limiter: MovingWindowRateLimiter, item: RateLimitItem, *key: str) -> int:
    return max(1, math.ceil(limiter.get_window_stats(item, *key).reset_time - time.time()))


ROWS_PER_REQUEST = 20
"""A listing counts as one request more for every this many rows it asks for (`?limit=`)."""
MAX_COST = 100


def request_cost(limit: str | None) -> int:
    """What a request counts as: 1, and for a listing one more per ROWS_PER_REQUEST rows asked for.
    Requests are not alike: a 200-row listing costs the server about 20 ms, forty times a small
    answer, and counted as one, a tenant's listings took the whole API while under the limit."""
    if limit is None or not limit.isdigit():
        return 1
    return min(MAX_COST, 1 + int(limit) // ROWS_PER_REQUEST)


def _window(item: RateLimitItem) -> str:
    unit = item.GRANULARITY.name
    return f"one {unit}" if item.multiples == 1 else f"{item.multiples} {unit}s"


class TenantGate:
    """Pure ASGI middleware, outermost: counts a tenant's API request before the framework sees it,
    and answers one past the bound with 429 at once. It is the one place an HTTP request is counted
    (every authenticated route is under /api/): a refusal made after routing and dependency
    resolution cost the server about 0.35 ms, here about 0.08 (bench/tenant_flood.py). A request
    whose token cannot be read here (none, unknown, a federation token off its routes) is passed
    on: the route refuses it with its own answer and its audit record; a refused token also counts
    against its client address, and past the windows that address's tokens that are not among the
    pool's are answered 429 unread (`TenantRates.check_address`). Websockets (exec) are counted by
    their route."""

    def __init__(self, app: Any, rt: Runtime) -> None:
        self.app = app
        self.rt = rt

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        rates = self.rt.tenant_rates
        if scope["type"] != "http" or rates.off or not scope["path"].startswith(API_PATH):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        raw = headers.get(b"authorization")
        authorization = "" if raw is None else raw.decode("latin-1")
        if not authorization or scope["path"] == WORKER_PATH:  # a pod's call token: its route checks it
            await self.app(scope, receive, send)
            return
        auth = self.rt.auth
        client = scope.get("client")
        address = str(client[0]) if client else ""
        try:
            if not auth.known(authorization):  # (a token resolved here is not the address's to count)
                rates.check_address(address)
        except TooManyRequests as exc:
            if not auth.may_be_valid(authorization):
                auth.note_throttled(address)
                await gpupool_error_response(exc)(scope, receive, send)
                return
        try:  # no `remote`: a refusal here is recorded by the route, once
            who = auth.principal(authorization, route=(scope["method"], scope["path"]),
                                 on_behalf=headers.get(_ON_BEHALF, b"").decode("latin-1") or None)
        except Unauthorized:
            rates.note_refused(address)
            await self.app(scope, receive, send)
            return
        except GpupoolError:
            await self.app(scope, receive, send)
            return
        try:
            release = rates.admit(who, request_cost(_query_limit(scope.get("query_string", b""))))
        except TooManyRequests as exc:
            await gpupool_error_response(exc)(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            release()


def _query_limit(query: bytes) -> str | None:
    """The `limit` query parameter's value as sent (None when absent)."""
    for part in query.split(b"&"):
        name, _, value = part.partition(b"=")
        if name == b"limit":
            return value.decode("latin-1")
    return None
