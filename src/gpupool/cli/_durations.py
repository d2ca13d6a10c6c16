"""Durations and points in time as people type them: 30d, 12h, 90m, never; 1h ago or a date."""

from __future__ import annotations

import re
import time
from datetime import datetime

from gpupool.errors import InvalidInput

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def duration_s(text: str, flag: str) -> float:
    """Seconds in `text` (30d, 12h, 90m, 45s, 2w); InvalidInput naming `flag` otherwise."""
    match = _DURATION.match(text.lower())
    if match is None or float(match.group(1)) <= 0:
        raise InvalidInput(f"{flag} takes a positive duration such as 30d, 12h or 90m, got {text!r}.")
    return float(match.group(1)) * _UNITS_S[match.group(2)]


def since_s(text: str, now_s: float | None = None) -> float:
    """Epoch seconds of `text`: a duration back from now (1h, 7d) or a local date/time (2026-12-01,
    2026-12-01T08:00, 2026-12-01 08:00)."""
    now_s = time.time() if now_s is None else now_s
    if _DURATION.match(text.lower()):
        return after_epoch(now_s - duration_s(text, "--since"), text, "--since")
    try:
        return after_epoch(datetime.fromisoformat(text.strip()).timestamp(), text, "--since")
    except ValueError:
        raise InvalidInput(f"--since takes a duration back from now (1h, 7d) or a date such as 2026-12-01 "
                           f"or 2026-12-01T08:00, got {text!r}.") from None


def after_epoch(epoch_s: float, text: str, flag: str) -> float:
    """`epoch_s`, unless `text` (what was given to `flag`) reaches back before 1970, where the pool
    has nothing (and the API refuses a negative time): then one sentence in the user's terms."""
    if not epoch_s >= 0:  # nan too
        raise InvalidInput(f"{flag} {text!r} reaches back before 1970-01-01; give a shorter span or a later "
                           "date.")
    return epoch_s


def day(epoch_s: float | None, never: str = "-") -> str:
    """A local date, or `never` for None."""
    return never if epoch_s is None else time.strftime("%Y-%m-%d", time.localtime(epoch_s))


def when(epoch_s: float | None, never: str = "-") -> str:
    """A local time to the minute, or `never` for None."""
    return never if epoch_s is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch_s))
