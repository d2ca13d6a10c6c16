"""Victim selection: which running workloads a pending one may preempt, and the cheapest such set.

Candidates are the preemptible workloads within the preemptor's reach (`reach.py`, under the
operator's `PreemptionRules`); by default (a) lower-ranked ones of its own ClusterQueue and (b) when
the preemptor's queue stays within its nominal quota (it reclaims what it lent), any of a borrowing
ClusterQueue in the same cohort. Among the sets that make the
preemptor fit (quota and placement), we prefer the fewest victims, then the least work lost:
a single victim is searched exhaustively (least lost work first); otherwise victims are added
greedily (lowest rank, least lost work first) and then every victim that is not needed is
dropped again: first, in one step, all that hold nothing on the nodes the preemptor was placed on,
then one at a time, most lost work first.

The search tries placements on exactly the states of that definition (tests/core/scheduling/
victims_plain.py), but leaves out those whose first pod provably fits no node (they would place
nothing and draw nothing from the rng; kept where the policy counts its calls), takes victims
off the state only when a placement is tried, many in one step, and puts them back likewise.
"""

from __future__ import annotations

import heapq
import math
import random
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence, Set
from dataclasses import dataclass
from functools import partial
from itertools import chain, groupby, islice, repeat
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from gpupool.core.model import PodRequest, Workload, shared_labels
from gpupool.core.priority import Rank
from gpupool.core.scheduling.gang import GangPlacement, place_gang, release_gang
from gpupool.core.scheduling.policies.base import NoFit, PlacementPolicy
from gpupool.core.scheduling.reach import PreemptionRules, Reach, Scope, WithinQueue, out_of_reach, reach
from gpupool.core.scheduling.victim_state import Detached, FirstPodFits, PutBack, detach_all, usage_by_queue
from gpupool.core.scheduling.victim_state import node_fits_at as node_fits_at  # (tests import it here)
from gpupool.core.scheduling.view import ClusterView, Running
from gpupool.core.scheduling.workloads import lower_bound_usage
from gpupool.core.state import ClusterState, FreeAmounts, free_amounts

DEFAULT_RULES = PreemptionRules()

MAX_SINGLE_TRIALS = 16
"""How many single-victim sets are tried before falling back to the greedy search."""

MAX_TRIM_TRIALS = 24
"""How many of the greedy victims (costliest first) are tried for dropping again."""


def checkpoint_split(done_s: float, interval_s: float | None) -> tuple[float, float]:
    """Work done split into (kept at the last checkpoint, lost): all is lost without checkpoints."""
    if not interval_s or interval_s <= 0:
        return 0.0, max(0.0, done_s)
    kept = math.floor(max(0.0, done_s) / interval_s) * interval_s
    return kept, done_s - kept


def lost_work_s(run: Running, now_s: float) -> tuple[float, float]:
    """(progress to resume from, run time lost) if `run` stopped at `now_s` (wall-clock pace)."""
    done = run.progress_s + max(0.0, now_s - run.start_time_s)
    kept, _ = checkpoint_split(done, run.workload.checkpoint_interval_s)
    if not run.workload.checkpoint_interval_s:
        return 0.0, max(0.0, now_s - run.start_time_s)
    kept = max(kept, run.progress_s)
    return kept, done - kept


def lost_device_s(run: Running, now_s: float) -> float:
    return lost_work_s(run, now_s)[1] * run.device_count


def lost_device_s_many(runs: Sequence[Running], now_s: float) -> list[float]:
    """`[lost_device_s(run, now_s) for run in runs]` on arrays: the same operations, the same floats."""
    n = len(runs)
    if n < 64:  # (below this, building the arrays costs more than the loop)
        return [lost_device_s(run, now_s) for run in runs]
    since = now_s - np.fromiter([r.start_time_s for r in runs], np.float64, n)
    since = np.where(since > 0.0, since, 0.0)  # max(0.0, now_s - start_time_s)
    count = np.fromiter([r.device_count for r in runs], np.float64, n)
    intervals = [r.workload.checkpoint_interval_s for r in runs]
    if not any(intervals):
        return (since * count).tolist()
    interval = np.fromiter([i or 0.0 for i in intervals], np.float64, n)
    progress = np.fromiter([r.progress_s for r in runs], np.float64, n)
    return _lost_checkpointed(since, count, interval, progress)


def lost_device_s_columns(starts: Sequence[float], counts: Sequence[float], intervals: Sequence[float],
                          progress: Sequence[float], now_s: float) -> list[float]:
    """`lost_device_s_many` of runs given by their columns (start time, devices, checkpoint interval
    with 0 for none, progress; `view.VictimGroup.columns`): the same operations, the same floats."""
    n = len(starts)
    since = now_s - np.fromiter(starts, np.float64, n)
    since = np.where(since > 0.0, since, 0.0)
    count = np.fromiter(counts, np.float64, n)
    if not any(intervals):
        return (since * count).tolist()
    return _lost_checkpointed(since, count, np.fromiter(intervals, np.float64, n),
                              np.fromiter(progress, np.float64, n))


def _lost_checkpointed(since: np.ndarray, count: np.ndarray, interval: np.ndarray,
                       progress: np.ndarray) -> list[float]:
    """The lost device-seconds where some runs checkpoint (`lost_work_s`'s steps on arrays)."""
    done = progress + since
    positive = interval > 0
    step = np.where(positive, interval, 1.0)
    kept = np.where(positive, np.floor(np.where(done > 0.0, done, 0.0) / step) * step, 0.0)
    kept = np.where(progress > kept, progress, kept)  # max(kept, progress_s)
    lost = np.where(interval != 0, done - kept, since)
    return (lost * count).tolist()


@dataclass(frozen=True, slots=True)
class VictimSet:
    """The chosen victims, why each goes (own-queue preemption or cohort reclaim), and the gang."""

    victims: tuple[Running, ...]
    reclaimed: frozenset[str]
    gang: GangPlacement


def candidates(
    preemptor: Workload,
    cq: str,
    view: ClusterView,
    exclude: Set[str] = frozenset(),
    rules: PreemptionRules = DEFAULT_RULES,
) -> tuple[list[Running], frozenset[str]]:
    """Eligible victims (never those in `exclude`) and the ids among them that are cohort reclaims.

    The plain definition; a cycle's searches read the same sets through `VictimIndex`.
    """
    view.materialize()
    reached = reach(preemptor, cq, view, rules)
    found: list[Running] = []
    reclaim: set[str] = set()
    for run in view.running.values():
        if not run.preemptible or run.workload.id in exclude:
            continue
        take = reached.queues.get(run.cluster_queue)
        if (take is not None and reached.takes(run.rank, take)) or _newer_equal(run, cq, reached):
            found.append(run)
            if run.cluster_queue in reached.reclaim:
                reclaim.add(run.workload.id)
    return found, frozenset(reclaim)


def _newer_equal(run: Running, cq: str, reached: Reach) -> bool:
    """Work of the preemptor's own queue and rank submitted after it (`LOWER_OR_NEWER_EQUAL_PRIORITY`)."""
    return (reached.newer_than_s is not None and run.cluster_queue == cq and run.rank == reached.rank
            and run.workload.submit_time_s > reached.newer_than_s)


_Entry = tuple[float, Rank, str, Running]
_Columns = tuple[list[float], list[float], list[float], list[float]]


class Sources(NamedTuple):
    """What a preemptor may take victims from: whole (rank, queue) groups, the queues whose work
    would be reclaimed, and the group of its own queue and rank of which only work submitted after
    `newer_than_s` may go (`LOWER_OR_NEWER_EQUAL_PRIORITY`; None: none of it)."""

    groups: list[tuple[Rank, str]]
    reclaim: list[str]
    newer: tuple[Rank, str] | None = None
    newer_than_s: float = math.inf


_Order = tuple[float, Rank, str]
"""An entry's place within its rank's band of the by-rank stream: (cost, rank, id)."""
_WalkKey = tuple[PodRequest, tuple[tuple[Rank, str], ...], tuple[Rank, str] | None, float]


class Walk(NamedTuple):
    """What a greedy search's walk left known (`VictimIndex.walks`): on the state before it (`base`),
    the preemptor's first pod fitted no node once the victims of `prefix` were freed, the last of
    them at `last` in the by-rank stream of those sources (with `exclude` left out)."""

    base: FreeAmounts
    exclude: Set[str]
    prefix: list[Running]
    last: _Order


class SortedGroup:
    """One (queue, rank) group of a cycle's candidates in the order of (cost, rank, id), made into
    entries (cost, rank, id, run) as they are read: a search reads a tenth of them or less (the
    first victims that free enough), and each entry costs a tuple and a reference to count.

    `ids` and `runs` are sorted by id and `costs` aligned with them; the order is their stable sort
    by cost (ties keep the order of the ids: that of (cost, rank, id), the rank being the group's).
    The entries are made in chunks, each twice the size of all before it."""

    __slots__ = ("_sorted_costs", "costs", "entries", "ids", "order", "rank", "runs")

    def __init__(self, rank: Rank, ids: list[str], runs: list[Running], costs: list[float]) -> None:
        self.rank, self.ids, self.runs, self.costs = rank, ids, runs, costs
        self.order: list[int] = np.argsort(np.asarray(costs, dtype=np.float64), kind="stable").tolist()
        self.entries: list[_Entry] = []
        self._sorted_costs: np.ndarray | None = None

    def _extend(self) -> bool:
        """Make the next chunk of entries; False when every one is made."""
        done = len(self.entries)
        if done >= len(self.order):
            return False
        part = self.order[done:done + max(_FIRST_ENTRIES, done)]
        costs, ids, runs = self.costs, self.ids, self.runs
        self.entries += zip(map(costs.__getitem__, part), repeat(self.rank), map(ids.__getitem__, part),
                            map(runs.__getitem__, part))  # (the tuples built in C)
        return True

    def read(self, start: int = 0) -> Iterator[_Entry]:
        """The entries from position `start` on, made as they are reached."""
        entries = self.entries
        while start < len(entries) or self._extend():
            end = len(entries)
            yield from entries[start:end]
            start = end

    def all(self) -> list[_Entry]:
        """Every entry, in order."""
        while self._extend():
            pass
        return self.entries

    def after(self, key: _Order) -> int:
        """The position of the first entry placed after `key` (`bisect_right` on the entries by
        (cost, rank, id)), read from the sorted costs without making the entries."""
        cost, rank, wid = key
        sorted_costs = self._sorted_costs
        if sorted_costs is None:
            sorted_costs = self._sorted_costs = np.asarray(self.costs, dtype=np.float64)[self.order]
        lo = int(np.searchsorted(sorted_costs, cost, side="left"))
        hi = int(np.searchsorted(sorted_costs, cost, side="right"))
        if lo == hi or self.rank != rank:
            return hi if lo == hi or self.rank < rank else lo
        ids, order = self.ids, self.order
        return lo + bisect_right([ids[order[i]] for i in range(lo, hi)], wid)

    def cost_of(self, wid: str) -> float | None:
        """The lost work of the group's run with this id (None: no run of the group has it)."""
        ids = self.ids
        i = bisect_left(ids, wid)
        return self.costs[i] if i < len(ids) and ids[i] == wid else None


_FIRST_ENTRIES = 64
"""How many entries of a group are made first (`SortedGroup`)."""


class LostWork:
    """The lost work (`lost_device_s` at the cycle's time) of every run of the groups the cycle's
    searches sorted so far, read by run (its queue and rank name its group)."""

    __slots__ = ("groups",)

    def __init__(self) -> None:
        self.groups: dict[tuple[str, Rank], SortedGroup] = {}

    def get(self, run: Running, default: float) -> float:
        """The run's lost work, or `default` where its group was not sorted or holds no run of its id."""
        group = self.groups.get((run.cluster_queue, run.rank))
        found = None if group is None else group.cost_of(run.workload.id)
        return default if found is None else found

    def of(self, run: Running) -> float:
        """The run's lost work (its group sorted: a candidate the searches read)."""
        group = self.groups[(run.cluster_queue, run.rank)]
        found = group.cost_of(run.workload.id)
        if found is None:
            raise KeyError(run.workload.id)
        return found


class VictimIndex:
    """One cycle's victim candidates per ClusterQueue and rank, sorted once by lost work.

    Within a cycle the candidates only leave (victims go; work admitted in the cycle is never a
    victim), so each (queue, rank) group of preemptible work is sorted on first use, and a search
    merges the groups it may take from, skipping what has left since. Lost work (`cost`, the
    `lost_device_s` at the cycle's time) is computed only for the groups a search reads: a preemptor
    never reads its own queue's groups of equal or higher rank.
    """

    keep_columns = True
    """Read a group's lost work from the columns its `VictimGroup` keeps; False reads every run (the
    same floats, slower: kept to check that claim)."""

    def __init__(self, view: ClusterView, now_s: float) -> None:
        self.view = view
        self.now_s = now_s
        self.cost = LostWork()
        self._groups: dict[str, dict[Rank, list[Running]]] = {}
        self._milli: dict[tuple[str, Rank], int] = {}
        self._columns: dict[tuple[str, Rank], tuple[list[str], _Columns]] = {}
        self.walks: dict[_WalkKey, Walk] = {}
        """The last greedy walk per (first pod, sources): a later search of the same resumes it
        (`select_victims`, `resume_walks`)."""
        self.nowhere: dict[_WalkKey, Set[str]] = {}
        """Per (first pod, sources): a walk freed every candidate and the pod still fitted no node
        (with this `exclude`), since the last search that found victims (`keep_verdicts`)."""
        self._reached: tuple[Workload, str, PreemptionRules, Reach] | None = None
        """The last `reach` that `sources` computed, with its preemptor, queue and rules."""
        self._sources: dict[tuple[Rank, str, PreemptionRules, float | None], tuple[Sources, Reach]] = {}
        """`sources` per (rank, queue, rules, submit time where it counts) where no quota is kept
        and the scope is the queue (`keep_sources`)."""
        self._wording: dict[tuple[int, tuple[str, ...]], tuple[Reach, PreemptionRules, Set[str], str]] = {}
        """`why_none`'s clauses per (reach, queues with running work), since the last search that
        found victims (`keep_wording`)."""
        self._kept: KeptVerdicts | None = None
        """The view's verdicts kept across cycles (`kept`, `carry_verdicts`)."""

    def _ranks(self, cq: str) -> dict[Rank, list[Running]]:
        groups = self._groups.get(cq)
        if groups is None:
            self.view.materialize()
            groups = self._groups[cq] = {}
            for rank, group in self.view.victim_groups.get(cq, {}).items():
                groups[rank] = group.by_id()  # (sorted by id: see `_group`)
                if self.keep_columns:  # as they are now: the group changes as victims go
                    assert group.order is not None
                    starts, counts, intervals, progress = group.columns
                    self._columns[(cq, rank)] = (list(group.order), (list(starts), list(counts),
                                                                     list(intervals), list(progress)))
                self._milli[(cq, rank)] = group.milli
        return groups

    def _group(self, cq: str, rank: Rank) -> SortedGroup:
        """The (queue, rank) group as (cost, rank, id, run), sorted (ids are unique: runs never compare)."""
        group = self.cost.groups.get((cq, rank))
        if group is None:
            runs = self._ranks(cq)[rank]
            kept = self._columns.get((cq, rank))
            if kept is not None:
                ids, (starts, counts, intervals, progress) = kept
                costs = lost_device_s_columns(starts, counts, intervals, progress, self.now_s)
            else:
                costs = lost_device_s_many(runs, self.now_s)
                ids = [run.workload.id for run in runs]
            # The runs come sorted by id, so a stable sort by cost alone (in C) gives the order of
            # (cost, rank, id): the rank is the group's, the ids are unique.
            group = self.cost.groups[(cq, rank)] = SortedGroup(rank, ids, runs, costs)
        return group

    def search_order(
        self,
        preemptor: Workload,
        cq: str,
        exclude: Set[str],
        by_rank: bool,
        sources: Sources | None = None,
        rules: PreemptionRules = DEFAULT_RULES,
    ) -> tuple[Iterator[Running], list[str]]:
        """`candidates()` as a stream: by (lost work, rank, id), or by (rank, lost work, id); and the
        queues whose work would be reclaimed. `sources`: `self.sources(preemptor, cq, rules)` if known."""
        found = sources or self.sources(preemptor, cq, rules)
        groups = found.groups
        if found.newer is not None:
            groups = [*groups, found.newer]
        alive = self.view.running
        merged: Iterator[_Entry]
        if by_rank:  # lowest rank first; within a rank, queues merged by lost work
            bands = groupby(sorted(groups), key=itemgetter(0))
            merged = chain.from_iterable(self._merged(same, alive, exclude, found) for _, same in bands)
        else:
            merged = self._merged(groups, alive, exclude, found)
        return (entry[3] for entry in merged), found.reclaim

    def by_rank_after(self, sources: Sources, exclude: Set[str], after: _Order) -> Iterator[Running]:
        """`search_order(..., by_rank=True, sources)`'s stream from the entry after `after` on."""
        rank = after[1]
        groups = sources.groups if sources.newer is None else [*sources.groups, sources.newer]
        alive = self.view.running
        bands = groupby(sorted(g for g in groups if g[0] >= rank), key=itemgetter(0))
        merged = chain.from_iterable(self._merged(same, alive, exclude, sources, after if r == rank else None)
                                     for r, same in bands)
        return (entry[3] for entry in merged)

    def kept(self) -> KeptVerdicts:
        """The verdicts the view keeps across cycles (`carry_verdicts`), made and told to it at first."""
        kept = self._kept
        if kept is None:
            view = self.view
            listener = view.listener
            if isinstance(listener, KeptVerdicts) and listener.state is view.state:
                kept = listener
            else:
                kept = KeptVerdicts(view.state)
                view.listener = kept
            self._kept = kept
        return kept

    def place_of(self, run: Running) -> _Order:
        """The run's (cost, rank, id) in the stream (its group sorted already)."""
        return self.cost.of(run), run.rank, run.workload.id

    def most_freed(self, sources: Sources) -> int:
        """An upper bound on the compute (milli) all candidates of `sources` hold together (it counts
        those gone or excluded since the cycle's groups were made, and the whole `newer` group)."""
        milli = self._milli
        total = sum(milli[(q, rank)] for rank, q in sources.groups)
        if sources.newer is not None:
            total += milli[(sources.newer[1], sources.newer[0])]
        return total

    def sources(self, preemptor: Workload, cq: str, rules: PreemptionRules = DEFAULT_RULES) -> Sources:
        """The (rank, queue) groups `preemptor` may take victims from, and the queues it reclaims from."""
        key = None
        if keep_sources and not self.view.quota.config.enabled and rules.scope is not Scope.POOL:
            by_time = rules.within_queue is WithinQueue.LOWER_OR_NEWER_EQUAL_PRIORITY
            key = (self.view.classes.rank(preemptor), cq, rules, preemptor.submit_time_s if by_time else None)
            kept = self._sources.get(key)
            if kept is not None:
                self._reached = (preemptor, cq, rules, kept[1])
                return kept[0]
        reached = reach(preemptor, cq, self.view, rules)
        self._reached = (preemptor, cq, rules, reached)
        groups: list[tuple[Rank, str]] = []
        for q, take in reached.queues.items():
            groups += [(r, q) for r in self._ranks(q) if reached.takes(r, take)]
        newer = None
        if reached.newer_than_s is not None and reached.rank in self._ranks(cq):
            newer = (reached.rank, cq)
        found = Sources(groups, list(reached.reclaim), newer,
                        reached.newer_than_s if reached.newer_than_s is not None else math.inf)
        if key is not None:
            self._sources[key] = (found, reached)
        return found

    def reach_after_none(self, preemptor: Workload, cq: str, rules: PreemptionRules) -> Reach:
        """`reach(preemptor, cq, view, rules)` after a search for it found no victims: the one its
        `sources` computed, where it was the last (a search that finds none leaves the running work
        and the quota usage, integers, as it found them: `reach` reads nothing else that changes)."""
        kept = self._reached
        if keep_reach and kept is not None and kept[0] is preemptor and kept[1] == cq and kept[2] is rules:
            return kept[3]
        return reach(preemptor, cq, self.view, rules)

    def why_none(self, preemptor: Workload, cq: str, rules: PreemptionRules, exclude: Set[str]) -> str:
        """`out_of_reach` for a preemptor whose search found no victims: what its reach leaves out,
        read from the cycle's groups (`preemptible_ranks` with `exclude`)."""
        reached = self.reach_after_none(preemptor, cq, rules)
        queues = self.queues()
        key = (id(reached), tuple(queues))
        kept = self._wording.get(key) if keep_wording else None
        if kept is not None and kept[0] is reached and kept[1] is rules and kept[2] is exclude:
            return kept[3]
        text = out_of_reach(reached, queues, partial(self.preemptible_ranks, exclude=exclude), rules)
        self._wording[key] = (reached, rules, exclude, text)
        return text

    def queues(self) -> list[str]:
        """The ClusterQueues with running work."""
        self.view.materialize()
        return [q for q, runs in self.view.by_queue.items() if runs]

    def preemptible_ranks(self, cq: str, exclude: Set[str]) -> list[Rank]:
        """The ranks of the queue's preemptible work that still runs and is not in `exclude` (the same
        answer whenever the groups were made: they hold what ran when the cycle's searches began)."""
        alive = self.view.running
        return [r for r, runs in self._ranks(cq).items()
                if any(alive.get(run.workload.id) is run and run.workload.id not in exclude for run in runs)]

    def _merged(
        self, groups: Iterable[tuple[Rank, str]], alive: dict[str, Running], exclude: Set[str],
        found: Sources, after: _Order | None = None,
    ) -> Iterator[_Entry]:
        """The live entries of the (rank, queue) groups, merged by (cost, rank, id); with `after`,
        only those placed after it."""
        newer = found.newer
        return heapq.merge(*(
            _live_newer(self._entries(q, r, after), alive, exclude, found.newer_than_s) if (r, q) == newer
            else _live(self._entries(q, r, after), alive, exclude)
            for r, q in groups))

    def _entries(self, q: str, rank: Rank, after: _Order | None) -> Iterable[_Entry]:
        group = self._group(q, rank)
        return group.read(0 if after is None else group.after(after))


class KeptVerdicts:
    """`VictimIndex.nowhere`'s verdicts kept from one cycle to the next on one view (`carry_verdicts`):
    per (first pod, sources), the sources' groups. The view tells it of every run given back for
    good (`released`) and of every repair or change of the slice defaults (`changed`), and it drops
    each verdict that may no longer hold."""

    __slots__ = ("state", "verdicts")

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.verdicts: dict[_WalkKey, frozenset[tuple[Rank, str]]] = {}

    def keep(self, key: _WalkKey, sources: Sources, exclude: Set[str], alive: dict[str, Running]) -> None:
        """A walk for `key` freed every candidate and the first pod fitted no node: kept, unless some
        run of `exclude` is of the sources (then a candidate of a later cycle: see `carry_verdicts`)."""
        groups = frozenset(sources.groups)
        for wid in exclude:
            run = alive.get(wid)
            if run is not None and _of_sources(run, groups, key):
                return
        verdicts = self.verdicts
        verdicts.pop(key, None)
        if len(verdicts) >= MAX_KEPT_VERDICTS:
            del verdicts[next(iter(verdicts))]  # (the oldest)
        verdicts[key] = groups

    def released(self, run: Running) -> None:
        """`run` gave back what it held: the verdicts of which it was no candidate are dropped."""
        verdicts = self.verdicts
        if not verdicts:
            return
        if not run.preemptible:
            verdicts.clear()
            return
        gone = [key for key, groups in verdicts.items() if not _of_sources(run, groups, key)]
        for key in gone:
            del verdicts[key]

    def changed(self) -> None:
        """A node may hold more than before, or the pods' needs changed: no verdict holds."""
        self.verdicts.clear()


MAX_KEPT_VERDICTS = 256
"""How many verdicts a view keeps across cycles (the oldest go first)."""


def _of_sources(run: Running, groups: frozenset[tuple[Rank, str]], key: _WalkKey) -> bool:
    """Whether preemptible `run` is in one of the sources' groups (`key`: the walk's, which names the
    group of which only work submitted after its time goes), `exclude` aside."""
    group = (run.rank, run.cluster_queue)
    return group in groups or (group == key[2] and run.workload.submit_time_s > key[3])


def _live(entries: Iterable[_Entry], alive: dict[str, Running], exclude: Set[str]) -> Iterator[_Entry]:
    """The entries whose workload still runs and is not excluded."""
    for entry in entries:
        wid = entry[2]
        if alive.get(wid) is entry[3] and wid not in exclude:
            yield entry


def _live_newer(entries: Iterable[_Entry], alive: dict[str, Running], exclude: Set[str], after_s: float
                ) -> Iterator[_Entry]:
    """`_live`, keeping only the work submitted after `after_s`."""
    for entry in _live(entries, alive, exclude):
        if entry[3].workload.submit_time_s > after_s:
            yield entry


def select_victims(
    preemptor: Workload,
    cq: str,
    view: ClusterView,
    policy: PlacementPolicy,
    rng: random.Random,
    now_s: float,
    exclude: Set[str] = frozenset(),
    index: VictimIndex | None = None,
    rules: PreemptionRules = DEFAULT_RULES,
) -> VictimSet | None:
    """The victims to preempt so `preemptor` fits, with its placement taken; None leaves all unchanged.

    `exclude`: workloads that may not be victims (those admitted earlier in the same cycle).
    `index`: the cycle's `VictimIndex` (shared by its searches; one is made when not given).
    `rules`: how far the preemptor's priority reaches (`reach.py`).
    """
    index = index or VictimIndex(view, now_s)
    found = _search(preemptor, cq, view, policy, rng, now_s, exclude, index, rules)
    if found is not None:
        index.nowhere.clear()  # victims go: capacity the cycle's verdicts did not count is freed
        index._wording.clear()  # (and ranks of preemptible work may be left empty)
    return found


def _search(preemptor: Workload, cq: str, view: ClusterView, policy: PlacementPolicy, rng: random.Random,
            now_s: float, exclude: Set[str], index: VictimIndex, rules: PreemptionRules) -> VictimSet | None:
    """`select_victims` on the cycle's index."""
    need = preemptor.total_device_milli - free_milli(view, preemptor)
    sources = index.sources(preemptor, cq, rules)  # (the searches below leave quota as they found it)
    if index.most_freed(sources) < need:
        return None  # no victim, nor all of them, frees enough: no placement would be tried
    may_skip = not policy.counts_failed_calls()
    walk_key = (preemptor.pods[0], tuple(sources.groups), sources.newer, sources.newer_than_s)
    if keep_verdicts and may_skip and index.nowhere.get(walk_key) is exclude:
        return None  # no trial would be made: see `keep_verdicts`
    if carry_verdicts and may_skip and walk_key in index.kept().verdicts:
        return None  # no trial would be made: see `carry_verdicts`
    stream, reclaim_queues = index.search_order(preemptor, cq, exclude, False, sources, rules)
    singles = list(islice(stream, MAX_SINGLE_TRIALS))
    if not singles:
        return None
    cost = index.cost
    first = FirstPodFits(view.state, preemptor.pods[0])

    found_last: list[GangPlacement] = []

    def fits() -> GangPlacement | None:
        gang = _fits(preemptor, cq, view, policy, rng)
        if gang is not None:
            found_last[:] = (gang,)
        return gang

    def reclaimed(runs: Sequence[Running]) -> frozenset[str]:
        return frozenset(r.workload.id for r in runs if r.cluster_queue in reclaim_queues)

    for run in singles:
        if run.device_milli < need:
            continue
        if may_skip and not first.fits_with(run):
            continue  # the trial would place nothing, draw nothing and leave the policy as it was
        view.detach(run)
        gang = fits()
        if gang is not None:
            return VictimSet((run,), reclaimed([run]), gang)
        view.attach(run)
    found = index.search_order(preemptor, cq, exclude, True, sources, rules)[0]  # consumed lazily
    # (no victim is off the state)
    base = free_amounts(view.state) if put_back_from_base or resume_walks else None
    resume = None
    if resume_walks and base is not None:
        walk = index.walks.get(walk_key)
        if walk is not None and walk.exclude is exclude:
            live = _resumable(walk, base, view.running, exclude)
            if live is not None:
                resume = (*live, partial(index.by_rank_after, sources, exclude, walk.last))
    # Where the preemptor is one pod that no quota holds back, a policy that repeats itself places
    # it on the one node it fits, when it fits one alone: that trial need not be made (`_greedy`).
    sole = place_known and may_skip and policy.is_repeatable() and len(preemptor.pods) == 1
    charged = partial(_quota_known, preemptor, cq, view) if sole and cq in view.quota.queues else None
    greedy, walked, known = _greedy(found, need, view, fits, first, resume, sole, charged)
    if known and base is not None:
        index.walks[walk_key] = Walk(base, exclude, walked[:known], index.place_of(walked[known - 1]))
    if greedy is None:
        if may_skip and known and known == len(walked):
            index.nowhere[walk_key] = exclude  # (the pod was checked once the last victim was freed)
            if carry_verdicts:
                index.kept().keep(walk_key, sources, exclude, view.running)
        return None
    # Where the first pod fitted no node before any victim went, it may fit only where they were
    # freed from (freeing capacity elsewhere changes nothing): the first scan reads those nodes.
    only = sorted({a.node for run in greedy[0] for _, a in run.allocs}) if first.base is False else None
    back = PutBack(view, preemptor.pods[0], watch=may_skip, only=only,
                   base=base if put_back_from_base else None)
    placed = greedy[1]
    if isinstance(placed, GangPlacement):
        kept = _drop_apart(greedy[0], placed, back, fits)
    else:
        kept = _drop_apart_on(greedy[0], placed, view, charged)
    chosen = _trim(kept, cost, back, fits)
    # The state is now as the last placement that succeeded found it (the trials after it were
    # undone): a policy that repeats itself would place the preemptor there again (none made: the
    # state is that of the trial `_drop_apart_on` did not make).
    gang = _retake(found_last[0], view.state) if policy.is_repeatable() and found_last else fits()
    if gang is None:  # cannot happen: _trim keeps the set feasible; restore to be safe
        for run in chosen:
            view.attach(run)
        return None
    return VictimSet(tuple(chosen), reclaimed(chosen), gang)


keep_sources = True
"""`VictimIndex.sources` computed once per (rank, queue, rules, and the submit time where the rules
read it) in a cycle, where no quota is kept and the scope is the queue: `reach` then reads nothing
else (no usage, no other queue's work), and the groups are the cycle's, made once (`_ranks`).
False: computed for every search (the same sources: kept to check that claim)."""

keep_wording = True
"""`VictimIndex.why_none` words a refusal once per (reach, queues with running work) until a search
finds victims: the same reach object (`keep_sources`), the same queues, and the same ranks of
preemptible work, which within a cycle change only as victims go (`exclude` only grows, by work
admitted in the cycle, which no group made before its admission holds). False: worded for every
refusal (the same text: kept to check that claim)."""

keep_reach = True
"""`VictimIndex.reach_after_none` reads the reach the search computed; False: computes it again (the
same reach: kept to check that claim)."""

keep_verdicts = True
"""A search for the same first pod from the same sources as an earlier one in the cycle, with the
same `exclude`, returns None at once where that one's walk freed every candidate and the pod still
fitted no node, and no search has found victims since (`VictimIndex.nowhere`). Within a cycle no
capacity is freed but by preemption: work is admitted, the candidates only leave (as victims) and
`exclude` only grows, so each node's free amounts with every remaining candidate freed are at most
what they were, and a pod fits no more where fewer resources are free. The search would try no
placement (the first pod fits no node on any state it makes; a policy that does not count failed
calls draws nothing) and return None. False: searches again (the same decisions, slower: kept to
check that claim)."""

carry_verdicts = True
"""`keep_verdicts`'s verdicts kept from one cycle to the next (`KeptVerdicts`, on the view) while
they provably hold, whatever the later `exclude`. With every candidate freed, a node's free amounts
are its capacity less what the other work holds (integers), and the pod fitted no node on that
state. They grow only where (a) work that was no candidate gives back what it held (it ends, is
preempted, evicted or moved: `ClusterView.remove`, `forget`; a run that is not preemptible or not
of the sources' groups drops the verdict), (b) a node is repaired or the slice defaults change
(`ClusterView.mark_healthy`, `use_defaults`: every verdict is dropped), or (c) work that was no
candidate becomes one: the groups are in the key, and a run's queue, rank and submit time never
change, so only work of the walk's `exclude` can; a verdict whose `exclude` held running work of
the sources is not kept (the rest of that work is of no group of the sources: its end drops the
verdict). A candidate that leaves takes nothing from the sum; work started since held nothing at
the walk (freed, a candidate gives back what it took; another keeps it); a later `exclude` only
makes fewer candidates. Where the policy does not count failed calls, the search would then try no
placement and draw nothing, and returns None. Kept per view and state (another state: none kept).
False: searches again (the same decisions, slower: kept to check that claim)."""

resume_walks = True
"""A greedy search for the same first pod from the same sources as an earlier one in the cycle takes
the earlier walk's victims after which the pod fitted no node at once, where the pod still fits no
node once they are freed (`_greedy`); False: walks every victim (the same states placed on, slower:
kept to check that claim)."""

place_known = True
"""Where the greedy walk leaves a single-pod preemptor (no quota on its queue, a policy that repeats
itself and does not count failed calls) fitting exactly one node, its trial placement is not made:
it would land on that node. The victims elsewhere, which `_drop_apart` would put back, are then
never taken off the state, nor is `_drop_apart`'s trial made (`_drop_apart_on`); False: both are
tried (the same decisions, slower: kept to check that claim)."""

put_back_from_base = True
"""Put the victims apart from the greedy search's placement back (`_drop_apart`) by setting the free
amounts back to those before the search and taking the few others off again; False: by adding
each one's records back (the same state, slower: kept to check that claim)."""


def _greedy(
    found: Iterable[Running],
    need: int,
    view: ClusterView,
    fits: Callable[[], GangPlacement | None],
    first: FirstPodFits,
    resume: tuple[list[Running], Callable[[list[int]], np.ndarray], Callable[[], Iterator[Running]]]
    | None = None,
    sole: bool = False,
    charged: Callable[[int, Sequence[Running]], bool] | None = None,
) -> tuple[tuple[list[Running], GangPlacement | int] | None, list[Running], int]:
    """Victims in `found`'s order until the preemptor fits; with the placement it then got (released).

    A victim is taken off the state only when a placement is tried (all those before it go in one
    step), or when the bound says its node may now hold the first pod (see `FirstPodFits`): the
    placements are tried on the same states as when every victim goes off as it is taken.

    `resume`: (the live victims of an earlier walk's prefix after which the first pod fitted no
    node, which of some nodes changed since, the stream after that prefix): where `FirstPodFits.resume`
    finds the pod fits no node once they are freed here either, the walk takes them at once (no
    placement was tried among them) and goes on from the stream after them; else it walks `found`.
    Also returns the victims walked and how many of the first of them leave the pod fitting no node
    (0: none known).

    `sole`: when the first placement would be tried where the pod fits exactly one node
    (`FirstPodFits.sole_candidate`), that node is returned instead of a placement, and only the
    victims holding something there are off the state (the bound checks take off only the victims
    on the nodes they check, and no other node was within it). `charged(node, pending)`: where the
    preemptor's queue has a quota, whether that placement is known to pass it with the victims not
    yet off the state (`pending`) off too; if not, the placement is tried.
    """
    chosen: list[Running] = []
    freed = 0
    held = Detached(view)
    first.start(held.flush if sole else held.flush_all)
    tried = False
    known = 0
    if resume is not None and first.resume(resume[0], resume[1]):
        chosen = list(resume[0])
        held.pending = list(chosen)
        freed = sum(run.device_milli for run in chosen)
        known = len(chosen)
        found = resume[2]()
    for run in found:
        chosen.append(run)
        held.pending.append(run)
        freed += run.device_milli
        first.freed(run)
        if freed < need:
            continue
        if not first.fits_somewhere():
            known = len(chosen)  # (a first pod that fits no node fails every placement before it starts)
            continue
        if sole and not tried:
            node = first.sole_candidate()
            if node is not None and (charged is None or charged(node, held.pending)):
                return (chosen, node), chosen, known
        tried = True
        held.flush()
        gang = fits()
        if gang is not None:
            release_gang(gang, view.state)
            return (chosen, gang), chosen, known
    held.restore()
    return None, chosen, known


def _resumable(walk: Walk, base: FreeAmounts, alive: dict[str, Running], exclude: Set[str]
               ) -> tuple[list[Running], Callable[[list[int]], np.ndarray]] | None:
    """The victims of `walk`'s prefix that may still go, and which of some nodes' free amounts differ
    from the walk's state (a function of the rows: only the prefix's nodes are read); None when the
    first pod may fit otherwise on any node (the heavy slices changed from none to some or back).
    A victim of the prefix gone since leaves its node unchanged only where other work took what it
    held: with less freed there, the pod fits it no more than in the walk (a fit needs at least as
    much free on every axis)."""
    before = walk.base
    if bool(before[4]) != bool(base[4]):
        return None
    live = [run for run in walk.prefix
            if alive.get(run.workload.id) is run and run.workload.id not in exclude]
    return live, partial(_changed, before, base)


def _changed(before: FreeAmounts, now: FreeAmounts, rows: list[int]) -> np.ndarray:
    """[row] whether the node's free cpu, memory, or any device's free milli or memory differ."""
    at = np.asarray(rows, dtype=np.intp)
    changed = (before[0][at] != now[0][at]) | (before[1][at] != now[1][at])
    changed |= (before[2][at] != now[2][at]).any(axis=1)
    changed |= (before[3][at] != now[3][at]).any(axis=1)
    return np.asarray(changed)


def _drop_apart(
    chosen: list[Running], gang: GangPlacement, back: PutBack, fits: Callable[[], GangPlacement | None]
) -> list[Running]:
    """Drop, in one step, the victims that hold nothing on the nodes of the greedy search's placement.

    The greedy search frees capacity wherever the cheapest victims run, so a gang that needs one
    node's devices may stop dozens of workloads elsewhere; the bounded one-at-a-time trim would keep
    most of them. They are put back together; if the preemptor still fits (quota included), none of
    them is needed.
    """
    nodes = {alloc.node for _, alloc in gang.allocs}
    apart = [r for r in chosen if all(alloc.node not in nodes for _, alloc in r.allocs)]
    if not apart or len(apart) == len(chosen):
        return chosen
    out = {id(r) for r in apart}
    trial = fits() if back.attach(apart, [r for r in chosen if id(r) not in out]) else None
    if trial is None:
        back.undo()
        return chosen
    release_gang(trial, back.view.state)
    return [r for r in chosen if id(r) not in out]


def _drop_apart_on(chosen: list[Running], node: int, view: ClusterView,
                   charged: Callable[[int, Sequence[Running]], bool] | None = None) -> list[Running]:
    """`_drop_apart` where the greedy search's placement would have been on `node` (not tried): the
    victims holding nothing there are dropped. They were never taken off the state (the others
    are off it), so the state is already the one `_drop_apart` tries, and its trial needs no
    making: the pod fits `node`, which holds what it held in the walk's state, and a policy places
    a pod that fits some node; `charged`, where its queue has a quota, says whether it passes it.
    Were that trial the last placement to succeed, `select_victims` places the preemptor on this
    state again. Where the quota refuses it, the victims apart go off the state too and all stay."""
    kept: list[Running] = []
    apart: list[Running] = []
    for run in chosen:
        (kept if any(alloc.node == node for _, alloc in run.allocs) else apart).append(run)
    if charged is not None and apart and not charged(node, ()):
        detach_all(view, apart)
        return chosen
    return kept


def _quota_known(w: Workload, cq: str, view: ClusterView, node: int, off: Sequence[Running]) -> bool:
    """Whether one-pod `w` placed on `node` would pass its queue's quota (`_fits`' two checks) with
    the usage of `off` removed too (for the check only). True only where that is known without
    placing it: the node's devices are alike (model, capacity, memory), so the usage the placement
    charges does not depend on which of them it takes."""
    state = view.state
    pod = w.pods[0]
    n = pod.num_devices
    if n:
        rows = (state.dev_valid[node], state.dev_model[node], state.dev_milli_cap[node],
                state.dev_mem_cap[node], state.dev_mem_size[node])
        if n > len(rows[0]) or not rows[0][0] or not all(bool((r == r[0]).all()) for r in rows):
            return False
    usage = view.usage_of(((pod, state.make_alloc(pod, node, range(n))),))
    quota = view.quota
    removed = usage_by_queue(off, quota.queues)
    for q, u in removed.items():
        quota.remove(q, u)
    try:
        return quota.fits(cq, lower_bound_usage(w)) is None and quota.fits(cq, usage) is None
    finally:
        for q, u in removed.items():
            quota.add(q, u)


def _trim(
    chosen: list[Running], cost: LostWork, back: PutBack, fits: Callable[[], GangPlacement | None]
) -> list[Running]:
    """Drop every victim the preemptor does not need, trying the costliest first."""
    keep = list(chosen)
    for run in sorted(chosen, key=lambda r: -cost.of(r))[:MAX_TRIM_TRIALS]:
        if len(keep) == 1:
            break
        gang = fits() if back.attach([run]) else None
        if gang is None:
            back.undo()
            continue
        release_gang(gang, back.view.state)
        keep.remove(run)
    return keep


def _retake(gang: GangPlacement, state: ClusterState) -> GangPlacement:
    """Take again what a placement held on a state equal to the one it was made on."""
    for _, record in gang.allocs:
        state.allocate(record)
    return gang


def _fits(
    w: Workload, cq: str, view: ClusterView, policy: PlacementPolicy, rng: random.Random
) -> GangPlacement | None:
    """Place `w` if both quota and capacity allow it now (quota is not charged; the caller admits)."""
    if view.quota.fits(cq, lower_bound_usage(w)) is not None:
        return None
    gang = place_gang(w, view.state, policy, rng)
    if isinstance(gang, NoFit):
        return None
    if view.quota.fits(cq, view.usage_of(gang.allocs)) is not None:
        release_gang(gang, view.state)
        return None
    return gang


def free_milli(view: ClusterView, w: Workload) -> int:
    """Free compute (milli) on the devices any of the workload's pods may use."""
    state = view.state
    pods = w.pods
    if any(not p.allowed_models for p in pods if p.num_devices):
        models: frozenset[str] = frozenset()
    else:
        models = frozenset().union(*(p.allowed_models for p in pods))
    labels = pods[0].node_labels if len(pods) == 1 else shared_labels(pods)
    # (a sum where the mask holds: the same integer as summing the masked copy, without the copy)
    return int(np.add.reduce(state.dev_milli_free, axis=None, where=state.allowed_devices(models, labels)))
