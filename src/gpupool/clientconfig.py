"""Where the CLI and the SDK find the server and the token (kept free of heavy imports).

Order: explicit arguments, then GPUPOOL_URL / GPUPOOL_TOKEN, then ~/.config/gpupool/config.toml
(keys `url` and `token`), then, for a server on this machine, the admin-token file that
`gpupool up` wrote in the default data directory.

For an https:// server whose certificate a private CA signed, GPUPOOL_CA_BUNDLE (or the config
file's `ca_bundle` key) names that CA's PEM file; otherwise the system's trusted CAs verify it.
"""

from __future__ import annotations

import os

DEFAULT_URL = "http://127.0.0.1:8765"


def config_path() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "gpupool", "config.toml")


def _config_file() -> dict[str, object]:
    path = config_path()
    if not os.path.isfile(path):
        return {}
    import tomllib

    from gpupool.errors import InvalidInput

    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InvalidInput(f"Cannot read {path}: {exc}; fix or remove that file.") from None


def _local_admin_token(url: str) -> str:
    if "://127.0.0.1" not in url and "://localhost" not in url:
        return ""
    import platformdirs

    path = os.path.join(platformdirs.user_data_dir("gpupool", appauthor=False), "admin-token")
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def resolve(url: str | None = None, token: str | None = None) -> tuple[str, str]:
    """(base URL without a trailing slash, token or '')."""
    config: dict[str, object] | None = None
    if not url:
        url = os.environ.get("GPUPOOL_URL", "")
        if not url:
            config = _config_file()
            url = str(config.get("url", "")) or DEFAULT_URL
    if not token:
        token = os.environ.get("GPUPOOL_TOKEN", "")
        if not token:
            config = _config_file() if config is None else config
            token = str(config.get("token", "")) or _local_admin_token(url)
    return url.rstrip("/"), token


def ca_bundle() -> str | None:
    """The PEM file of CAs to trust for https:// (GPUPOOL_CA_BUNDLE, then `ca_bundle` in the config
    file), or None for the system's; raises InvalidInput when the named file cannot be read."""
    path = os.environ.get("GPUPOOL_CA_BUNDLE", "")
    source = "GPUPOOL_CA_BUNDLE"
    if not path:
        path = str(_config_file().get("ca_bundle", ""))
        source = f"ca_bundle in {config_path()}"
    if not path:
        return None
    if not os.access(path, os.R_OK) or not os.path.isfile(path):
        from gpupool.errors import InvalidInput

        raise InvalidInput(f"{source} names {path!r}, which is not a readable file; point it at the "
                           "PEM certificate of the CA that signed the server's certificate.")
    return path
