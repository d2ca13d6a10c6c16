"""The provider's record of one pod: its actor, its last status, and the calls in flight to it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from gpupool.providers.base import PodPhase, PodStatus

RELEASE_AFTER_POLLS = 2
"""A finished pod's actor (and so its slice's Ray resources) is released once poll() has returned
its final status this many times: the server has then recorded it (each sync finishes before the
next poll), so a restart right now cannot lose the exit code."""


@dataclass
class TrackedPod:
    pod_id: str
    node: str
    actor: Any
    status: PodStatus
    created_s: float = field(default_factory=time.monotonic)
    placed: bool = False
    """The actor answered once: Ray placed it and the pod was started (or failed to start)."""
    pending: Any = None
    """The status() call in flight, if any."""
    stop_grace_s: float | None = None
    died_at_s: float | None = None
    """When a call to the actor first failed (monotonic): lost after a grace, unless its node is gone."""
    died_reason: str = ""
    final_polls: int = 0
    released: bool = False

    def finish(self, phase: PodPhase, message: str, exit_code: int | None = None) -> None:
        if not self.status.phase.is_final:
            self.status = replace(self.status, phase=phase, message=message, exit_code=exit_code,
                                  finished_at_s=time.time())
