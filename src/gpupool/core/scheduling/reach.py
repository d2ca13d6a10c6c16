"""How far a preemptor's priority reaches: which queues' running work it may stop, and which of it.

The operator's rules (`PreemptionRules`) keep Kueue's meaning inside a ClusterQueue and its cohort
(`withinClusterQueue`, `reclaimWithinCohort`, `borrowWithinCohort`), and add a pool-wide scope: under
`Scope.POOL` a higher priority class may stop preemptible work of a lower class in any queue, as
Slurm's QOS preemption and Kubernetes' PriorityClass do. Across queues only the class counts: a
tenant's own `--priority` orders its work, it never reaches another tenant's.

`reach()` answers, for one preemptor, per ClusterQueue what it may take (`Take`); the victim search
(`preemption.py`) reads its candidates from that answer, and a workload left waiting reads from it
why preemption did not help (`out_of_reach`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum, StrEnum

from gpupool.core.model import Workload
from gpupool.core.priority import Rank
from gpupool.core.scheduling.view import ClusterView
from gpupool.core.scheduling.workloads import lower_bound_usage


class Scope(StrEnum):
    """How far priority reaches beyond the preemptor's ClusterQueue and its cohort."""

    QUEUE = "queue"
    """Its own queue and, by the cohort rules, the queues of its cohort (Kueue)."""
    POOL = "pool"
    """Also every other queue: work of a lower class anywhere (Slurm QOS, Kubernetes PriorityClass)."""


class WithinQueue(StrEnum):
    """Kueue's `withinClusterQueue`: what the preemptor may stop in its own ClusterQueue."""

    NEVER = "never"
    LOWER_PRIORITY = "lower_priority"
    LOWER_OR_NEWER_EQUAL_PRIORITY = "lower_or_newer_equal_priority"
    """Lower ranks, and the same rank when submitted after the preemptor."""


class ReclaimWithinCohort(StrEnum):
    """Kueue's `reclaimWithinCohort`: what a queue within its nominal quota may take back from
    queues of its cohort that borrow."""

    NEVER = "never"
    LOWER_PRIORITY = "lower_priority"
    ANY = "any"


class BorrowWithinCohort(StrEnum):
    """Kueue's `borrowWithinCohort` (without a threshold): whether a queue that would borrow may
    still stop lower-ranked work of the borrowing queues of its cohort."""

    NEVER = "never"
    LOWER_PRIORITY = "lower_priority"


@dataclass(frozen=True, slots=True)
class PreemptionRules:
    """The operator's preemption rules; the defaults are the behaviour before they existed."""

    scope: Scope = Scope.QUEUE
    within_queue: WithinQueue = WithinQueue.LOWER_PRIORITY
    reclaim_within_cohort: ReclaimWithinCohort = ReclaimWithinCohort.ANY
    borrow_within_cohort: BorrowWithinCohort = BorrowWithinCohort.NEVER


class Take(IntEnum):
    """What a preemptor may take of one queue's preemptible work (a wider one includes the narrower)."""

    LOWER_CLASS = 1
    """Work whose class value is below the preemptor's (`Scope.POOL`, other queues)."""
    LOWER_RANK = 2
    """Work whose rank (class value, own priority) is below the preemptor's."""
    ALL = 3
    """All of it (reclaiming lent quota from a borrower, `ReclaimWithinCohort.ANY`)."""


@dataclass(frozen=True, slots=True)
class Reach:
    """One preemptor's reach: per queue what it may take, the queues whose work it would reclaim,
    and, under `LOWER_OR_NEWER_EQUAL_PRIORITY`, the submit time after which work of its own queue
    and rank may be taken too."""

    rank: Rank
    own: str
    """The preemptor's ClusterQueue."""
    queues: Mapping[str, Take]
    reclaim: tuple[str, ...]
    newer_than_s: float | None = None

    def takes(self, rank: Rank, take: Take) -> bool:
        """Whether work of `rank` is within `take` of this preemptor (`newer_than_s` aside)."""
        if take is Take.ALL:
            return True
        if take is Take.LOWER_RANK:
            return rank < self.rank
        return rank[0] < self.rank[0]


def reach(preemptor: Workload, cq: str, view: ClusterView, rules: PreemptionRules) -> Reach:
    """The queues (and which of their work) `preemptor` of ClusterQueue `cq` may take victims from."""
    rank = view.classes.rank(preemptor)
    queues: dict[str, Take] = {}
    newer: float | None = None
    if rules.within_queue is not WithinQueue.NEVER:
        queues[cq] = Take.LOWER_RANK
        if rules.within_queue is WithinQueue.LOWER_OR_NEWER_EQUAL_PRIORITY:
            newer = preemptor.submit_time_s
    reclaim: list[str] = []
    quota = view.quota
    if quota.config.enabled:
        within = quota.within_nominal(cq, lower_bound_usage(preemptor))
        rule = rules.reclaim_within_cohort if within else rules.borrow_within_cohort
        if rule != "never":
            take = Take.ALL if rule == ReclaimWithinCohort.ANY else Take.LOWER_RANK
            for member in sorted(quota.cohort_members(cq)):
                if member != cq and quota.is_borrowing(member):
                    queues[member] = take
                    if within:
                        reclaim.append(member)
    if rules.scope is Scope.POOL:
        for other in _queues_running(view):
            if other != cq:  # its own queue follows within_queue
                queues.setdefault(other, Take.LOWER_CLASS)
    return Reach(rank, cq, queues, tuple(reclaim), newer)


def _queues_running(view: ClusterView) -> list[str]:
    """The ClusterQueues with running work (sorted)."""
    view.materialize()
    return sorted(q for q, runs in view.by_queue.items() if runs)


def out_of_reach(reached: Reach, queues: Iterable[str], ranks: Callable[[str], Iterable[Rank]],
                 rules: PreemptionRules) -> str:
    """Why a waiting workload whose class could preempt did not, as a clause ('' when no work of
    a lower class runs in a preemptible class).

    `queues`: the ClusterQueues with running work; `ranks(q)`: the ranks of q's preemptible work.
    """
    outside: list[str] = []
    inside = False
    for q in sorted(queues):
        lower = [r for r in ranks(q) if r[0] < reached.rank[0]]
        if not lower:
            continue
        take = reached.queues.get(q)
        if take is not None and all(reached.takes(r, take) for r in lower):
            inside = True
        else:
            outside.append(q)
    others = [q for q in outside if q != reached.own]
    if others and rules.scope is Scope.QUEUE:
        more = f" (and {len(others) - 1} other queues)" if len(others) > 1 else ""
        return (f"preemption not possible: the lower-priority work is in queue {others[0]}{more} "
                "and preemption.scope is queue")
    if reached.own in outside:
        return (f"preemption not possible: the lower-priority work is in its own queue {reached.own} and "
                "preemption.within_queue is never")
    if inside:
        return ("preemption not possible: stopping all the lower-priority work it may preempt would "
                "not let it start")
    return ""
