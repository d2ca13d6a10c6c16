"""Server settings: one frozen dataclass filled from flags, then GPUPOOL_* environment variables."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpupool.core.units import parse_size_bytes
from gpupool.errors import InvalidInput

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_SIMULATED_POOL = "2x8xH100"
"""What `gpupool up` serves, clearly labelled as simulated, on a machine with no accelerator."""
DEFAULT_MAX_REQUEST_BODY_BYTES = 2**20
DEFAULT_MAX_POD_LOG_BYTES = 2**30
"""The agent's DEFAULT_MAX_LOG_BYTES (not imported: the CLI reads this module at start)."""
DEFAULT_TENANT_REQUEST_RATE = "100/second;3000/minute"
"""What each tenant may send to one server's API unless GPUPOOL_TENANT_REQUEST_RATE says otherwise."""
DEFAULT_TENANT_OPEN_REQUESTS = 64
"""How many requests each tenant may have open on one server at once unless
GPUPOOL_TENANT_OPEN_REQUESTS says otherwise."""
MIN_MAX_REQUEST_BODY_BYTES = 64 * 1024
"""Below this a plain submission with a few environment variables would be refused."""
MIN_MAX_POD_LOG_BYTES = 4096


def default_data_dir() -> Path:
    """The user's data directory for gpupool (platformdirs), e.g. ~/.local/share/gpupool."""
    import platformdirs

    return Path(platformdirs.user_data_dir("gpupool", appauthor=False))


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything one server process needs to know; nothing here is read after start-up."""

    data_dir: Path = field(default_factory=default_data_dir)
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    database_url: str = field(default="", repr=False)
    """The store's URL, perhaps with a password: left out of repr(), so no log or error quotes it."""
    provider: str = "local"
    simulate: str = ""
    placement: str = ""
    """`gpupool up --policy`: overrides the configuration's placement ('' = the configuration's)."""
    cycle_interval_s: float = 1.0
    busy_poll_interval_s: float = 0.02
    store_audit_interval_s: float = 60.0
    """At most this often the loop compares its cached placements with the store read afresh
    (loops/store_audit.py); 0 turns the audit off."""
    seed: int = 0
    create_admin_token: bool = True
    token_expiry_s: float = 90 * 86400.0
    """Lifetime of a created token unless its creator says otherwise (the first admin token: never)."""
    metrics_public: bool = False
    """Serve /metrics without a token (a loopback-only setup)."""
    tls_cert: Path | None = None
    """PEM certificate chain to serve HTTPS with (together with tls_key)."""
    tls_key: Path | None = None
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    """Larger request bodies are refused with 413 before they are read (remote calls: their own
    payload limit)."""
    max_pod_log_bytes: int = DEFAULT_MAX_POD_LOG_BYTES
    """What one pod's log (each stream) may hold on the agent's disk; the rest is dropped."""
    pool_id: str = ""
    """The pool's short stable id (`pool-id` in the data directory, made by `gpupool up`): its pods'
    accounts are `gpupool-<pool id>-<tenant>`, so two pools on one machine never share one. ''
    (a server built outside `gpupool up`): `gpupool-<tenant>`."""
    launch_deadline_s: float = 30.0
    """How long one pod's launch may take before the pod is failed with that reason (the launch
    runs in its node's launch worker, outside the control loop; GPUPOOL_LAUNCH_DEADLINE_S). Keep it
    above the agent's GPUPOOL_LAUNCH_TIMEOUT_S, so the agent's own, more precise sentence wins."""
    image_dir: Path | None = None
    """The image store (server/images.py; GPUPOOL_IMAGE_DIR): default DATA_DIR/images, or, for a
    root server (whose pods run as other accounts and must read the images, while the data directory
    is closed to them), /var/lib/gpupool-images/POOL_ID."""
    history_days: float = 30.0
    """How long the dashboard's history (services/history.py) is kept; 0 turns the history sampler
    off (GPUPOOL_HISTORY_DAYS). Minute rows are rolled up into hourly ones after a day."""
    agent_dir: Path | None = None
    """The agents' state and the pods' logs (default: DATA_DIR/agents); may be on another
    filesystem than the store, so a pod's output can never fill the store's disk."""
    # several servers on one PostgreSQL store (server/leader.py, docs/ha.md)
    ha: bool = False
    """`gpupool up --ha`: this server shares its store with others; it schedules only while it holds
    the leader lease."""
    lease_s: float = 10.0
    """How long the leader lease lasts unless renewed (GPUPOOL_LEASE_S): a dead leader's successor
    takes over at most this long after its last renewal."""
    lease_renew_s: float = 2.0
    """How often the leader renews its lease (GPUPOOL_LEASE_RENEW_S); less than a third of lease_s."""
    # ---- the services' data plane (server/dataplane, docs/serving-dataplane.md): one block
    serve_port: int = 0
    """`gpupool up --serve-port`: services answer at http://SERVE_HOST:SERVE_PORT/s/<tenant>/<name>/;
    0: the pool routes no service traffic."""
    serve_host: str = DEFAULT_HOST
    serve_router: str = "auto"
    """auto (HAProxy when installed, else the in-process router), haproxy or in-process."""
    serve_cold_start_s: float = 60.0
    """How long a request for a service with no ready replica is held before a 503."""
    tenant_request_rate: str = DEFAULT_TENANT_REQUEST_RATE
    """What each tenant may send to this server's API (server/ratelimit.py;
    GPUPOOL_TENANT_REQUEST_RATE): requests per moving window, e.g. "100/second;3000/minute";
    "off": not bounded. The admin's requests are not counted."""
    tenant_open_requests: int = DEFAULT_TENANT_OPEN_REQUESTS
    """How many of each tenant's API requests one server holds open at once: followed event and
    log streams, long polls, execs (server/ratelimit.py; GPUPOOL_TENANT_OPEN_REQUESTS); 0: not
    bounded. Each holds a connection and a file descriptor of the server's."""

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise InvalidInput(f"Port must be between 1 and 65535, got {self.port}.")
        if self.cycle_interval_s <= 0 or self.busy_poll_interval_s <= 0:
            raise InvalidInput("Loop intervals must be positive numbers of seconds.")
        if not self.store_audit_interval_s >= 0:
            raise InvalidInput("The store audit interval must be 0 (off) or a positive number of seconds.")
        if not self.launch_deadline_s > 0:
            raise InvalidInput(f"The launch deadline must be a positive number of seconds, got "
                               f"{self.launch_deadline_s}; set GPUPOOL_LAUNCH_DEADLINE_S to, e.g., 30.")
        if not 0 <= self.history_days <= 3660:
            raise InvalidInput(f"The history retention must be 0 (off) to 3660 days, got "
                               f"{self.history_days}; set GPUPOOL_HISTORY_DAYS to, e.g., 30.")
        if (self.serve_port and not 0 < self.serve_port < 65536) or self.serve_port == self.port:
            raise InvalidInput(f"--serve-port must be between 1 and 65535 and not the API's --port, got "
                               f"{self.serve_port}.")
        from gpupool.server.ratelimit import parse_rate  # (the library is the server's alone)

        parse_rate(self.tenant_request_rate)  # a sentence saying what was wrong, at start-up
        if not 0 <= self.tenant_open_requests <= 1_000_000:
            raise InvalidInput(f"--tenant-open-requests (GPUPOOL_TENANT_OPEN_REQUESTS) must be 0 (not "
                               f"bounded) or a number of requests, e.g. 64, not {self.tenant_open_requests}.")
        if self.serve_router not in ("auto", "haproxy", "in-process"):
            raise InvalidInput(f"--serve-router must be auto, haproxy or in-process, "
                               f"not {self.serve_router!r}.")
        if not 0 < self.serve_cold_start_s <= 3600:
            raise InvalidInput(f"--serve-cold-start must be above 0 and at most 3600 seconds, got "
                               f"{self.serve_cold_start_s:g}.")
        if self.token_expiry_s <= 0:
            raise InvalidInput("The default token lifetime must be a positive number of seconds.")
        if self.metrics_public and not is_loopback(self.host):
            raise InvalidInput(f"--metrics-public serves usage without a token, so it needs a loopback "
                               f"--host (127.0.0.1), not {self.host}; scrape with a metrics token instead.")
        _check_tls(self.tls_cert, self.tls_key)
        if self.max_request_body_bytes < MIN_MAX_REQUEST_BODY_BYTES:
            raise InvalidInput(f"The request body limit must be at least "
                               f"{MIN_MAX_REQUEST_BODY_BYTES // 1024} KiB, got {self.max_request_body_bytes} "
                               "bytes; raise --max-request-body.")
        if self.max_pod_log_bytes < MIN_MAX_POD_LOG_BYTES:
            raise InvalidInput(f"The pod log cap must be at least {MIN_MAX_POD_LOG_BYTES} bytes, got "
                               f"{self.max_pod_log_bytes}; raise --max-pod-log.")
        if self.database_url and not self.database_url.startswith(("sqlite", "postgresql")):
            from gpupool.server.dburl import mask

            raise InvalidInput(
                f"Unsupported database URL {mask(self.database_url)!r}; use sqlite:///PATH or "
                "postgresql+psycopg://USER@HOST:PORT/DB."
            )
        if self.database_url:
            from gpupool.server.dburl import check

            check(self.database_url)
        if self.ha and not self.database_url.startswith("postgresql"):
            raise InvalidInput("--ha shares the store between servers, so it needs PostgreSQL: give "
                               "--database-url postgresql+psycopg://USER@HOST:PORT/DB (or "
                               "GPUPOOL_DATABASE_URL).")
        if not (self.lease_s > 0 and 0 < self.lease_renew_s * 3 <= self.lease_s):
            raise InvalidInput(f"The lease renew interval must be positive and at most a third of the "
                               f"lease, got renew {self.lease_renew_s:g} s for a lease of "
                               f"{self.lease_s:g} s; "
                               "set GPUPOOL_LEASE_RENEW_S and GPUPOOL_LEASE_S, e.g. 2 and 10.")

    @property
    def resolved_database_url(self) -> str:
        """The explicit URL, else the embedded SQLite file in the data directory."""
        return self.database_url or f"sqlite:///{self.data_dir / 'gpupool.sqlite'}"

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"

    @property
    def admin_token_path(self) -> Path:
        return self.data_dir / "admin-token"

    @property
    def resolved_image_dir(self) -> Path:
        if self.image_dir is not None:
            return self.image_dir
        if os.geteuid() == 0:
            return Path("/var/lib/gpupool-images") / (self.pool_id or "pool")
        return self.data_dir / "images"

    @property
    def resolved_agent_dir(self) -> Path:
        """Where the agents keep pods' state and logs: the explicit directory, else DATA_DIR/agents."""
        return self.agent_dir or self.data_dir / "agents"

    def with_env(self, environ: dict[str, str] | None = None) -> Settings:
        """Fill fields left at their defaults from GPUPOOL_DATABASE_URL, GPUPOOL_PLACEMENT..."""
        env = os.environ if environ is None else environ
        changes: dict[str, object] = {}
        if not self.database_url and env.get("GPUPOOL_DATABASE_URL"):
            changes["database_url"] = env["GPUPOOL_DATABASE_URL"]
        if env.get("GPUPOOL_PLACEMENT"):
            changes["placement"] = env["GPUPOOL_PLACEMENT"]
        if env.get("GPUPOOL_CYCLE_INTERVAL_S"):
            try:
                changes["cycle_interval_s"] = float(env["GPUPOOL_CYCLE_INTERVAL_S"])
            except ValueError:
                raise InvalidInput("GPUPOOL_CYCLE_INTERVAL_S must be a number of seconds.") from None
        if env.get("GPUPOOL_STORE_AUDIT_INTERVAL_S"):
            try:
                changes["store_audit_interval_s"] = float(env["GPUPOOL_STORE_AUDIT_INTERVAL_S"])
            except ValueError:
                raise InvalidInput(
                    "GPUPOOL_STORE_AUDIT_INTERVAL_S must be a number of seconds (0: off).") from None
        if env.get("GPUPOOL_LAUNCH_DEADLINE_S"):
            try:
                changes["launch_deadline_s"] = float(env["GPUPOOL_LAUNCH_DEADLINE_S"])
            except ValueError:
                raise InvalidInput(
                    "GPUPOOL_LAUNCH_DEADLINE_S must be a number of seconds, e.g. 30.") from None
        if env.get("GPUPOOL_HISTORY_DAYS"):
            try:
                changes["history_days"] = float(env["GPUPOOL_HISTORY_DAYS"])
            except ValueError:
                raise InvalidInput(
                    "GPUPOOL_HISTORY_DAYS must be a number of days, e.g. 30 (0: off).") from None
        for name, key, default in (
                ("GPUPOOL_MAX_REQUEST_BODY", "max_request_body_bytes", DEFAULT_MAX_REQUEST_BODY_BYTES),
                ("GPUPOOL_MAX_POD_LOG", "max_pod_log_bytes", DEFAULT_MAX_POD_LOG_BYTES)):
            if env.get(name) and getattr(self, key) == default:
                changes[key] = parse_size_bytes(env[name], name)
        for name, key in (("GPUPOOL_LEASE_S", "lease_s"), ("GPUPOOL_LEASE_RENEW_S", "lease_renew_s")):
            if env.get(name):
                try:
                    changes[key] = float(env[name])
                except ValueError:
                    raise InvalidInput(f"{name} must be a number of seconds, e.g. "
                                       f"{'10' if key == 'lease_s' else '2'}.") from None
        if env.get("GPUPOOL_TENANT_REQUEST_RATE") and self.tenant_request_rate == DEFAULT_TENANT_REQUEST_RATE:
            changes["tenant_request_rate"] = env["GPUPOOL_TENANT_REQUEST_RATE"]
        open_env = env.get("GPUPOOL_TENANT_OPEN_REQUESTS")
        if open_env and self.tenant_open_requests == DEFAULT_TENANT_OPEN_REQUESTS:
            try:
                changes["tenant_open_requests"] = int(open_env)
            except ValueError:
                raise InvalidInput("GPUPOOL_TENANT_OPEN_REQUESTS must be 0 (not bounded) or a number of "
                                   "requests, e.g. 64.") from None
        if self.image_dir is None and env.get("GPUPOOL_IMAGE_DIR"):
            changes["image_dir"] = Path(env["GPUPOOL_IMAGE_DIR"])
        if self.agent_dir is None and env.get("GPUPOOL_AGENT_DIR"):
            changes["agent_dir"] = Path(env["GPUPOOL_AGENT_DIR"])
        return replace(self, **changes) if changes else self  # type: ignore[arg-type]


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (localhost, 127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_tls(cert: Path | None, key: Path | None) -> None:
    """Both TLS files or neither, and each readable."""
    if (cert is None) != (key is None):
        raise InvalidInput("--tls-cert and --tls-key go together; give both (HTTPS) or neither (HTTP).")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        if path is None:
            continue
        try:
            with open(path, "rb") as handle:
                handle.read(1)
        except OSError as exc:
            raise InvalidInput(
                f"Cannot read {flag} file {str(path)!r} ({exc.strerror or exc}); give a readable PEM file."
            ) from None
