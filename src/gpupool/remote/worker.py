"""The worker pod of a function workload: take its session's calls from the API, run each, answer.

Started by the pool as `python -P -m gpupool.remote.worker` inside the pod's slice (its isolation,
its Unix account), with GPUPOOL_URL and a call token that can only take this workload's calls.
It asks for a call, unpickles and runs it, and answers with the pickled result or exception and
its traceback in the same request that asks for the next call. It stops when the server says the
session is over (closed, idle, or its one call answered). Only the standard library and cloudpickle
are imported, so a fresh slice answers its first call soon after it starts.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import sys
import time
import traceback
import urllib.parse
from typing import Any

CALL_TOKEN_ENV = "GPUPOOL_CALL_TOKEN"
ASK_WAIT_S = 5.0
"""Short: stopping the server waits for the requests it holds open (uvicorn's graceful shutdown)."""
RETRY_FOR_S = 120.0
"""How long the worker keeps trying to reach a server that went away (a restart) before it gives up."""
MAX_ERROR = 1000
MAX_TRACEBACK = 60_000


def _say(message: str) -> None:
    print(f"gpupool worker: {message}", file=sys.stderr, flush=True)


class Api:
    """One keep-alive connection to the pool's API, remade when it drops."""

    def __init__(self, url: str, token: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/") + "/api/v1"
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            timeout = ASK_WAIT_S + 60
            if self._https:
                context = ssl.create_default_context(cafile=os.environ.get("GPUPOOL_CA_BUNDLE") or None)
                self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                                         context=context)
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        return self._conn

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(status, JSON answer); retries a lost connection for RETRY_FOR_S, then raises OSError."""
        data = json.dumps(body).encode()
        give_up = time.monotonic() + RETRY_FOR_S
        pause = 0.1
        while True:
            try:
                conn = self._connection()
                conn.request("POST", self._prefix + path, body=data, headers=self._headers)
                answer = conn.getresponse()
                raw = answer.read()
                return answer.status, json.loads(raw or b"{}")
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                if time.monotonic() > give_up:
                    raise OSError(f"cannot reach the pool's API ({exc})") from None
                time.sleep(pause)
                pause = min(pause * 2, 5.0)


def run_call(call_id: str, payload: str) -> dict[str, Any]:
    """Unpickle and run one call; its answer (result, or exception with its traceback)."""
    import cloudpickle

    try:
        fn, args, kwargs = cloudpickle.loads(base64.b64decode(payload))
        value = fn(*args, **kwargs)
    except (Exception, SystemExit) as exc:
        return failure(call_id, exc)
    try:
        data = cloudpickle.dumps(value)
    except Exception as exc:
        error = f"The function's result ({type(value).__name__}) cannot be pickled: {exc}"
        return {"call_id": call_id, "ok": False, "result": None, "traceback": "", "error": error[:MAX_ERROR]}
    return {"call_id": call_id, "ok": True, "result": base64.b64encode(data).decode()}


def failure(call_id: str, exc: BaseException) -> dict[str, Any]:
    """The answer for an exception the call raised: it pickled (when it can be), one line, and the
    traceback without this worker's own frame."""
    import cloudpickle

    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        pickled: str | None = base64.b64encode(cloudpickle.dumps(exc)).decode()
    except Exception:  # unpicklable: the client raises RemoteCallError with the text instead
        pickled = None
    line = f"{type(exc).__name__}: {exc}".strip().splitlines()[0] if str(exc) else type(exc).__name__
    return {"call_id": call_id, "ok": False, "result": pickled, "error": line[:MAX_ERROR],
            "traceback": text[-MAX_TRACEBACK:]}


def serve(api: Api) -> int:
    """Ask, run, answer until the session is over; the exit status."""
    done: dict[str, Any] | None = None
    while True:
        status, work = api.post("/calls/worker/next", {"done": done, "wait_s": ASK_WAIT_S})
        if status == 422 and done is not None and done.get("result"):  # e.g. a result over the size limit
            done = {"call_id": done["call_id"], "ok": False, "result": None, "traceback": "",
                    "error": str(work.get("message", "The pool refused the result."))[:MAX_ERROR]}
            continue
        if status != 200:
            _say(f"the pool refused this worker: {work.get('message', status)}")
            return 1
        done = None
        if work.get("stop"):
            _say(f"done: {work.get('reason') or 'the session ended'}.")
            return 0
        if work.get("call_id"):
            done = run_call(str(work["call_id"]), str(work["payload"]))


def main() -> int:
    url, token = os.environ.get("GPUPOOL_URL", ""), os.environ.get(CALL_TOKEN_ENV, "")
    if not url or not token:
        _say(f"GPUPOOL_URL or {CALL_TOKEN_ENV} is not set; this runs only as the pod of a function "
             "workload, started by the pool (see gpupool.connect).")
        return 2
    try:
        return serve(Api(url, token))
    except OSError as exc:
        _say(f"stopping: {exc}.")
        return 1


if __name__ == "__main__":
    sys.exit(main())
