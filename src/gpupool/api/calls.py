"""API models for remote function calls: sessions, calls, and what a worker pod asks and answers.

Inputs and results travel as pickles (cloudpickle) in base64 text; the server never unpickles them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, field_validator

from gpupool.api.common import ArgText, Name, Strict
from gpupool.api.images import ImageName
from gpupool.api.workloads import MAX_TIME_LIMIT_S, ResourcesSpec, check_env_size, check_pool_env

MAX_PAYLOAD_BYTES = 16 * 2**20
"""The most a call's pickled function and arguments, or its pickled result, may weigh."""
MAX_PAYLOAD_TEXT = 4 * (MAX_PAYLOAD_BYTES // 3 + 1) + 4096
"""The longest base64 text a payload field takes (the exact size is checked after decoding)."""
MAX_WAIT_S = 60.0
DEFAULT_IDLE_TIMEOUT_S = 300.0

Payload = Annotated[str, Field(max_length=MAX_PAYLOAD_TEXT, description="a pickle, base64")]


class CallStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in (CallStatus.SUCCEEDED, CallStatus.FAILED, CallStatus.CANCELLED)


class CallCreate(Strict):
    """One call: the pickled (function, args, kwargs)."""

    payload: Payload


class SessionCreate(Strict):
    """A function workload: a worker pod on a slice that runs the session's calls one by one."""

    python: str = Field(pattern=r"^\d+\.\d+$", description="the client's Python minor version, e.g. 3.11")
    resources: ResourcesSpec = Field(default_factory=lambda: ResourcesSpec.model_validate({}))
    name: str = Field("", max_length=63, pattern=r"^[A-Za-z0-9._-]*$")
    tenant: Name | None = Field(None, description="admin only: open it on behalf of this tenant")
    queue: Name = "default"
    priority: int = Field(0, ge=-1000, le=1000)
    priority_class: Name | None = None
    time_limit_s: float | None = Field(None, ge=1, le=MAX_TIME_LIMIT_S, allow_inf_nan=False, description=(
        "the workload's time limit: its pod is stopped this long after it started"))
    idle_timeout_s: float = Field(DEFAULT_IDLE_TIMEOUT_S, ge=1, le=86400, allow_inf_nan=False, description=(
        "its worker stops (and frees the slice) after this long without a call"))
    one_shot: bool = Field(False, description="the worker stops after the first call (remote())")
    env: dict[Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")],
              ArgText] = Field(default_factory=dict)
    call: CallCreate | None = Field(None, description="a first call, queued with the session")
    image: ImageName | None = Field(None, description=(
        "run the worker in a container of this image of the pool's store; the image must hold the "
        "pool's Python (same minor version) as python3.X in /usr/local/bin, /usr/bin or /bin"))

    @field_validator("env")
    @classmethod
    def _pool_env(cls, value: dict[str, str]) -> dict[str, str]:
        return check_pool_env(check_env_size(value))  # the session's workload holds it


class CallOut(Strict):
    id: str
    session_id: str = Field(description="the session's id, which is its workload's id (gpupool logs ID)")
    status: CallStatus
    attempts: int = Field(description="times a worker took it (more than one after a preemption)")
    submitted_s: float
    started_s: float | None
    finished_s: float | None
    pod_id: str
    result: str | None = Field(None, description="the pickled return value or exception, base64")
    error: str = Field("", description="failed or cancelled: one line saying what went wrong")
    traceback: str = Field("", description="the remote traceback of an exception the function raised")


class SessionOut(Strict):
    id: str = Field(description="its workload's id")
    tenant: str
    one_shot: bool
    closed: bool
    workload_status: str
    pod_id: str
    call: CallOut | None = Field(None, description="the first call, when one was given")


class CallDone(Strict):
    """A worker's answer to one call."""

    call_id: str = Field(max_length=64)
    ok: bool
    result: Payload | None = None
    error: str = Field("", max_length=1024)
    traceback: str = Field("", max_length=65536)


class WorkerAsk(Strict):
    """A worker pod reports the call it finished (if any) and asks for the next one."""

    done: CallDone | None = None
    wait_s: float = Field(20.0, ge=0, le=MAX_WAIT_S, description="how long to wait for a call")


class WorkerWork(Strict):
    """The next call for a worker, or `stop` (the session is closed, idle or one-shot and answered)."""

    call_id: str | None = None
    payload: str | None = None
    stop: bool = False
    reason: str = ""
