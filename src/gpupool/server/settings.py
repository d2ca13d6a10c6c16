"""Server settings: one frozen dataclass filled from flags, then GPUPOOL_* environment variables."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpupool.errors import InvalidInput

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_SIMULATED_POOL = "2x8xH100"
"""What `gpupool up` serves, clearly labelled as simulated, on a machine with no accelerator."""


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
    database_url: str = ""
    provider: str = "local"
    simulate: str = ""
    placement: str = ""
    """`gpupool up --policy`: overrides the configuration's placement ('' = the configuration's)."""
    cycle_interval_s: float = 1.0
    busy_poll_interval_s: float = 0.02
    seed: int = 0
    create_admin_token: bool = True
    token_expiry_s: float = 90 * 86400.0
    """Lifetime of a created token unless its creator says otherwise (the first admin token: never)."""
    metrics_public: bool = False
    """Serve /metrics without a token (a loopback-only setup)."""
    tls_cert: Path | None = None
    """PEM certificate chain to serve HTTPS with (together with tls_key)."""
    tls_key: Path | None = None

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise InvalidInput(f"Port must be between 1 and 65535, got {self.port}.")
        if self.cycle_interval_s <= 0 or self.busy_poll_interval_s <= 0:
            raise InvalidInput("Loop intervals must be positive numbers of seconds.")
        if self.token_expiry_s <= 0:
            raise InvalidInput("The default token lifetime must be a positive number of seconds.")
        if self.metrics_public and not is_loopback(self.host):
            raise InvalidInput(f"--metrics-public serves usage without a token, so it needs a loopback "
                               f"--host (127.0.0.1), not {self.host}; scrape with a metrics token instead.")
        _check_tls(self.tls_cert, self.tls_key)
        if self.database_url and not self.database_url.startswith(("sqlite", "postgresql")):
            raise InvalidInput(
                f"Unsupported database URL {self.database_url!r}; use sqlite:///PATH or "
                "postgresql+psycopg://USER@HOST:PORT/DB."
            )

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
