"""The hub's view of its member pools: an HTTP link to each (its federation token, the tenant it acts
for in each call) and whether the member answers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from gpupool.federation.config import MemberConfig
from gpupool.server.auth import ON_BEHALF_HEADER

CALL_TIMEOUT_S = 5.0
HEALTH_TIMEOUT_S = 1.0


class MemberUnreachable(Exception):
    """The member gave no HTTP answer (refused, reset, timed out)."""


@dataclass
class MemberState:
    """What the hub last learnt of one member (kept in memory; a hub restart polls afresh)."""

    up: bool = False
    last_ok_s: float | None = None
    down_since_s: float | None = None
    note: str = "not polled yet"
    capacity_gpus: float = 0.0
    allocated_gpus: float = 0.0
    pending: int = 0
    running: int = 0
    summary: dict[str, Any] | None = None
    """The member's GET /pool as last read (the hub's own /pool adds these up)."""
    reached_s: float | None = None
    """When the last call that may have reached the member came back (an answer, or a failure after
    the connection was made). The member's fence counts its silence from the last call it got, which
    can be later than `last_ok_s` (the start of the poll round that last read it): the hub counts
    the silence it moves work after from here too."""

    def free_gpus(self) -> float:
        return max(0.0, self.capacity_gpus - self.allocated_gpus) if self.up else 0.0

    def took(self, gpus: float) -> None:
        """A copy was just placed here: counted until the next poll says what the member did."""
        if self.free_gpus() >= gpus:
            self.allocated_gpus += gpus
        else:
            self.pending += 1


@dataclass
class MemberLink:
    config: MemberConfig
    state: MemberState = field(default_factory=MemberState)
    clock: Callable[[], float] = time.time
    _local: threading.local = field(default_factory=threading.local)

    @property
    def name(self) -> str:
        return self.config.name

    def _http(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:  # one keep-alive connection per thread: a slow member stalls only its caller
            client = httpx.Client(base_url=self.config.url + "/api/v1", timeout=CALL_TIMEOUT_S,
                                  headers={"Authorization": f"Bearer {self.config.token}"})
            self._local.client = client
        return client

    def call(self, method: str, path: str, *, tenant: str | None = None, json: Any = None,
             params: Any = None, timeout_s: float = CALL_TIMEOUT_S,
             content: bytes | None = None) -> httpx.Response:
        headers = {ON_BEHALF_HEADER: tenant} if tenant else {}
        try:
            answer = self._http().request(method, path, json=json, params=params, headers=headers,
                                          timeout=timeout_s, content=content)
            self.state.reached_s = self.clock()
            return answer
        except httpx.TransportError as exc:
            if not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
                self.state.reached_s = self.clock()  # sent, then lost: the member may have got it
            raise MemberUnreachable(f"{self.name} ({self.config.url}) does not answer: "
                                    f"{type(exc).__name__} {exc}".strip()) from None

    def poll(self, now_s: float, down_after_s: float) -> tuple[bool, bool]:
        """Read the member's summary; (it answered, its up/down state changed)."""
        try:
            answer = self.call("GET", "/pool", timeout_s=HEALTH_TIMEOUT_S)
            ok = answer.status_code == 200
            note = "" if ok else f"answered {answer.status_code} to GET /pool: {answer.text[:200]}"
        except MemberUnreachable as exc:
            ok, note, answer = False, str(exc), None
        state = self.state
        was_up = state.up
        if ok and answer is not None:
            summary = answer.json()
            state.capacity_gpus = float(summary.get("capacity_gpus", 0.0))
            state.allocated_gpus = float(summary.get("allocated_gpus", 0.0))
            counts = summary.get("workloads", {})
            state.pending = int(counts.get("pending", 0))
            state.running = int(counts.get("running", 0))
            state.summary = summary
            state.up, state.last_ok_s, state.down_since_s, state.note = True, now_s, None, ""
        else:
            state.note = note
            silent_s = now_s - state.last_ok_s if state.last_ok_s is not None else None
            if state.last_ok_s is None or (silent_s is not None and silent_s >= down_after_s):
                if state.down_since_s is None:
                    state.down_since_s = now_s
                state.up = False
        return ok, was_up != state.up

    def fence_s(self) -> float | None:
        """The member's federation.fence as its summary last said (None: no fence, or not read)."""
        value = (self.state.summary or {}).get("federation_fence_s")
        return float(value) if value is not None else None

    def close(self) -> None:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is not None:
            client.close()
