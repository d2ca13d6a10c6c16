"""The provider's record of one pod: how it is carried, its last status, and the calls in flight."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpupool.pods import PodLaunch, PodPhase, PodStatus

RELEASE_AFTER_POLLS = 2
"""A finished pod's carrier (and so its slice's Ray resources) is released once poll() has returned
its final status this many times: the server has then recorded it (each sync finishes before the
next poll), so a restart right now cannot lose the exit code."""


class PodCarrier(StrEnum):
    """What holds a pod's slice in Ray's accounting and runs its process."""

    GROUP = "group"
    """A named, detached placement group per pod (one bundle: the slice's resources, pinned to the
    node), the process run by the node's agent actor: no Python process per pod."""
    ACTOR = "actor"
    """A named, detached actor per pod holding the slice and running the process: one Ray Python
    worker per pod (about a second of CPU to start, never reused)."""


@dataclass
class TrackedPod:
    pod_id: str
    node: str
    carrier: PodCarrier
    status: PodStatus
    actor: Any = None
    """The pod's actor (actor carrier)."""
    group: Any = None
    """The pod's placement group (group carrier)."""
    ready: Any = None
    """The group's readiness ref while it is not placed yet (group carrier)."""
    launch: PodLaunch | None = None
    """What to start once the group is placed (group carrier); None once sent to the node agent."""
    created_s: float = field(default_factory=time.monotonic)
    placed: bool = False
    """Ray placed the pod's carrier (and the pod was started, or failed to start)."""
    pending: Any = None
    """The status() call in flight, if any (actor carrier); the launch() call until it answers (group
    carrier: only then is the pod watched)."""
    stop_grace_s: float | None = None
    stop_asked_s: float = 0.0
    """When stop() was called (monotonic)."""
    died_at_s: float | None = None
    """When a call about the pod first failed (monotonic): lost after a grace, unless its node is gone."""
    died_reason: str = ""
    final_polls: int = 0
    released: bool = False

    def finish(self, phase: PodPhase, message: str, exit_code: int | None = None) -> None:
        if not self.status.phase.is_final:
            self.status = replace(self.status, phase=phase, message=message, exit_code=exit_code,
                                  finished_at_s=time.time())
