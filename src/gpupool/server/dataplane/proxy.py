"""The in-process router and the activator: the same routes and answers as HAProxy, in Python.

One ASGI app serves two roles. As the fallback router (HAProxy not installed) it listens on the
serve port, authenticates and routes /s/<service>/... itself. As the activator it listens on a
unix socket of the data directory, is HAProxy's backup server for every service, and receives only
requests HAProxy has already authenticated (the service named in a header HAProxy sets). Either
way a request for a service with no ready replica is held until one is ready, up to the cold-start
limit, then answered 503 with a sentence and Retry-After; the time from the first held request to
the first ready replica is a cold start, counted and reported.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpupool.server.dataplane.haproxy_config import SERVICE_HEADER
from gpupool.server.dataplane.model import (
    FORBIDDEN,
    POOL_TOKEN,
    SERVICE_KEY,
    UNAUTHENTICATED,
    Backend,
    Route,
    ServiceTraffic,
    cold_start_timeout,
    no_route,
    unknown_service,
)

log = logging.getLogger("gpupool.dataplane")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ColdStartHook = Callable[[str, float], None]

LATENCY_SAMPLES = 2048
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailers", "transfer-encoding", "upgrade"})
NOT_PASSED_ON = HOP_BY_HOP | {"host", "content-length"}
"""Request headers the proxy sets itself (the replica's host; the length of the body it sends)."""


@dataclass
class _ServiceState:
    route: Route | None = None
    backends: list[Backend] = field(default_factory=list)
    ready: asyncio.Event | None = None
    held_since: float | None = None
    in_flight: int = 0
    requests_total: int = 0
    cold_starts: int = 0
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))


class ProxyApp:
    """The ASGI app; its tables are changed from any thread through the set_* methods."""

    def __init__(self, *, authenticate: bool, cold_start_limit_s: float, retry_after_s: int = 5,
                 on_cold_start: ColdStartHook | None = None) -> None:
        self.authenticate = authenticate
        self.cold_start_limit_s = cold_start_limit_s
        self.retry_after_s = retry_after_s
        self.on_cold_start = on_cold_start
        self._lock = threading.Lock()
        self._services: dict[str, _ServiceState] = {}
        self._tokens: dict[str, str] = {}
        self._outstanding: dict[tuple[str, str], int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None

    # -- the tables, from any thread ----------------------------------------------------------------
    def set_routes(self, routes: Sequence[Route]) -> None:
        with self._lock:
            wanted = {r.service: r for r in routes}
            for name in set(self._services) - set(wanted):
                self._services[name].route = None
            for name, route in wanted.items():
                self._services.setdefault(name, _ServiceState()).route = route

    def set_backends(self, service: str, backends: Sequence[Backend]) -> None:
        with self._lock:
            state = self._services.setdefault(service, _ServiceState())
            state.backends = sorted(backends)
        if backends and self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake, service)

    def set_tokens(self, tokens: dict[str, str]) -> None:
        with self._lock:
            self._tokens = dict(tokens)

    def limit_for(self, service: str) -> float:
        with self._lock:
            route = self._services[service].route if service in self._services else None
        if route is None or route.cold_start_limit_s is None:
            return self.cold_start_limit_s
        return route.cold_start_limit_s

    def traffic(self) -> dict[str, ServiceTraffic]:
        with self._lock:
            out = {}
            for name, s in self._services.items():
                ordered = sorted(s.latencies_ms)
                out[name] = ServiceTraffic(
                    service=name, in_flight=s.in_flight, requests_total=s.requests_total,
                    latency_p50_ms=_quantile(ordered, 0.5), latency_p99_ms=_quantile(ordered, 0.99),
                    cold_starts=s.cold_starts)
            return out

    # -- serving ------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=5.0),
                                             limits=httpx.Limits(max_keepalive_connections=256))
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]]
        found = self._resolve(scope["path"], headers)
        if isinstance(found, _Answer):
            await found.send(send)
            return
        service, path = found
        query = scope.get("query_string", b"").decode("latin-1")
        body = await _read_body(receive, MAX_BODY_BYTES)
        if body is None:
            await _Answer(413, f"A request to service {service} may carry at most {MAX_BODY_BYTES // 2**20} "
                               "MiB; send less, or in parts.").send(send)
            return
        started = time.perf_counter()
        with self._lock:
            self._services[service].in_flight += 1
        try:
            backend = await self._pick(service)
            if backend is None:
                await _Answer(503, cold_start_timeout(service, self.limit_for(service)),
                              [("retry-after", str(self.retry_after_s))]).send(send)
                return
            try:
                await self._forward(scope["method"], backend, path, query, headers, body, send)
            finally:
                with self._lock:
                    self._outstanding[(service, backend.server_name)] -= 1
        finally:
            with self._lock:
                state = self._services[service]
                state.in_flight -= 1
                state.requests_total += 1
                state.latencies_ms.append((time.perf_counter() - started) * 1000)

    def _resolve(self, path: str, headers: list[tuple[str, str]]) -> tuple[str, str] | _Answer:
        """(service, the replica's path), or the answer that refuses the request."""
        if not self.authenticate:
            service = next((v for k, v in headers if k == SERVICE_HEADER.lower()), "")
            with self._lock:
                if service not in self._services or self._services[service].route is None:
                    return _Answer(404, unknown_service(service))
            return service, path
        parts = path.split("/", 4)
        if len(parts) < 4 or parts[1] != "s" or not parts[2] or not parts[3]:
            return _Answer(404, no_route())
        service = f"{parts[2]}/{parts[3]}"
        rest = "/" + (parts[4] if len(parts) > 4 else "")
        with self._lock:
            state = self._services.get(service) if SERVICE_KEY.match(service) else None
            route = state.route if state is not None else None
            if route is None:
                return _Answer(404, unknown_service(service))
            if not route.public:
                auth = next((v for k, v in headers if k == "authorization"), None)
                tenant = self._tenant_of(auth)
                if tenant is None:
                    return _Answer(401, UNAUTHENTICATED, [("www-authenticate", "Bearer")])
                if tenant != route.tenant:
                    return _Answer(403, FORBIDDEN)
        return service, rest

    def _tenant_of(self, authorization: str | None) -> str | None:
        if authorization is None or not authorization.lower().startswith("bearer "):
            return None
        token = authorization[7:].lstrip(" ")
        return self._tokens.get(hashlib.sha256(token.encode()).hexdigest())

    async def _pick(self, service: str) -> Backend | None:
        """The ready replica with the fewest requests outstanding, waiting up to the cold-start limit."""
        limit_s = self.limit_for(service)
        deadline = time.monotonic() + limit_s
        while True:
            with self._lock:
                state = self._services[service]
                if state.backends:
                    if state.held_since is not None:
                        self._cold_start_done(service, state)
                    best = min(state.backends,
                               key=lambda b: (self._outstanding.get((service, b.server_name), 0), b))
                    key = (service, best.server_name)
                    self._outstanding[key] = self._outstanding.get(key, 0) + 1
                    return best
                if state.held_since is None:
                    state.held_since = time.monotonic()
                if state.ready is None or state.ready.is_set():
                    state.ready = asyncio.Event()
                ready = state.ready
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                await asyncio.wait_for(ready.wait(), timeout=left)
            except TimeoutError:
                return None

    def _cold_start_done(self, service: str, state: _ServiceState) -> None:
        assert state.held_since is not None
        seconds = time.monotonic() - state.held_since
        state.held_since = None
        state.cold_starts += 1
        log.info("service %s: cold start took %.2f s", service, seconds)
        if self.on_cold_start is not None:
            try:
                self.on_cold_start(service, seconds)
            except Exception:  # a failing report never fails the request
                log.exception("reporting a cold start of %s failed", service)

    def _wake(self, service: str) -> None:
        state = self._services.get(service)
        if state is not None and state.ready is not None:
            state.ready.set()

    async def _forward(self, method: str, backend: Backend, path: str, query: str,
                       headers: list[tuple[str, str]], body: bytes, send: Send) -> None:
        assert self._client is not None
        out_headers = [(k, v) for k, v in headers if k not in NOT_PASSED_ON and k != SERVICE_HEADER.lower()
                       and not (k == "authorization" and POOL_TOKEN.match(v))]
        url = f"http://{backend.host}:{backend.port}{path}" + (f"?{query}" if query else "")
        try:
            request = self._client.build_request(method, url, headers=out_headers, content=body)
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            await _Answer(502, f"the replica {backend.replica_id} did not answer: {exc}").send(send)
            return
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k.encode("latin-1"), v.encode("latin-1"))
                                    for k, v in response.headers.multi_items()
                                    if k.lower() not in HOP_BY_HOP]})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()


@dataclass(frozen=True)
class _Answer:
    status: int
    text: str
    headers: list[tuple[str, str]] = field(default_factory=list)

    async def send(self, send: Send) -> None:
        body = (self.text + "\n").encode()
        headers = [(b"content-type", b"text/plain; charset=utf-8"),
                   (b"content-length", str(len(body)).encode())]
        headers += [(k.encode(), v.encode()) for k, v in self.headers]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


MAX_BODY_BYTES = 64 * 2**20
"""The most of a request's body this router holds while it picks (or waits for) a replica: it
reads the body whole first, in the server's memory, so an unbounded one from any client of a
public service grew the server (the API's and the scheduler's process) without bound."""


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request's body, or None once it passes `limit` bytes (the rest is not read)."""
    chunks = []
    size = 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _quantile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class ProxyServer:
    """Serves a ProxyApp on a TCP listener or a unix socket from its own thread and event loop."""

    def __init__(self, app: ProxyApp, *, host: str | None = None, port: int | None = None,
                 uds: Path | None = None) -> None:
        import uvicorn

        self.app = app
        self.uds = uds
        from gpupool.server.connguard import guarded_protocol

        config = uvicorn.Config(app, host=host or "127.0.0.1", port=port or 0,
                                uds=str(uds) if uds else None, log_level="warning", lifespan="off",
                                access_log=False, timeout_keep_alive=75, http=guarded_protocol())
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="dataplane-proxy", daemon=True)

    def start(self, timeout_s: float = 10.0) -> None:
        if self.uds is not None:
            self.uds.unlink(missing_ok=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise OSError("the in-process router did not start (is the port taken?)")
            time.sleep(0.01)
        if self.uds is not None:
            self.uds.chmod(0o600)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
