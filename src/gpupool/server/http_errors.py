"""The one place errors become HTTP answers, all in the shape {"code", "message", "details"}."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpupool.errors import Forbidden, GpupoolError, StoreUnavailable, TooManyRequests
from gpupool.server import validation
from gpupool.server.db import store_unavailable

log = logging.getLogger("gpupool.server")

_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 413: "too_large", 415: "unsupported_media_type"}


def error_response(status: int, code: str, message: str, details: dict[str, Any] | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": code, "message": message, "details": details or {}}, status_code=status,
                        headers=headers)


def _validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, problems = validation.message(list(exc.errors()))
    return error_response(422, "invalid_input", message, {"errors": problems})


def _gpupool(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GpupoolError)
    if isinstance(exc, Forbidden):
        who = getattr(request.state, "principal", None)  # set once the token was accepted (deps)
        if who is not None:
            request.app.state.runtime.auth.note_forbidden(who, exc.message)
    return gpupool_error_response(exc)


def gpupool_error_response(exc: GpupoolError) -> JSONResponse:
    """The answer for a gpupool error (its HTTP status, code, message and details)."""
    status = exc.http_status if exc.http_status < 500 or exc.code != "over_allocation" else 500
    headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else None
    if isinstance(exc, StoreUnavailable) and not exc.details.get("outcome_unknown"):
        headers = {"Retry-After": "1"}  # nothing of the request was stored: the client may send it again
    elif isinstance(exc, TooManyRequests):  # refused before anything was done: likewise
        headers = {"Retry-After": str(exc.details.get("retry_after_s", 1))}
    return error_response(status, exc.code, exc.message, _jsonable(exc.details), headers)


def _jsonable(details: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, str | int | float | bool | type(None) | list | dict) else str(v)
            for k, v in details.items()}


def _http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    detail = exc.detail if isinstance(exc.detail, str) else "Request refused."
    if exc.status_code == 400:
        # The framework's answer to a body it cannot decode (not UTF-8): the same 422 as any bad JSON.
        problem = {"field": "body", "problem": "the request body is not valid JSON"}
        return error_response(422, "invalid_input", "The request body is not valid JSON; "
                              "send a UTF-8 JSON object.", {"errors": [problem]})
    if exc.status_code == 404:
        detail = "No such API path; see /docs for the routes."
    elif exc.status_code == 405:
        detail = "This path does not accept that method; see /docs for the routes."
    return error_response(exc.status_code, code, detail)


def _store(_: Request, exc: Exception) -> JSONResponse:
    """A store error that escaped Store.read()/write() (which raise StoreUnavailable themselves)."""
    assert isinstance(exc, OperationalError)
    cause = " ".join(str(exc.orig if exc.orig is not None else exc).split())
    log.error("the store failed (%s); answered 503", cause)
    return gpupool_error_response(store_unavailable(cause))


def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected error", exc_info=exc)
    return error_response(500, "internal", "The server hit an unexpected error; it was logged.")


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(GpupoolError, _gpupool)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(OperationalError, _store)
    app.add_exception_handler(Exception, _unexpected)
