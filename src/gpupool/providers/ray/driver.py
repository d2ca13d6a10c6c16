"""This process's connection to the Ray cluster (the server, `gpupool node join`, tests).

Always to an explicit address, never a bare ray.init() (which would start a private cluster or
attach to whatever cluster this machine last ran). One connection per process, shared by the
providers in it and counted, so closing one provider does not cut another off.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import ray

from gpupool.errors import ProviderError
from gpupool.providers.ray.settings import NAMESPACE, check_version, ray_env

_lock = threading.Lock()
_users = 0
_address = ""


def connect(address: str, token_path: Path) -> None:
    """Connect this process to the cluster at `address` (HOST:PORT) with the token at `token_path`.
    Raises ProviderError when the address is empty, differs from this process's connection, or
    does not answer."""
    global _users, _address
    check_version(ray.__version__)
    if not address or address == "auto":
        raise ProviderError("Give the Ray cluster's address as HOST:PORT (gpupool never attaches to "
                            "whatever cluster this machine ran last).")
    with _lock:
        if _users and ray.is_initialized():
            if address != _address:
                raise ProviderError(f"This process is already connected to the Ray cluster at {_address}; "
                                    f"it cannot also use {address}.")
            _users += 1
            return
        _use_token(token_path)
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                     logging_level=logging.WARNING, configure_logging=False)
        except Exception as exc:  # ConnectionError, RuntimeError, auth failures
            raise ProviderError(f"Cannot connect to the Ray cluster at {address} ({_one_line(exc)}); "
                                "check the address and that this machine has the cluster's token.") from None
        _users, _address = 1, address


def _use_token(token_path: Path) -> None:
    """Point this process's Ray client at the token: Ray reads its configuration from the
    environment once and caches the token, so both are reloaded (as Ray's own tests do)."""
    os.environ.update(ray_env(token_path))
    os.environ.pop("RAY_AUTH_TOKEN", None)  # it would win over the file
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def disconnect() -> None:
    """Drop one user of the connection; the last one disconnects. Idempotent past zero."""
    global _users, _address
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0:
            _address = ""
            ray.shutdown()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
