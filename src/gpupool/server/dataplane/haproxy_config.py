"""HAProxy's configuration for the data plane, rendered from the services it routes.

One frontend on the serve listener authenticates (the bearer token's sha256 looked up in a map of
token hash -> tenant), answers 404/401/403 with a sentence, strips /s/<service> and picks the
service's backend; one backend per service balances leastconn over its replicas, health-checks them
as the readiness probe does, and falls back to the activator (a unix socket of the pool) when no
replica is up. Replicas and tokens change through the runtime API; the file is rewritten so that a
restart or a reload starts from the current state.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.api.services import PROBE_PATH
from gpupool.server.dataplane.haproxy_log import LINE_MAX, LOG_FORMAT
from gpupool.server.dataplane.model import (
    FORBIDDEN,
    UNAUTHENTICATED,
    Backend,
    Probe,
    Route,
    no_route,
    unknown_service,
)

SERVICE_HEADER = "X-Gpupool-Service"
"""Set by the router (the client's own is removed) so the activator knows which service is asked."""


@dataclass(frozen=True, slots=True)
class Jail:
    """HAProxy's workers run as this account, chrooted into `HAProxyPaths.jail` (the pool runs as
    root); its master stays the pool's, to bind the listeners and the admin socket and to reload."""

    uid: int
    gid: int


@dataclass(frozen=True, slots=True)
class HAProxyPaths:
    directory: Path

    @property
    def jail(self) -> Path:
        """The workers' root when jailed: only the two sockets they connect to live in it."""
        return self.directory / "jail"

    @property
    def config(self) -> Path:
        return self.directory / "haproxy.cfg"

    @property
    def pidfile(self) -> Path:
        return self.directory / "haproxy.pid"

    @property
    def log(self) -> Path:
        return self.directory / "haproxy.log"

    @property
    def runtime_socket(self) -> Path:
        return self.directory / "haproxy.sock"

    @property
    def latency_log_socket(self) -> Path:
        return self.jail / "latency.sock"

    @property
    def activator_socket(self) -> Path:
        return self.jail / "activator.sock"

    def seen_by_workers(self, path: Path, jail: Jail | None) -> Path:
        """`path` (in the jail) as a jailed worker names it: from the jail's root."""
        return Path("/") / path.relative_to(self.jail) if jail is not None else path

    @property
    def services_map(self) -> Path:
        return self.directory / "services.map"

    @property
    def public_map(self) -> Path:
        return self.directory / "public.map"

    @property
    def backends_map(self) -> Path:
        return self.directory / "backends.map"

    @property
    def tokens_map(self) -> Path:
        return self.directory / "tokens.map"


def backend_name(service: str) -> str:
    return "svc_" + service.replace("/", ".")


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def server_options(probe: Probe) -> str:
    """The check keywords of a replica's server line (and of `add server`): the probe's own."""
    return (f"check inter {_ms(probe.interval_s)} rise {probe.success_threshold} "
            f"fall {probe.failure_threshold}")


def _backend(route: Route, backends: Sequence[Backend], paths: HAProxyPaths, jail: Jail | None) -> list[str]:
    probe = route.probe
    lines = [f"backend {backend_name(route.service)}", "    balance leastconn",
             f"    timeout check {_ms(probe.timeout_s)}"]
    if probe.path is not None and re.fullmatch(PROBE_PATH, probe.path):  # (one stored before the rule
        lines.append(f"    option httpchk GET {probe.path}")  # is checked by connecting, as TCP probes are)
    lines.append(f"    http-request set-header {SERVICE_HEADER} {route.service}")
    lines += [f"    server {b.server_name} {b.host}:{b.port} {server_options(probe)}"
              for b in sorted(backends)]
    lines.append(f"    server activator unix@{paths.seen_by_workers(paths.activator_socket, jail)} backup")
    return lines


def render(paths: HAProxyPaths, host: str, port: int, routes: Sequence[Route],
           backends: Mapping[str, Sequence[Backend]], cold_start_limit_s: float,
           jail: Jail | None = None) -> str:
    """The whole configuration file; with `jail`, the workers drop to its account in the jail."""
    # the activator holds a request up to the cold-start limit: the router must wait longer for it
    longest = max([cold_start_limit_s, *(r.cold_start_limit_s or 0 for r in routes)])
    server_timeout_s = max(300, int(longest) + 30)
    lines = [
        "# Written by gpupool at each change of services; replicas and tokens change at runtime.",
        "global",
        # bound by the master (the pool's identity): the pool alone may open it
        f"    stats socket {paths.runtime_socket} mode 600 level admin",
        *([f"    chroot {paths.jail}", f"    uid {jail.uid}", f"    gid {jail.gid}"] if jail else []),
        # each request's total time, for p50/p99 (haproxy_log.py); a datagram never blocks HAProxy
        f"    log unix@{paths.seen_by_workers(paths.latency_log_socket, jail)} len {LINE_MAX} format raw "
        "local0 info",
        "defaults",
        "    mode http",
        "    log global",
        "    option http-keep-alive",
        "    timeout connect 5s",
        "    timeout client 300s",
        f"    timeout server {server_timeout_s}s",
        "    timeout http-request 30s",
        "frontend serve",
        f"    bind {host}:{port}",
        f"    log-format {_quoted(LOG_FORMAT)}",
        f"    http-request del-header {SERVICE_HEADER}",
        f"    http-request return status 404 content-type text/plain string {_quoted(no_route())} "
        "unless { path_reg ^/s/[^/]+/[^/]+(/|$) }",
        "    http-request set-var(txn.svc_tenant) path,field(3,/)",
        "    http-request set-var(txn.svc_name) path,field(4,/)",
        "    http-request set-var(txn.svc) var(txn.svc_tenant),concat(/,txn.svc_name)",
        f"    http-request set-var(txn.owner) var(txn.svc),map({paths.services_map})",
        "    http-request return status 404 content-type text/plain lf-string "
        + _quoted(unknown_service("%[var(txn.svc)]").replace('"', "'"))
        + " unless { var(txn.owner) -m found }",
        f"    acl public var(txn.svc),map({paths.public_map},no) -m str yes",
        "    http-request set-var(txn.tenant) req.hdr(authorization),regsub(\"^[Bb]earer +\",\"\"),"
        f"sha2(256),hex,lower,map({paths.tokens_map}) if {{ req.hdr(authorization) -m found }}",
        "    acl owner_ok var(txn.tenant),strcmp(txn.owner) eq 0",
        f"    http-request return status 401 content-type text/plain string {_quoted(UNAUTHENTICATED)} "
        "hdr WWW-Authenticate Bearer if !public !{ var(txn.tenant) -m found }",
        f"    http-request return status 403 content-type text/plain string {_quoted(FORBIDDEN)} "
        "if !public !owner_ok",
        # a pool token is the caller's credential to the pool, never the replica's to read
        "    http-request del-header authorization if { req.hdr(authorization) -m reg -i ^bearer\\ +gp_ }",
        "    http-request replace-path ^/s/[^/]+/[^/]+/?(.*) /\\1",
        f"    use_backend %[var(txn.svc),map({paths.backends_map})]",
    ]
    for route in sorted(routes, key=lambda r: r.service):
        lines += _backend(route, backends.get(route.service, ()), paths, jail)
    return "\n".join(lines) + "\n"


def render_maps(routes: Sequence[Route], tokens: Mapping[str, str]) -> dict[str, str]:
    """The map files' contents by HAProxyPaths attribute name."""
    ordered = sorted(routes, key=lambda r: r.service)
    return {
        "services_map": "".join(f"{r.service} {r.tenant}\n" for r in ordered),
        "public_map": "".join(f"{r.service} yes\n" for r in ordered if r.public),
        "backends_map": "".join(f"{r.service} {backend_name(r.service)}\n" for r in ordered),
        "tokens_map": "".join(f"{digest} {tenant}\n" for digest, tenant in sorted(tokens.items())),
    }
