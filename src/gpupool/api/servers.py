"""API models for the servers on one store (GET /servers, `gpupool server ls`)."""

from __future__ import annotations

from pydantic import Field

from gpupool.api.common import Strict


class ServerOut(Strict):
    id: str = Field(description="the server's id, new at each start")
    address: str = Field(description="where it serves the API (its --host and --port)")
    leader: bool = Field(description="it holds the leader lease: it runs the control loop")
    epoch: int | None = Field(description="the lease's epoch while it leads; null for a follower")
    lease_age_s: float | None = Field(description="seconds since the leader last renewed the lease")
    version: str
    started_s: float
    last_seen_s: float = Field(description="its last heartbeat (every lease round), epoch seconds")
    this: bool = Field(description="the server that answered this request")


class ServersOut(Strict):
    ha: bool = Field(description="several servers share the store (gpupool up --ha)")
    leader: str | None = Field(description="the id of the server holding an unexpired lease, if any")
    epoch: int | None = Field(description="the lease's current epoch (it grows at each takeover)")
    lease_expires_in_s: float | None = Field(description="seconds until the lease runs out unless renewed")
    servers: list[ServerOut]
