"""What travels: functions and arguments pickled by value (cloudpickle), results and exceptions back.

Functions of __main__ travel by value on their own; those of the caller's own modules (anything not
installed in site-packages, the standard library or gpupool) are registered to travel by value too,
so the pool needs none of the caller's files, only the same Python and the installed packages.
"""

from __future__ import annotations

import base64
import functools
import os
import sys
import sysconfig
from collections.abc import Callable
from types import ModuleType
from typing import Any

import cloudpickle

from gpupool.api.calls import MAX_PAYLOAD_BYTES
from gpupool.remote.errors import CallCancelled, RemoteCallError

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
"""This client's Python minor version; the pool refuses a session from another one."""
_MIB = 2**20


@functools.cache
def _installed_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(paths[name]) for name in ("stdlib", "platstdlib", "purelib", "platlib")
             if paths.get(name)}
    roots |= {os.path.realpath(p) for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    return tuple(sorted(roots))


def _own_module(module: ModuleType) -> bool:
    """Whether `module` is the caller's own code (the pool cannot import it by name)."""
    name = module.__name__
    if name == "__main__" or name == "gpupool" or name.startswith("gpupool."):
        return False
    path = getattr(module, "__file__", None)
    if not path:
        return False  # built in, or a namespace: importable by name where the interpreter is alike
    real = os.path.realpath(path)
    return not any(real.startswith(root + os.sep) for root in _installed_roots())


def travel_by_value(fn: Callable[..., Any]) -> None:
    """Make `fn` (and what its module defines) pickle by value when its module is the caller's own."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    if module is not None and _own_module(module):
        cloudpickle.register_pickle_by_value(module)


def dump_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The base64 pickle of one call; InvalidInput when it is over the pool's size limit."""
    travel_by_value(fn)
    data = cloudpickle.dumps((fn, args, kwargs))
    if len(data) > MAX_PAYLOAD_BYTES:
        from gpupool.errors import InvalidInput

        raise InvalidInput(f"The function and its arguments pickle to {len(data) / _MIB:.1f} MiB, over the "
                           f"pool's limit of {MAX_PAYLOAD_BYTES // _MIB} MiB per call; pass a path or URL "
                           "to large data instead, or split it into smaller calls.")
    return base64.b64encode(data).decode()


def load_outcome(call: dict[str, Any]) -> Any:
    """The value a finished call returned, or raise what it raised (with the remote traceback as a
    note), CallCancelled, or RemoteCallError."""
    status = call["status"]
    traceback_text = str(call.get("traceback") or "")
    if status == "succeeded":
        return cloudpickle.loads(base64.b64decode(call["result"]))
    if status == "cancelled":
        raise CallCancelled(str(call.get("error") or f"Call {call['id']} was cancelled."), call=call["id"])
    exc: BaseException | None = None
    if call.get("result"):
        try:
            exc = cloudpickle.loads(base64.b64decode(call["result"]))
        except Exception:  # its class is not importable here: say what it was instead
            exc = None
    if isinstance(exc, BaseException):
        if traceback_text:
            exc.add_note(f"\nRemote traceback (pod {call.get('pod_id') or '?'}):\n{traceback_text.rstrip()}")
        raise exc
    message = str(call.get("error") or f"Call {call['id']} failed.")
    raise RemoteCallError(message, traceback_text, call=call["id"], workload=call["session_id"])


def parse_duration_s(value: str | float | int | None, what: str) -> float | None:
    """Seconds from 90, 90.5, '90s', '10m', '2h' or '1d'; None stays None."""
    if value is None:
        return None
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip().lower()
        scale = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}.get(text[-1:], 1.0)
        try:
            seconds = float(text[:-1] if text[-1:] in "smhd" else text) * scale
        except ValueError:
            seconds = -1.0
    if not seconds > 0:
        from gpupool.errors import InvalidInput

        raise InvalidInput(f"{what} takes a positive duration such as 90, '30s', '10m' or '2h', "
                           f"got {value!r}.")
    return seconds
