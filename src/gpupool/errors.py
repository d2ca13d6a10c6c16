"""One error hierarchy with stable machine codes, mapped to HTTP and CLI exit codes in one place."""

from __future__ import annotations

from typing import Any, ClassVar


class GpupoolError(Exception):
    """Base error: `code` is stable and machine-readable, the message is one sentence."""

    code: ClassVar[str] = "error"
    http_status: ClassVar[int] = 400
    exit_code: ClassVar[int] = 2

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class InvalidInput(GpupoolError):
    """The caller gave something malformed: a file row, a field, a flag."""

    code = "invalid_input"
    http_status = 422
    exit_code = 2


class ProfileError(InvalidInput):
    """A device description file is invalid."""

    code = "invalid_profile"


class TraceError(InvalidInput):
    """A trace or node file has a malformed row."""

    code = "invalid_trace"


class UnknownName(InvalidInput):
    """A name (policy, profile, provider, ordering...) is not registered."""

    code = "unknown_name"


class TooLarge(InvalidInput):
    """What was sent or asked for is larger than the limit the message names."""

    code = "too_large"
    http_status = 413


class NotFound(GpupoolError):
    code = "not_found"
    http_status = 404
    exit_code = 3


class Forbidden(GpupoolError):
    code = "forbidden"
    http_status = 403
    exit_code = 3


class PriorityNotAllowed(Forbidden):
    """A tenant token asked for a priority above its tenant's max_priority: the admin grants those."""

    code = "priority_not_allowed"
    exit_code = 2


class Unauthorized(GpupoolError):
    code = "unauthorized"
    http_status = 401
    exit_code = 3


class Conflict(GpupoolError):
    code = "conflict"
    http_status = 409
    exit_code = 2


class QuotaExceeded(GpupoolError):
    code = "quota_exceeded"
    http_status = 409
    exit_code = 2


class TooManyPending(GpupoolError):
    """The tenant already has max_pending workloads waiting (Slurm's MaxSubmitJobs); retry later."""

    code = "too_many_pending"
    http_status = 429
    exit_code = 2


class TooManyRequests(GpupoolError):
    """The tenant sent more requests than the server's limit for each tenant (server/ratelimit.py);
    nothing of the request was done: send it again after Retry-After."""

    code = "too_many_requests"
    http_status = 429
    exit_code = 2


class Unschedulable(GpupoolError):
    code = "unschedulable"
    http_status = 409
    exit_code = 2


class OverAllocation(GpupoolError):
    """An allocation would push a node or device past its capacity: a bug, never user input."""

    code = "over_allocation"
    http_status = 500
    exit_code = 1


class ProviderError(GpupoolError):
    code = "provider_error"
    http_status = 502
    exit_code = 1


class Unavailable(GpupoolError):
    code = "unavailable"
    http_status = 503
    exit_code = 4


class StoreUnavailable(Unavailable):
    """The store refused a read or write (disk full, read-only, connection lost): retry once fixed."""

    code = "store_unavailable"


def closest(name: str, choices: list[str]) -> str | None:
    """The choice closest to `name` (ignoring case), or None when none is close."""
    import difflib

    by_lower = {choice.lower(): choice for choice in reversed(choices)}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1)
    return by_lower[close[0]] if close else None


def did_you_mean(name: str, choices: list[str]) -> str:
    """A ' Did you mean X?' suffix when a close match exists, else ''."""
    close = closest(name, choices)
    return f" Did you mean {close!r}?" if close else ""


class TopologyError(InvalidInput):
    """A fabric topology file (ibnetdiscover, ibsim net, node-name-map) has a malformed line."""

    code = "invalid_topology"
