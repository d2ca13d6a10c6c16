"""Refuse request bodies above a size before they are read in full (413, one sentence).

A Content-Length above the limit is answered at once, without reading a byte of the body; a body
without one (chunked) is counted as it streams and refused at the first chunk that passes the limit,
so a client can never make the server hold more than the limit plus one chunk of a request. Two
routes take more by their nature and get their own room whatever the limit says: remote calls
(`/api/v1/calls/...`) carry pickled arguments and results of up to their payload limit, and fabric
telemetry (`/api/v1/fabric/telemetry`) up to 100,000 port samples, a workload's checkpoint
(`/api/v1/workloads/ID/checkpoint`) archives of up to 256 MiB, and image imports (`/api/v1/images`,
admin only) archives of up to 16 GiB.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.exceptions import HTTPException

from gpupool.api.calls import MAX_PAYLOAD_TEXT
from gpupool.providers.base import MAX_CHECKPOINT_BYTES
from gpupool.server.http_errors import error_response

CALLS_PREFIX = "/api/v1/calls/"
CALLS_BODY_BYTES = MAX_PAYLOAD_TEXT + 64 * 1024
"""A call's base64 payload at its largest, and room for the fields around it."""
TELEMETRY_PATH = "/api/v1/fabric/telemetry"
TELEMETRY_BODY_BYTES = 32 * 2**20
"""100,000 port samples (TelemetryIn's bound) of a few hundred bytes at most each."""
CHECKPOINT_PATH = re.compile(r"^/api/v1/workloads/[^/]+/checkpoint$")
CHECKPOINT_BODY_BYTES = MAX_CHECKPOINT_BYTES + 2**20
"""A checkpoint archive (PUT /workloads/ID/checkpoint: a federation hub carrying it to another
member): its files' contents at their largest, and room for the tar's headers."""
IMAGES_PATH = "/api/v1/images"
IMAGES_BODY_BYTES = 16 * 2**30
"""An image archive (admin only), streamed to disk as it comes."""
_MIB = 2**20


class BodyTooLarge(HTTPException):
    """Raised from `receive` when a streamed body passes the limit; the routes answer it with 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, too_large_sentence(limit))


def too_large_sentence(limit: int) -> str:
    shown = f"{limit / _MIB:g} MiB" if limit >= _MIB else f"{limit} bytes"
    return (f"The request body is larger than this pool accepts ({shown}); send a smaller request "
            "(put large data in a file the pods read, not in the spec).")


class BodyLimit:
    """Pure ASGI middleware; the outermost of the app's own, so every route is behind it."""

    def __init__(self, app: Any, limit_bytes: int) -> None:
        self.app = app
        self.limit_bytes = limit_bytes

    def limit_for(self, path: str) -> int:
        if path.startswith(CALLS_PREFIX):
            return max(self.limit_bytes, CALLS_BODY_BYTES)
        if CHECKPOINT_PATH.match(path):
            return max(self.limit_bytes, CHECKPOINT_BODY_BYTES)
        if path == IMAGES_PATH:
            return max(self.limit_bytes, IMAGES_BODY_BYTES)
        if path == TELEMETRY_PATH:
            return max(self.limit_bytes, TELEMETRY_BODY_BYTES)
        return self.limit_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        length = _content_length(scope["headers"])
        if length is not None and length > limit:
            # Answered before the body is read; the server closes the connection after it.
            response = error_response(413, "too_large", too_large_sentence(limit),
                                      {"limit_bytes": limit, "content_length": length},
                                      headers={"Connection": "close"})
            await response(scope, receive, send)
            return
        counted = 0
        started = False

        async def counting_receive() -> Any:
            nonlocal counted
            message = await receive()
            if message["type"] == "http.request":
                counted += len(message.get("body", b""))
                if counted > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracking_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge as exc:  # raised outside the routes (the submission fast path)
            if started:
                raise
            response = error_response(413, "too_large", str(exc.detail), {"limit_bytes": limit},
                                      headers={"Connection": "close"})
            await response(scope, receive, send)


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None
