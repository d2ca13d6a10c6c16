"""The policies' per-view caches: the placement policy instance and its sample of pods, the orderings' memo.

A view keeps one `PolicyCache` across cycles, so the placement policy's per-node caches and its
estimate of the workload mix (`prepare`) survive from one cycle to the next, and an ordering may
keep what it computed (DRF: the sorted queue) in `ordering_memo`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import Any

from gpupool.core.model import PodRequest, Workload
from gpupool.core.scheduling.policies.base import PlacementPolicy, make_policy
from gpupool.core.state import ClusterState

MAX_PREPARE_PODS = 512
"""At most this many pods (an even sample of those seen) go to the placement policy's `prepare`."""

_pods = attrgetter("pods")


@dataclass(slots=True)
class PolicyCache:
    """The placement policy of a view, the pods it was prepared with, and the orderings' memo."""

    policy: PlacementPolicy | None = None
    """The placement policy the cycles on this view use, kept across cycles (see `placement_policy`)."""
    empty_policy: PlacementPolicy | None = None
    """A twin of `policy` for trials on an empty pool, so they do not reset `policy`'s caches."""
    key: tuple[str, str] = ("", "")
    sample: list[PodRequest] = field(default_factory=list)
    empty_prepared: bool = False
    pods: list[PodRequest] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    prepared: int = -1
    prepare_count: int = 0
    """How many times `policy` was prepared (its scores may change each time)."""
    ordering_memo: dict[str, Any] = field(default_factory=dict)
    """The ordering policies' caches kept across cycles (`OrderingContext.memo`)."""

    def placement_policy(self, name: str, options: Mapping[str, Any]) -> PlacementPolicy:
        """The placement policy instance: made once, reused by every cycle on the view."""
        key = (name, repr(sorted(options.items())))
        if self.policy is None or self.key != key:
            self.policy = make_policy(name, **dict(options))
            self.empty_policy = make_policy(name, **dict(options))
            self.prepare_count += 1
            self.key = key
            self.forget()
        return self.policy

    def forget(self) -> None:
        """Collect the pods seen again from the next cycle on (the policy is prepared afresh then)."""
        self.pods = []
        self.seen = set()
        self.prepared = -1

    def for_empty(self, state: ClusterState) -> PlacementPolicy | None:
        """`empty_policy`, prepared (on first use) with the same pods as `policy`."""
        if self.empty_policy is not None and not self.empty_prepared:
            self.empty_policy.prepare(state, self.sample)
            self.empty_prepared = True
        return self.empty_policy

    def tell(self, state: ClusterState, pending: Sequence[Workload], running: Iterable[Workload]) -> None:
        """Give the policy the pods of the running and pending workloads it has not seen yet.

        The policy's `prepare` runs on the first cycle and again whenever the pods seen have grown
        by a quarter since, on an even sample of at most `MAX_PREPARE_PODS` of them (so estimating
        the workload's shape mix costs O(1) per arrival and a bounded time per cycle). `running` is
        read only on the first cycle (after `forget`).
        """
        policy = self.policy
        if policy is None:
            return
        seen = self.seen
        pods = self.pods
        if self.prepared < 0:  # what already runs (a requeued one may count twice)
            pods.extend(chain.from_iterable(map(_pods, running)))
        for w in pending:
            if w.id not in seen:
                seen.add(w.id)
                pods.extend(w.pods)
        if len(pods) != self.prepared and (self.prepared < 0 or len(pods) * 4 >= self.prepared * 5):
            stride = -(-len(pods) // MAX_PREPARE_PODS)  # an even sample keeps the shape mix
            self.sample = pods[::stride] if stride > 1 else list(pods)
            policy.prepare(state, self.sample)
            self.prepare_count += 1
            self.empty_prepared = False
            self.prepared = len(pods)
