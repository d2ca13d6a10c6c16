"""The data plane the pool runs: HAProxy with the activator behind it, or the in-process router."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path

from gpupool.server.dataplane.haproxy import HAProxySupervisor, find_haproxy
from gpupool.server.dataplane.haproxy_config import HAProxyPaths
from gpupool.server.dataplane.model import Backend, Route, ServiceTraffic
from gpupool.server.dataplane.proxy import ColdStartHook, ProxyApp, ProxyServer

log = logging.getLogger("gpupool.dataplane")

DEFAULT_COLD_START_LIMIT_S = 60.0


class RouterKind(StrEnum):
    HAPROXY = "haproxy"
    IN_PROCESS = "in-process"


class DataPlane:
    """Starts the router on host:port, keeps it in step with services, replicas and tokens.

    All methods block and may be called from any thread; set_* are idempotent.
    """

    def __init__(self, directory: Path, host: str, port: int, *,
                 cold_start_limit_s: float = DEFAULT_COLD_START_LIMIT_S, haproxy: str | None = "",
                 on_cold_start: ColdStartHook | None = None) -> None:
        """`haproxy`: the binary; "" finds it on the PATH, None forces the in-process router."""
        self.binary = find_haproxy() if haproxy == "" else haproxy
        self.kind = RouterKind.HAPROXY if self.binary else RouterKind.IN_PROCESS
        self.chosen = haproxy is None
        """The in-process router was asked for (--serve-router in-process), not fallen back to."""
        self.directory = directory
        self.host, self.port = host, port
        self.proxy = ProxyApp(authenticate=self.kind is RouterKind.IN_PROCESS,
                              cold_start_limit_s=cold_start_limit_s, on_cold_start=on_cold_start)
        self.haproxy: HAProxySupervisor | None = None
        if self.binary:
            self.haproxy = HAProxySupervisor(self.binary, directory, host, port, cold_start_limit_s)
            self._server = ProxyServer(self.proxy, uds=HAProxyPaths(directory).activator_socket)
        else:
            self._server = ProxyServer(self.proxy, host=host, port=port)

    @property
    def note(self) -> str:
        """One line for the start banner, `gpupool node ls` and `gpupool config show`."""
        if self.kind is RouterKind.HAPROXY:
            return f"services are served by HAProxy ({self.binary}) on {self.url}/s/<tenant>/<service>/"
        if self.chosen:
            return (f"services are served by the in-process router (--serve-router in-process) on "
                    f"{self.url}/s/<tenant>/<service>/")
        return (f"HAProxy is not installed: services are served by the in-process router on "
                f"{self.url}/s/<tenant>/<service>/ (install the haproxy package for the faster one)")

    @property
    def router(self) -> str:
        """Which router serves, and why where it is not HAProxy (GET /pool, `gpupool node ls`)."""
        if self.kind is RouterKind.HAPROXY:
            return "haproxy"
        if self.chosen:
            return "in-process (--serve-router in-process)"
        return "in-process (haproxy not installed)"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        HAProxyPaths(self.directory).jail.mkdir(mode=0o700, exist_ok=True)  # the activator's socket
        self._server.start()
        if self.haproxy is not None:
            try:
                self.haproxy.start()
            except BaseException:
                self._server.stop()
                raise
        log.warning("%s", self.note)

    def stop(self) -> None:
        if self.haproxy is not None:
            self.haproxy.stop()
        self._server.stop()

    def set_routes(self, routes: Sequence[Route]) -> None:
        self.proxy.set_routes(routes)
        if self.haproxy is not None:
            self.haproxy.set_routes(routes)

    def set_backends(self, service: str, backends: Sequence[Backend]) -> None:
        if self.haproxy is not None:
            self.haproxy.set_backends(service, backends)
        self.proxy.set_backends(service, backends)

    def set_tokens(self, tokens: dict[str, str]) -> None:
        """Token sha256 (hex) -> tenant, every active tenant token (revoked and expired ones left out)."""
        self.proxy.set_tokens(tokens)
        if self.haproxy is not None:
            self.haproxy.set_tokens(tokens)

    def traffic(self) -> dict[str, ServiceTraffic]:
        """Per service, what the router sees now (the autoscaler's sample and /metrics)."""
        own = self.proxy.traffic()
        if self.haproxy is None:
            return own
        seen = self.haproxy.traffic()
        return {name: _with_cold_starts(t, own.get(name)) for name, t in seen.items()}


def _with_cold_starts(t: ServiceTraffic, activator: ServiceTraffic | None) -> ServiceTraffic:
    if activator is None:
        return t
    return ServiceTraffic(service=t.service, in_flight=t.in_flight, requests_total=t.requests_total,
                          latency_p50_ms=t.latency_p50_ms, latency_p99_ms=t.latency_p99_ms,
                          latency_avg_ms=t.latency_avg_ms, cold_starts=activator.cold_starts)
