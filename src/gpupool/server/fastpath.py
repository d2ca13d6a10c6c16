"""`POST /api/v1/workloads` served as plain ASGI: the API's hot path, without the framework's routing.

A submission that is well formed (JSON body, a known bearer token, a spec that validates) is parsed
with the same pydantic model, prepared by the same service function and stored by the same
group-commit writer as through the FastAPI route, and answered with the same `201` body; that skips
the routing, dependency resolution and response re-validation that cost more CPU than the rest of
a submission. Anything else (a bad token, a bad spec, an array, an unusual body) is handed, body replayed, to
the FastAPI route, which gives the API's usual error answer; nothing was stored at that point, so
the route storing it instead can never store it twice. The route stays declared (OpenAPI, /docs).
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError

from gpupool.api.workloads import WorkloadSpec
from gpupool.errors import GpupoolError
from gpupool.server.auth import ON_BEHALF_HEADER
from gpupool.server.http_errors import gpupool_error_response
from gpupool.server.metrics import Metrics
from gpupool.server.runtime import Runtime
from gpupool.server.services.submit_writer import SubmitWriter
from gpupool.server.services.workloads import prepare

SUBMIT_PATH = "/api/v1/workloads"
_ON_BEHALF = ON_BEHALF_HEADER.lower().encode()
MAX_FAST_BODY_BYTES = 256 * 1024
"""Larger submissions take the ordinary route (with its request body limit)."""
_JSON_HEADERS = [(b"content-type", b"application/json")]


class SubmitFastPath:
    """Pure ASGI middleware: serves well-formed submissions, passes everything else through."""

    def __init__(self, app: Any, rt: Runtime, writer: SubmitWriter, metrics: Metrics) -> None:
        self.app = app
        self.rt = rt
        self.writer = writer
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != SUBMIT_PATH:
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"")
        content_type = headers.get(b"content-type", b"")
        if (not length.isdigit() or int(length) > MAX_FAST_BODY_BYTES or scope.get("query_string")
                or not content_type.startswith(b"application/json")):  # ?hold=true: the route's
            await self.app(scope, receive, send)
            return
        body, more = await _read_body(receive)
        try:
            who = self.rt.auth.principal(headers.get(b"authorization", b"").decode("latin-1") or None,
                                         route=("POST", SUBMIT_PATH),
                                         on_behalf=headers.get(_ON_BEHALF, b"").decode("latin-1") or None)
            spec = WorkloadSpec.model_validate_json(body)
            if spec.array is not None:  # an array's answer counts its tasks: the route gives it
                raise ValueError("array")
            submission = prepare(self.rt, who, spec)
        except (GpupoolError, ValidationError, ValueError):
            await self.app(scope, _replay(body, more, receive), send)
            return
        try:
            await self.writer.store(submission)
        except GpupoolError as exc:
            response = gpupool_error_response(exc)
            await response(scope, receive, send)
            self._observe(response.status_code, start)
            return
        answer = b'{"id":"' + submission.id.encode() + b'","status":"pending"}'
        await send({"type": "http.response.start", "status": 201,
                    "headers": [*_JSON_HEADERS, (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})
        self._observe(201, start)

    def _observe(self, status: int, start: float) -> None:
        self.metrics.request_seconds.labels("POST", SUBMIT_PATH, str(status)).observe(
            time.perf_counter() - start)


async def _read_body(receive: Any) -> tuple[bytes, bool]:
    """The whole body, and whether the client is still connected (False after a disconnect)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), True


def _replay(body: bytes, connected: bool, receive: Any) -> Any:
    """A `receive` that gives the already-read body once, then defers to the real one."""
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if not connected:
            return {"type": "http.disconnect"}
        return await receive()

    return replay
