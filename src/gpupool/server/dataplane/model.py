"""What the data plane routes: services, their replicas' endpoints, tokens, and the answers it gives."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
SERVICE_KEY = re.compile(rf"^{LABEL}/{LABEL}$")
"""How a service appears in its URL, /s/<tenant>/<name>/: names are unique per tenant only, and a URL
that names the tenant cannot be squatted or shadowed by another tenant's service of the same name."""
POOL_TOKEN = re.compile(r"^Bearer +gp_", re.IGNORECASE)
"""An Authorization header that carries a pool token: never passed on to a replica."""


@dataclass(frozen=True, slots=True)
class Probe:
    """The service's readiness probe, which the router's health checks repeat."""

    path: str | None = "/"
    """HTTP GET path; None: a TCP connect."""
    interval_s: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3
    timeout_s: float = 1.0


@dataclass(frozen=True, slots=True)
class Route:
    service: str
    """<tenant>/<name>"""
    tenant: str
    public: bool = False
    probe: Probe = field(default_factory=Probe)
    cold_start_limit_s: float | None = None
    """How long a request waits for a first ready replica; None: the pool's limit."""

    def __post_init__(self) -> None:
        if not SERVICE_KEY.match(self.service) or self.service.split("/")[0] != self.tenant:
            raise ValueError(f"service {self.service!r} is not <tenant>/<name> of tenant {self.tenant!r}")


@dataclass(frozen=True, slots=True, order=True)
class Backend:
    """One ready replica's address, as the router reaches it."""

    replica_id: str
    host: str
    port: int

    @property
    def server_name(self) -> str:
        return "r-" + re.sub(r"[^A-Za-z0-9_.-]", "_", self.replica_id)


@dataclass(frozen=True, slots=True)
class ServiceTraffic:
    """What the router saw of one service at one instant (the autoscaler's sample)."""

    service: str
    in_flight: int
    """Requests at a replica, queued for one or held by the activator."""
    requests_total: int
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    latency_avg_ms: float | None = None
    cold_starts: int = 0


def no_route() -> str:
    return "no route: services are reached at /s/<tenant>/<service>/<path>"


def unknown_service(service: str) -> str:
    return f"no service {service!r} is served here; `gpupool service ls` lists the services"


UNAUTHENTICATED = ("this service answers only its tenant's bearer tokens: send 'Authorization: Bearer "
                   "<token>' with a token that is neither revoked nor expired")
FORBIDDEN = ("this service belongs to another tenant: use a token of the service's tenant, or ask its "
             "owner to declare it public")


def cold_start_timeout(service: str, limit_s: float) -> str:
    return (f"no replica of service {service!r} became ready within the {limit_s:g} s cold-start limit; "
            f"retry after the time in Retry-After")
