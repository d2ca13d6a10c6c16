"""One scheduling cycle: the single function the simulator and the server both call.

Steps: (1) build the state from the snapshot, (2) order the pending workloads, (3) place each
gang all-or-nothing with the placement policy, (4) report admissions and, for the rest, a
machine-readable reason. Decisions are plain data; nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupool.core.model import ClusterSnapshot, PodPlacement, Reason, Workload
from gpupool.core.scheduling.gang import place_gang
from gpupool.core.scheduling.policies.base import NoFit, make_policy
from gpupool.core.state import ClusterState


@dataclass(frozen=True, slots=True)
class Policies:
    """Which plug-ins a cycle uses, by registered name."""

    placement: str = "best-fit"
    placement_options: Mapping[str, Any] = field(default_factory=dict)
    ordering: str = "priority-fifo"
    preemption: bool = False
    backfill: bool = False


@dataclass(frozen=True, slots=True)
class Admission:
    workload_id: str
    placements: tuple[PodPlacement, ...]


@dataclass(frozen=True, slots=True)
class Preemption:
    workload_id: str
    reason: Reason
    message: str
    preemptor_id: str = ""


@dataclass(frozen=True, slots=True)
class Rejection:
    """A workload left pending this cycle (`final=False`) or refused for good (`final=True`)."""

    workload_id: str
    reason: Reason
    message: str
    final: bool = False


@dataclass(frozen=True, slots=True)
class CycleResult:
    admitted: tuple[Admission, ...] = ()
    preempted: tuple[Preemption, ...] = ()
    rejected: tuple[Rejection, ...] = ()


def order_pending(pending: Sequence[Workload]) -> list[Workload]:
    """Highest priority first, then oldest first, then by id (a total, deterministic order)."""
    return sorted(pending, key=lambda w: (-w.priority, w.submit_time_s, w.id))


def run_cycle(
    snapshot: ClusterSnapshot,
    pending: Sequence[Workload],
    policies: Policies,
    now_s: float,
    rng: random.Random,
) -> CycleResult:
    """Decide, for every pending workload, whether it is admitted now and where it runs."""
    state = ClusterState.from_snapshot(snapshot)
    empty = ClusterState(snapshot.nodes)
    policy = make_policy(policies.placement, **dict(policies.placement_options))
    admitted: list[Admission] = []
    rejected: list[Rejection] = []
    for workload in order_pending(pending):
        result = place_gang(workload, state, policy, rng)
        if isinstance(result, NoFit):
            rejected.append(_rejection(workload, result, empty, policy, rng))
            continue
        admitted.append(Admission(workload.id, result.placements(state)))
    return CycleResult(admitted=tuple(admitted), rejected=tuple(rejected))


def _rejection(
    workload: Workload, nofit: NoFit, empty: ClusterState, policy: Any, rng: random.Random
) -> Rejection:
    """Final when the workload could not be placed even on the empty cluster."""
    on_empty = place_gang(workload, empty, policy, rng)
    if isinstance(on_empty, NoFit):
        return Rejection(
            workload.id,
            Reason.NEVER_FITS,
            f"The workload can never fit this pool: {on_empty.message}",
            final=True,
        )
    from gpupool.core.scheduling.gang import release_gang

    release_gang(on_empty, empty)
    return Rejection(workload.id, nofit.reason, nofit.message)
