"""A call in flight: its result (or exception) once done, its workload's id and logs, cancel."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from gpupool.remote.payload import load_outcome

if TYPE_CHECKING:
    from gpupool.remote.pool import Pool

T = TypeVar("T")
POLL_S = 5.0
"""The longest one request waits for an answer (the server holds it open; no busy polling); short,
since stopping the server waits for the requests it holds."""
_FINAL = ("succeeded", "failed", "cancelled")


class CallFuture(Generic[T]):
    """One call of a remote function. `result()` blocks until it is done; the call runs whether or
    not anybody waits for it. `workload_id` names the workload serving it (`gpupool logs ID`)."""

    def __init__(self, pool: Pool, call: dict[str, Any]) -> None:
        self._pool = pool
        self._call = call
        self.id: str = call["id"]
        self.workload_id: str = call["session_id"]

    def __repr__(self) -> str:
        return f"<CallFuture {self.id} {self.status} on workload {self.workload_id}>"

    @property
    def status(self) -> str:
        """queued, running, succeeded, failed or cancelled, as last seen."""
        return str(self._call["status"])

    def _wait(self, timeout_s: float | None) -> dict[str, Any]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._call["status"] not in _FINAL:
            wait_s = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if wait_s <= 0:
                raise TimeoutError(f"Call {self.id} did not finish within {timeout_s:g} s; it keeps "
                                   "running (future.cancel() stops it).")
            self._call = self._pool._get_call(self.id, wait_s)
        return self._call

    def done(self) -> bool:
        """Whether it finished (asks the server without waiting)."""
        if self._call["status"] not in _FINAL:
            self._call = self._pool._get_call(self.id, 0.0)
        return self._call["status"] in _FINAL

    def result(self, timeout: float | None = None) -> T:
        """What the function returned; raises what it raised (its remote traceback in a note),
        CallCancelled, RemoteCallError, or TimeoutError after `timeout` seconds."""
        value: T = load_outcome(self._wait(timeout))
        return value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """What result() would raise, or None when it returned."""
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except BaseException as exc:  # the function's own exception, whatever it was
            return exc
        return None

    def cancel(self) -> bool:
        """Cancel it: a queued call of a session is dropped; a one-shot call, or one already
        running, cancels its workload. False when it had finished already."""
        if self._call["status"] in _FINAL:
            return False
        self._call = self._pool._cancel_call(self.id)
        return self._call["status"] == "cancelled"

    def logs(self) -> str:
        """What its workload's pod wrote so far (stdout and stderr)."""
        return self._pool.client.logs(self.workload_id).text

