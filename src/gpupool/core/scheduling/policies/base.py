"""The placement-policy interface and its registry: choose a node and devices for one pod."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from gpupool.core.model import PodRequest, Reason, Workload, label_text
from gpupool.core.state import BoolArray, ClusterState, IntArray, row_counts
from gpupool.errors import UnknownName, did_you_mean

if TYPE_CHECKING:
    from gpupool.core.scheduling.gang import GangPlacement
    from gpupool.core.scheduling.topology import TopologyContext


@dataclass(frozen=True, slots=True)
class Choice:
    """A placement decision for one pod: a node index and the device slots on it."""

    node: int
    devices: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class NoFit:
    """Why a pod cannot be placed now, as data (never an exception)."""

    reason: Reason
    message: str


class PlacementPolicy(ABC):
    """Scores node/device choices for one pod. One module per policy, registered by name."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    topology: TopologyContext | None = None
    """The fabric as the view knows it, the pool's default constraint and the runtime estimates
    (`bind_topology`); None: no fabric known, gangs are placed pod by pod."""

    def bind_topology(self, context: TopologyContext | None) -> None:
        """Read the fabric and constraints from `context` from now on. Does not block; idempotent."""
        self.topology = context

    def place_gang(
        self, workload: Workload, state: ClusterState, rng: random.Random
    ) -> GangPlacement | NoFit:
        """Place every pod of `workload` or none (a whole pod set at once, as Kueue's topology-aware
        snapshot does). On success the state holds every pod; on NoFit it is unchanged.

        The default honours the gang's topology constraint when a fabric is bound (trying its domains
        fullest first, see `domains`), and otherwise places pod by pod with `place`: exactly the
        placement before this hook. Deterministic for a given state and rng; never raises for a gang
        that does not fit.
        """
        from gpupool.core.scheduling.domains import place_default

        return place_default(workload, state, self, rng)

    def prepare(self, state: ClusterState, pods: Sequence[PodRequest]) -> None:
        """Learn what the policy needs from the expected workload (e.g. FGD's shape mix).

        Called once before a run; the default does nothing. Does not block; idempotent.
        """

    def observe(self, pod: PodRequest) -> None:
        """Note a pod that arrived (policies that estimate the workload online). Default: no-op."""

    @abstractmethod
    def place(self, pod: PodRequest, state: ClusterState, rng: random.Random) -> Choice | NoFit:
        """Choose where `pod` goes in `state` without changing it; NoFit when nothing fits.

        Pure and deterministic for a given state and rng; never raises for an unplaceable pod.
        """

    def counts_failed_calls(self) -> bool:
        """Whether a `place` that returns NoFit changes what later calls decide (a policy counting
        its calls). When not (the default), a caller that knows a pod fits no node may skip the call:
        a pod that fits no node gets NoFit without a draw from the rng."""
        return False

    def is_repeatable(self) -> bool:
        """Whether `place` asked again for the same pod on an equal state gives the same choice,
        drawing nothing from the rng and keeping nothing that changes later choices: a caller may
        then reuse an earlier answer instead of asking again. False unless a policy says so."""
        return False

    def mode(self) -> object:
        """What a repeatable policy's choices depend on besides the state and how many times it
        was prepared, where that can change between calls (a policy that switches how it places
        once it has seen some kind of pod): a caller reuses an earlier answer only while it is
        equal. None (the default): nothing."""
        return None


_REGISTRY: dict[str, type[PlacementPolicy]] = {}

DEFAULT_POLICY = "fgd-strand"
"""The placement policy the scheduling cycle uses wherever none is named (docs/benchmarks.md, "Packing")."""

FILL_POLICY = "fgd-plan"
"""The project's best policy on the fill protocol (docs/benchmarks.md): `gpupool sim fill --policy fgd-plan`.

It is fgd-strand plus LP-planned device fill patterns; the live cycle keeps fgd-strand because the
plan is solved from the workload at `prepare` (a linear program, tens to hundreds of ms), which a
cycle that re-prepares its policy from a fresh sample of pods cannot afford every time."""


def register_policy(cls: type[PlacementPolicy]) -> type[PlacementPolicy]:
    """Class decorator: make a policy available by its `name`."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"placement policy {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _load_builtin() -> None:
    # Importing the package registers every built-in policy module.
    import gpupool.core.scheduling.policies  # noqa: F401


def policy_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[PlacementPolicy]:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownName(
            f"Unknown placement policy {name!r}; choose one of {', '.join(sorted(_REGISTRY))}."
            + did_you_mean(name, list(_REGISTRY))
        ) from None


def make_policy(name: str, **options: Any) -> PlacementPolicy:
    """A fresh policy instance by registered name (options go to its constructor)."""
    return policy_class(name)(**options)


PolicyFactory = Callable[[], PlacementPolicy]


worded_from_checks = True
"""`fits_or_nofit` words a refusal from the host mask and device counts its check computed; False:
`explain_nofit` computes them again (the same state: the same masks, the same text; kept to check
that claim)."""


def fits_or_nofit(pod: PodRequest, state: ClusterState) -> BoolArray | NoFit:
    """`state.node_fits(pod)` where some node fits the pod; else `explain_nofit(pod, state)`'s
    answer, worded from the host mask and device counts the check just computed."""
    fits, host, counts = state.node_fits_parts(pod)
    if fits.any():
        return fits
    if not worded_from_checks:
        return explain_nofit(pod, state)
    return explain_nofit(pod, state, host, counts)


def explain_nofit(pod: PodRequest, state: ClusterState, host: BoolArray | None = None,
                  counts: IntArray | None = None) -> NoFit:
    """The most specific reason no node can hold `pod` now (saying so where its node labels narrow
    the nodes it may use). `host`, `counts`: `state.host_fits(pod)` and the per-node counts of
    `state.device_fits(pod)` on this very state, when the caller has them (`fits_or_nofit`)."""
    found = _explain_nofit(pod, state, host, counts)
    if not pod.node_labels or found.reason is Reason.NO_ALLOWED_MODEL:
        return found
    n = int(state.labelled(pod.node_labels).sum())
    return NoFit(found.reason, f"{found.message.rstrip('.')}: its constraint {label_text(pod.node_labels)} "
                 f"narrows the choice to {n} of {len(state.nodes)} node(s).")


def _explain_nofit(pod: PodRequest, state: ClusterState, host: BoolArray | None,
                   counts: IntArray | None) -> NoFit:
    if pod.num_devices:
        allowed = state.allowed_devices(pod.allowed_models, pod.node_labels)
        if not allowed.any():
            return NoFit(
                Reason.NO_ALLOWED_MODEL,
                f"No node has a device of the allowed models {sorted(pod.allowed_models)}."
                if not pod.node_labels
                else f"No node with the labels {label_text(pod.node_labels)} has a device"
                + (f" of the allowed models {sorted(pod.allowed_models)}." if pod.allowed_models else "."),
            )
    if host is None:
        host = state.host_fits(pod)
    if not host.any():
        if pod.num_devices and counts is None:
            counts = row_counts(state.device_fits(pod))
        if counts is not None and pod.num_devices and not (
                state.schedulable & (counts >= pod.num_devices)).any():
            # No node has the devices either: the clearer reason (a default share of cpu and
            # memory follows the devices, so it runs out with them).
            return NoFit(Reason.INSUFFICIENT_DEVICES,
                         f"No node has {pod.num_devices} device(s) with {pod.device_milli} milli free.")
        if not (state.schedulable & (state.cpu_free >= state.cpu_need(pod))).any():
            cpu = f"{pod.cpu_milli} milli-CPU" if pod.cpu_milli else "its default share of cpu"
            return NoFit(Reason.INSUFFICIENT_CPU, f"No node has {cpu} free.")
        mem = f"{pod.memory_mib} MiB of memory" if pod.memory_mib else "its default share of memory"
        return NoFit(Reason.INSUFFICIENT_MEMORY, f"No node has {mem} free.")
    if pod.num_devices:
        asked = pod.device_memory_mib
        defaulted = not asked and isinstance(state.device_memory_need(pod), np.ndarray)
        return NoFit(
            Reason.INSUFFICIENT_DEVICES,
            f"No node has {pod.num_devices} device(s) with {pod.device_milli} milli free"
            + (f" and {asked} MiB" if asked else " and the same share of memory" if defaulted else "")
            + " beside enough cpu and memory.",
        )
    return NoFit(Reason.NO_NODE_FITS, "No node fits the pod.")

