"""The reasons the server records with a workload's change of state, beside core's `Reason`
(scheduling decisions): part of the API, as every event a client reads carries one."""

from __future__ import annotations

from enum import StrEnum


class EventReason(StrEnum):
    """Why a workload changed state (core's Reason covers scheduling decisions; the two never share a
    code). Each has an entry in `gpupool.api.reasons.CATALOGUE`."""

    SUBMITTED = "submitted"
    ADMITTED = "admitted"
    LAUNCHED = "launched"
    COMPLETED = "completed"
    POD_FAILED = "pod_failed"
    POD_LOST = "pod_lost"
    LOST_ON_RESTART = "lost_on_restart"
    REQUEUED_ON_RESTART = "requeued_on_restart"
    """Admitted but never handed to the provider before the server stopped: placed again."""
    ADOPTED = "adopted"
    LAUNCH_FAILED = "launch_failed"
    CANCELLED_BY_USER = "cancelled_by_user"
    NODE_DRAINED = "node_drained"
    TIME_LIMIT = "time_limit"
    """Stopped at its time limit (`submit --time-limit`)."""
    RETRYING = "retrying"
    """A pod failed; the workload waits (backoff) to run again, within its max_retries."""
    NODE_LOST = "node_lost"
    """The node it ran on is no longer listed by the provider; the workload is requeued."""
    LIMITS_UNENFORCED = "limits_unenforced"
    """Placed where one of its limits does not hold (no cgroup v2 tree, no MPS, simulated devices)."""
    LINK_LOST = "link_lost"
    """A fabric link failed and two of its nodes had no route left: the gang is requeued."""
    LINK_DEGRADED = "link_degraded"
    """A fabric link failed or healed and the gang's bottleneck changed (an event; it keeps running)."""
