"""API models for inference services (docs/services.md): the spec a tenant submits, and what the
server answers about one.

A service is a set of replicas, each one workload of one pod with its slice, given a port in
$PORT (the spec's `port_env`) and probed by the server; the controller keeps their count at
`desired`, clamped to [min_replicas, max_replicas].
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from gpupool.api.common import ArgText, LineText, Name, Strict
from gpupool.api.images import ImageName
from gpupool.api.mounts import MAX_MOUNTS, MAX_SECRET_USES, MountSpec, SecretUse
from gpupool.api.workloads import (
    MAX_COMMAND_ARGS,
    MAX_CONSTRAINTS,
    ConstraintText,
    ResourcesSpec,
    WorkloadSpec,
    check_command_size,
    check_env_size,
    check_pool_env,
    is_stored,
)

MAX_SERVICE_REPLICAS = 1000
MAX_PERIOD_S = 3600.0
MIN_TARGET = 0.001
"""The least target per replica (in flight, or requests a second): below it a trickle of traffic would
ask for every replica the service may have."""


class ProbeKind(StrEnum):
    HTTP = "http"
    TCP = "tcp"


PROBE_PATH = r"^/[\x21\x23-\x26\x28-\x5b\x5d-\x7e]*$"
"""An HTTP probe's path: printable ASCII but space, quotes and backslash, which the data plane's
generated configuration would read as its own syntax (a quote in one service's path made HAProxy
refuse the whole configuration, so no service's routes changed again)."""


class ProbeSpec(Strict):
    """A readiness or liveness check the server runs against each replica's $PORT: an HTTP GET of
    `path` that must answer 2xx or 3xx, or a TCP connect that must be accepted."""

    kind: ProbeKind = ProbeKind.HTTP
    path: str = Field("/", max_length=1024, pattern=PROBE_PATH, description=(
        "the HTTP path to GET (http probes): printable ASCII without spaces, quotes or backslashes"))
    period_s: float = Field(2.0, ge=0.1, le=MAX_PERIOD_S, allow_inf_nan=False)
    timeout_s: float = Field(1.0, gt=0, le=60, allow_inf_nan=False)
    success_threshold: int = Field(1, ge=1, le=100)
    failure_threshold: int = Field(3, ge=1, le=100)
    initial_delay_s: float = Field(0.0, ge=0, le=MAX_PERIOD_S, allow_inf_nan=False)

    @model_validator(mode="after")
    def _timeout_within_period(self) -> ProbeSpec:
        if self.timeout_s > self.period_s:
            raise ValueError(f"a probe's timeout_s ({self.timeout_s:g}) must not exceed its period_s "
                             f"({self.period_s:g}); shorten the timeout or lengthen the period")
        return self


class RolloutSpec(Strict):
    """How a spec change replaces the replicas (Kubernetes' RollingUpdate): at most `max_surge`
    replicas beyond the desired count at once, at most `max_unavailable` of the desired count not
    ready at once."""

    max_surge: int = Field(1, ge=0, le=MAX_SERVICE_REPLICAS)
    max_unavailable: int = Field(0, ge=0, le=MAX_SERVICE_REPLICAS)

    @model_validator(mode="after")
    def _can_progress(self) -> RolloutSpec:
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError("a rollout with max_surge 0 and max_unavailable 0 could never replace a "
                             "replica; allow at least one of them (max_surge: 1)")
        return self


class ServiceRole(StrEnum):
    """A prefill/decode pair's halves (docs/services.md#prefilldecode-pairs)."""

    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def opposite(self) -> ServiceRole:
        return ServiceRole.DECODE if self is ServiceRole.PREFILL else ServiceRole.PREFILL


class ServiceSpec(Strict):
    """An inference service as submitted (`gpupool service create`, POST /v1/services)."""

    name: Name
    command: list[ArgText] = Field(min_length=1, max_length=MAX_COMMAND_ARGS,
                                   description="program and arguments")
    tenant: Name | None = Field(default=None, description="admin only: create it on behalf of this tenant")
    queue: Name = "default"
    resources: ResourcesSpec = Field(default_factory=lambda: ResourcesSpec.model_validate({}),
                                     description="what each replica asks for")
    port_env: str = Field("PORT", min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                          description="the variable that gives each replica the port to listen on")
    min_replicas: int = Field(1, ge=0, le=MAX_SERVICE_REPLICAS)
    max_replicas: int = Field(1, ge=1, le=MAX_SERVICE_REPLICAS)
    replicas: int | None = Field(None, ge=0, le=MAX_SERVICE_REPLICAS,
                                 description="the replicas wanted at first (default: min_replicas)")
    target_concurrency: float | None = Field(None, allow_inf_nan=False, description=(
        "requests in flight per replica the autoscaler aims at"))
    target_rps: float | None = Field(None, allow_inf_nan=False, description=(
        "requests per second per replica the autoscaler aims at"))
    readiness: ProbeSpec | None = Field(default=None, description="a replica gets traffic once this passes; "
                                        "default: a TCP connect to its port")
    liveness: ProbeSpec | None = Field(default=None, description="a replica failing this is replaced")
    rollout: RolloutSpec = Field(default_factory=lambda: RolloutSpec.model_validate({}))
    priority_class: Name | None = Field(default=None, description=(
        "one of the pool's priority classes; default: the pool's serving.priority_class"))
    public: bool = Field(False, description="its endpoints answer requests without the tenant's token")
    env: dict[Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")],
              ArgText] = Field(default_factory=dict)
    workdir: str = Field("", max_length=4096)
    image: ImageName | None = None
    constraints: list[ConstraintText] = Field(default_factory=list, max_length=MAX_CONSTRAINTS)
    mounts: list[MountSpec] = Field(default_factory=list, max_length=MAX_MOUNTS)
    secrets: list[SecretUse] = Field(default_factory=list, max_length=MAX_SECRET_USES)
    # prefill/decode pairs (docs/services.md#prefilldecode-pairs)
    role: ServiceRole | None = Field(default=None, description="prefill or decode: this half of a pair")
    pair_with: Name | None = Field(default=None, description=(
        "the tenant's service of the opposite role its replicas pass KV caches to or from; it may be "
        "created before or after this one"))
    on_behalf: Literal["admin", "federation"] | None = Field(default=None, description=(
        "set by the server when the admin creates or changes what the service runs for a tenant: its "
        "replicas run as the tenant's on-behalf account (docs/security.md#on-behalf-work); not submitted"))

    @field_validator("command")
    @classmethod
    def _command_size(cls, value: list[str]) -> list[str]:
        return check_command_size(value)

    @field_validator("env")
    @classmethod
    def _env_size(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        value = check_env_size(value)
        return value if is_stored(info) else check_pool_env(value)

    @field_validator("target_concurrency", "target_rps")
    @classmethod
    def _positive_target(cls, value: float | None, info: ValidationInfo) -> float | None:
        # a spec stored before MIN_TARGET was the rule is read as it was (the autoscaler caps its wants)
        if value is None:
            return None
        too_low = value <= 0 if is_stored(info) else value < MIN_TARGET
        if too_low or value > 1e6:
            raise ValueError(f"a target per replica must be at least {MIN_TARGET:g} (and at most 1e6), not "
                             f"{value:g}: a target near 0 would ask for endless replicas; leave it out to "
                             "not autoscale")
        return value

    @model_validator(mode="after")
    def _bounds(self, info: ValidationInfo) -> ServiceSpec:
        check_bounds(self.min_replicas, self.max_replicas)
        if self.replicas is not None and not self.min_replicas <= self.replicas <= self.max_replicas:
            raise _refused(f"replicas ({self.replicas}) must lie between min_replicas "
                           f"({self.min_replicas}) and max_replicas ({self.max_replicas})")
        if (self.role is None) != (self.pair_with is None):
            raise _refused("role and pair_with go together: a prefill service names its decode service "
                           "(role: prefill, pair_with: NAME) and the reverse; give both or neither")
        if self.pair_with is not None and self.pair_with == self.name:
            raise _refused(f"a service cannot pair with itself ({self.name}); pair_with names the "
                           f"service of the opposite role")
        if self.port_env in self.env:
            raise _refused(f"env sets {self.port_env}, which the pool sets to each replica's port; "
                           "remove it from env (or choose another port_env)")
        try:  # every rule of a workload holds for its replicas: refused here, not when one is made
            WorkloadSpec.model_validate(self.replica_fields(None, 1024), context=info.context)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ()))
            text = str(first.get("msg", "")).removeprefix("Value error, ")
            raise _refused(f"{where}: {text}" if where else text) from None
        return self

    def replica_fields(self, tenant: str | None, port: int) -> dict[str, Any]:
        """One replica's workload spec: the service's command and slice, its port in `port_env`, and no
        requeue of its own (the controller replaces a replica that ended)."""
        return {
            "command": self.command, "name": self.name, "tenant": tenant, "queue": self.queue,
            "resources": self.resources.model_dump(mode="json"),
            "env": {**self.env, self.port_env: str(port)},
            "workdir": self.workdir, "max_retries": 0, "serve_port": port, "image": self.image,
            "constraints": self.constraints, "mounts": [m.model_dump(mode="json") for m in self.mounts],
            "secrets": [s.model_dump(mode="json") for s in self.secrets],
            "service_role": None if self.role is None else self.role.value, "pair_with": self.pair_with,
            "on_behalf": self.on_behalf}

    @property
    def initial_replicas(self) -> int:
        return self.min_replicas if self.replicas is None else self.replicas

    @property
    def readiness_probe(self) -> ProbeSpec:
        return self.readiness or ProbeSpec.model_validate({"kind": ProbeKind.TCP})


def _refused(text: str) -> PydanticCustomError:
    """A whole-spec rule's refusal, its message as written (a ValueError's would read "Value error,
    ..." wherever the server quotes pydantic's message, as an update's refusal does)."""
    return PydanticCustomError("value_error", text)


def check_bounds(low: int, high: int) -> None:
    if low > high:
        raise _refused(f"min_replicas ({low}) is above max_replicas ({high}); the rule is "
                       "min_replicas <= max_replicas")


UPDATABLE = frozenset(ServiceSpec.model_fields) - {
    "name", "tenant", "queue", "role", "pair_with", "on_behalf"}


class ServiceUpdate(Strict):
    """PATCH /v1/services/{name}: the spec's fields to change (the others are kept). A change to what
    the replicas run rolls them over; a change of bounds, targets or `public` does not."""

    changes: dict[str, Any] = Field(min_length=1, description="ServiceSpec fields and their new values")

    @field_validator("changes")
    @classmethod
    def _known(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - UPDATABLE)
        if unknown:
            raise ValueError(f"cannot change {', '.join(unknown)} of a service; changeable are "
                             f"{', '.join(sorted(UPDATABLE))} (a new name is a new service)")
        return value


class ScaleRequest(Strict):
    replicas: int = Field(ge=0, le=MAX_SERVICE_REPLICAS,
                          description="clamped to [min_replicas, max_replicas]")
    expected_version: int | None = Field(None, ge=0, description=(
        "apply only if the service's version is still this (compare-and-set); 409 otherwise"))
    reason: LineText = Field("", max_length=256)


class ReplicaOut(Strict):
    workload_id: str
    status: str = Field(description="the replica workload's status")
    ready: str = Field(description="starting, ready, unready, failed or draining")
    generation: int
    node: str = ""
    host: str = ""
    port: int
    last_error: str = ""


class PartnersOut(Strict):
    """GET /v1/services/{name}/partners: where the paired service's ready replicas answer now."""

    service: str
    role: str
    pair_with: str
    exists: bool = Field(description="whether the partner service has been created yet")
    endpoints: list[str] = Field(description="host:port of each ready replica of the partner, sorted")


class ServiceEventOut(Strict):
    reason: str
    message: str
    at_s: float


class ServiceLive(Strict):
    """What the data plane's router sees of one service now (its last one-second tick)."""

    requests_per_s: float
    in_flight: int
    latency_p50_ms: float | None = Field(default=None, description="in-process router only")
    latency_p99_ms: float | None = Field(default=None, description="in-process router only")
    latency_mean_ms: float | None = Field(default=None,
                                          description="HAProxy: the mean of its last 1024 requests")


class ServiceOut(Strict):
    id: str
    name: str
    tenant: str
    state: str = Field(description="pending, ready, degraded or deleting")
    desired: int
    ready_replicas: int
    min_replicas: int
    max_replicas: int
    target_concurrency: float | None = None
    target_rps: float | None = None
    public: bool
    generation: int
    version: int
    last_probe_error: str = ""
    created_s: float
    updated_s: float
    spec: dict[str, Any]
    replicas: list[ReplicaOut] = Field(default_factory=list)
    events: list[ServiceEventOut] = Field(default_factory=list)
    live: ServiceLive | None = Field(default=None,
                                     description="the router's numbers now; null without --serve-port")
    url: str | None = Field(default=None, description=(
        "where its requests go (the data plane's /s/<tenant>/<service>/); null when the pool routes no "
        "service traffic (it was started without --serve-port)"))


# --- the dashboard's service page (docs/dashboard.md) ---
class ServiceHistorySeries(Strict):
    name: str = Field(description="ready, desired, requests_per_s, in_flight, latency_p50_ms, "
                                  "latency_p99_ms or latency_mean_ms")
    values: list[tuple[float, float]] = Field(description="[bucket start (epoch s), mean]")


class ServiceHistoryOut(Strict):
    """GET /v1/services/{name}/history: the service page's charts, its live numbers and scale events."""

    service: str = Field(description="<tenant>/<name>")
    range: str
    step_s: int
    since_s: float
    now_s: float
    router: str = Field(description="haproxy, in-process, or none (no --serve-port)")
    latency: str = Field(description="quantiles (p50/p99 per request) or mean (HAProxy's average)")
    live: ServiceLive | None = Field(description="null where no router serves or it has not seen the service")
    series: list[ServiceHistorySeries]
    events: list[ServiceEventOut]


class ServiceStreamEvent(Strict):
    """One service event as `GET /events/services/stream` sends it (`gpupool events --services`)."""

    id: int = Field(description="grows with each event stored: resume after it (Last-Event-ID)")
    tenant: str
    service: str
    reason: str = Field(description="scaled, cold_start, replica replaced, rollout step, degraded ...")
    message: str
    at_s: float
