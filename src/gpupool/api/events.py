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
    LINK_LOST = "link_lost"
    """A fabric link failed and two of its nodes had no route left: the gang is requeued."""
    LINK_DEGRADED = "link_degraded"
    """A fabric link failed or healed and the gang's bottleneck changed (an event; it keeps running)."""
    HELD = "held"
    """Held while pending (`gpupool hold`): not placed until released."""
    RELEASED = "released"
    """Released from a hold (`gpupool release`): placed again like any pending work."""
    UPDATED = "updated"
    """Its priority, time limit, gpus or replicas were changed while pending (`gpupool update`)."""
    REQUEUED_BY_USER = "requeued_by_user"
    """Stopped and sent back to pending by `gpupool requeue`."""
    FEDERATION_FENCED = "federation_fenced"
    """A federation hub's copy, held (or stopped and held): the hub was not heard from for the pool's
    federation.fence (docs/federation.md)."""
    WAITING_FOR_DEPENDENCY = "waiting_for_dependency"
    """Its --dependency does not hold yet: it is not considered for placement."""
    DEPENDENCY_MET = "dependency_met"
    """Its --dependency holds now: it is considered for placement."""
    DEPENDENCY_NEVER_SATISFIED = "dependency_never_satisfied"
    """Its --dependency can never hold (afterok on work that failed...): cancelled."""
    DEPENDENCY_NEVER_SATISFIED_KEPT = "dependency_never_satisfied_kept"
    """Its --dependency can never hold, and it was submitted with --kill-on-invalid-dep no: kept pending."""
