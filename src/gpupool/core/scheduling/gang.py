"""All-or-nothing placement of a workload's pods (a gang) in one decision."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from gpupool.core.model import PodPlacement, PodRequest, Reason, Workload
from gpupool.core.scheduling.policies.base import Choice, NoFit, PlacementPolicy
from gpupool.core.state import ClusterState, PodAlloc


@dataclass(frozen=True, slots=True)
class GangPlacement:
    """Every pod of a workload with the resources it now holds in the state."""

    workload: Workload
    allocs: tuple[tuple[PodRequest, PodAlloc], ...]

    @property
    def nodes(self) -> tuple[int, ...]:
        """The node indices it uses, in pod order (repeats kept)."""
        return tuple(a.node for _, a in self.allocs)

    def placements(self, state: ClusterState) -> tuple[PodPlacement, ...]:
        return tuple(
            PodPlacement(
                pod=pod.name,
                node=state.nodes[a.node].name,
                slices=a.slices(),
                cpu_milli=a.cpu_milli,
                memory_mib=a.memory_mib,
            )
            for pod, a in self.allocs
        )


def place_gang(
    workload: Workload, state: ClusterState, policy: PlacementPolicy, rng: random.Random
) -> GangPlacement | NoFit:
    """Place every pod or none: on success the state holds all pods; on failure it is unchanged.

    The policy's `place_gang` hook decides (its default: `place_pods`, or the topology-constrained
    placement of `domains` when the view knows a fabric and the gang carries a constraint)."""
    return policy.place_gang(workload, state, rng)


def place_pods(
    workload: Workload, state: ClusterState, policy: PlacementPolicy, rng: random.Random,
    pods: Sequence[PodRequest] | None = None,
) -> GangPlacement | NoFit:
    """The pod-by-pod loop: each pod (of `pods`, default all) where `policy.place` puts it, all or none."""
    chosen = workload.pods if pods is None else pods
    statement = state.statement()
    allocs: list[tuple[PodRequest, PodAlloc]] = []
    for pod in chosen:
        choice = policy.place(pod, state, rng)
        if isinstance(choice, NoFit):
            statement.discard()
            if len(workload.pods) == 1:
                return choice
            return NoFit(
                Reason.GANG_INCOMPLETE,
                f"Pod {pod.name!r} of the {len(workload.pods)}-pod gang does not fit "
                f"({choice.reason}: {choice.message}); none of the gang was placed.",
            )
        record = _record(pod, choice, state)
        statement.allocate(record)
        allocs.append((pod, record))
    statement.commit()
    return GangPlacement(workload, tuple(allocs))


def release_gang(gang: GangPlacement, state: ClusterState) -> None:
    """Give back everything a placed gang holds."""
    for _, record in reversed(gang.allocs):
        state.release(record)


def hold_gang(gang: GangPlacement, state: ClusterState) -> None:
    """Hold a placement's records (again, after `release_gang`), all of them or none."""
    statement = state.statement()
    for _, record in gang.allocs:
        statement.allocate(record)
    statement.commit()


def _record(pod: PodRequest, choice: Choice, state: ClusterState) -> PodAlloc:
    return state.make_alloc(pod, choice.node, choice.devices)
