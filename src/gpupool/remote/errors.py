"""What a remote call raises when the function's own exception cannot come back as itself."""

from __future__ import annotations

from gpupool.errors import GpupoolError


class RemoteCallError(GpupoolError):
    """The call did not return: its exception could not be rebuilt here, its workload ended before
    answering it, or it timed out. `remote_traceback` holds the pod's traceback when there is one."""

    code = "remote_call_failed"
    http_status = 500
    exit_code = 1

    def __init__(self, message: str, remote_traceback: str = "", **details: object) -> None:
        super().__init__(message, **details)
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        if not self.remote_traceback:
            return self.message
        return f"{self.message}\n\nRemote traceback:\n{self.remote_traceback.rstrip()}"


class CallCancelled(RemoteCallError):
    """The call was cancelled (future.cancel(), its workload cancelled) before it answered."""

    code = "call_cancelled"
