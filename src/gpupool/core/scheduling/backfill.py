"""EASY backfill: a reservation for the stuck head of the queue, and runtime estimates to honour it.

The head's reservation is the earliest time at which, by the estimated ends of the running
workloads, the head fits (placed with the cycle's placement policy on a "shadow" state: the
pool as it will be then). A later workload may start now only if it ends (by its estimate)
before that time, or if the head still fits in the shadow state with it added: it never delays
the head, as long as the estimates hold. Workloads without an estimate never end in this
reckoning, so they backfill only into room the head does not need.

On a fabric, a gang reserved inside one domain of its preferred tier (a leaf) keeps it: work after
which the head would still fit at its start, but only spread wider, is refused as work that delays
it (`Reservation.narrow`, `keep_locality`); the cycle first tries such work off the head's nodes
(`cycle.steer_backfill`).

A run still going past its estimated end is expected to end when its estimate, doubled as often
as it takes, lies ahead (`corrected_end_s`: the prediction correction of Tsafrir, Etsion and
Feitelson, "Backfilling using system-generated predictions rather than user runtime estimates",
IEEE TPDS 2007). Counting it as ending now instead lets every later workload backfill into room
the overdue run still holds: on a busy pool with history estimates some run is nearly always
overdue, so the head's reservation would always be "now" and never hold anything back.

Estimates come from the user when given, else from history: the mean run time of earlier runs of
the same tenant, queue and shape (pod sizes), of the same workload name when it has one, else of
any name; else none. History of other queues or shapes is never used: a tenant's short jobs say
nothing of its long training runs, and an estimate drawn from them made a head's reservation read
"in 8 s" while it waited on hours of work, sliding forward by a doubling at every correction.
`RuntimeEstimator` keeps that history and measures its own error (`history_by` keeps the older
reckoning, by name, then tenant, then all, for comparison).
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter, itemgetter
from typing import Literal

import numpy as np

from gpupool.core.model import SliceDefaults, Workload, shared_labels
from gpupool.core.scheduling.domains import narrowest_tier
from gpupool.core.scheduling.gang import GangPlacement, place_gang, release_gang
from gpupool.core.scheduling.policies.base import NoFit, PlacementPolicy
from gpupool.core.scheduling.topology import FabricView
from gpupool.core.scheduling.view import ClusterView, Running
from gpupool.core.scheduling.workloads import Shape, shape_of
from gpupool.core.state import (
    BoolArray,
    ClusterState,
    PodAlloc,
    clone_state,
    free_amounts,
    note_released,
    release_many,
    restore_free,
    row_counts,
    shift_free,
    shift_pod_kinds,
)
from gpupool.core.topology_spec import TopologySpec


@dataclass(slots=True)
class Reservation:
    """The head's reserved start and the shadow state (the pool at that time) that guards it."""

    head: Workload
    start_s: float
    shadow: ClusterState
    domain: BoolArray | None = None
    """[node] where the head is reserved, when only those nodes matter (a gang waiting for a leaf:
    `locality`): work outside them never delays it. None: any node may."""
    nodes: BoolArray | None = None
    """[node] the nodes the head is placed on at `start_s` in the shadow (a gang waiting for a leaf)."""
    fits_on: BoolArray | None = None
    """[node] nodes on which the head fits in the shadow as it stands (`may_backfill` keeps it so):
    work placed off them leaves that placement whole, so the head is not placed again for it."""
    narrow: np.ndarray | None = None
    """[node] the domain ids of the tier a gang's reserved placement keeps to (its preferred tier,
    when the placement found at `start_s` lies in one such domain): `may_backfill` refuses work
    after which the head would still fit, but only spread wider (`keep_locality`)."""


MAX_RESERVATION_TRIALS = 64
"""How many future end times the head is placed at before giving up on a reservation (end times at
which a quick device check shows it cannot fit are passed over without counting)."""

MIN_CORRECTED_ESTIMATE_S = 1.0
"""What an overdue run's correction doubles from when its estimate is zero."""


def corrected_end_s(run: Running, now_s: float) -> float:
    """When a run is expected to end: its planned end while that lies ahead; once past, the end
    of its estimate doubled as many times as it takes to lie ahead of `now_s` (never `now_s`
    itself). The run time counted includes the progress of earlier attempts, as the estimate does.
    Constant between the times it returns, so a reservation built on it may be kept that long."""
    planned = run.planned_end_s
    if planned > now_s or run.estimate_s is None:
        return planned
    estimate = max(run.estimate_s, MIN_CORRECTED_ESTIMATE_S)
    done = run.progress_s + (now_s - run.start_time_s)
    # the fewest doublings k with estimate * 2**k > done (exact: scaling by 2**k does not round)
    k = max(0, math.floor(math.log2(done / estimate))) if done > estimate else 0
    while estimate * 2.0**k <= done:
        k += 1
    while k > 0 and estimate * 2.0 ** (k - 1) > done:
        k -= 1
    return run.start_time_s + estimate * 2.0**k - run.progress_s


def _expected_ends(
    view: ClusterView, now_s: float, correct: bool, kept: KeptSearch | None = None
) -> tuple[list[tuple[float, str]], list[int], float]:
    """(expected end, id) of the runs with an estimate, sorted, and the compute each holds: the
    view's planned ends, with the overdue ones corrected (`corrected_end_s`) when `correct`; and
    the earliest corrected end (inf: none). `kept`: where the sorted corrected ends are kept from
    one search to the next (`KeptSearch.overdue`)."""
    ends, milli = view.ends, view.end_milli
    late = _overdue(view, now_s) if correct else 0
    if not late:
        return ends, milli, math.inf
    if kept is not None and keep_searches and keep_expected:
        expected = ExpectedEnds.of(view, now_s)
        return expected.ends, expected.milli, expected.fixed[0][0]
    running = view.running
    if kept is not None and keep_searches:
        fixed = _overdue_kept(view, now_s, late, kept)
    elif keep_corrected:
        fixed = _corrected_kept(view, now_s, late)
    else:
        fixed = sorted((corrected_end_s(running[rid], now_s), rid, m)
                       for (_, rid), m in zip(ends[:late], milli[:late], strict=True))
    merged, merged_milli = _merge_in(ends, milli, late, fixed)
    return merged, merged_milli, fixed[0][0]


keep_corrected = True
"""Keep each overdue run's corrected end from one reservation to the next while it stands
(`ClusterView.corrected_ends`); False computes every one afresh (the same ends, slower: kept to
check that claim)."""


keep_expected = True
"""Keep the expected ends, merged, from one reservation to the next (`ExpectedEnds`); False merges
them afresh every time (the same list, slower: kept to check that claim)."""


@dataclass(slots=True)
class ExpectedEnds:
    """The view's expected ends as `_expected_ends` merges them (with `correct`), kept by the view
    (`ClusterView.expected_ends`) and brought up to date instead of merged again for each search.

    `ends`: the (end, id) of every run with an estimate, sorted, its planned end while that lies after
    `now_s`, else its corrected end (`corrected_end_s`, always after `now_s`), with the compute each
    holds aligned (`milli`); `fixed`: the corrected ones, sorted (`fixed_of`: by id, with the record
    it was computed for). Brought to a later time by the runs registered and dropped since
    (`ClusterView.end_log`: a new one at its planned end), then by the clock: the items at or
    before the new time (runs overdue, and corrections the clock reached) are corrected anew and
    put back in order; every later item stands, a corrected end being constant until the clock
    reaches it. A clock set back, or a corrected run's record replaced outside the view's books,
    builds them afresh."""

    now_s: float
    ends: list[tuple[float, str]]
    milli: list[int]
    fixed: list[tuple[float, str]]
    fixed_of: dict[str, tuple[tuple[float, str], Running]]

    @classmethod
    def of(cls, view: ClusterView, now_s: float) -> ExpectedEnds:
        """The view's, at `now_s` (built on the first call, and where `follow` cannot bring them)."""
        kept = view.expected_ends
        if kept is None or view.end_log is None or now_s < kept.now_s \
                or not kept.follow(view.end_log, view, now_s):
            kept = view.expected_ends = cls.build(view, now_s)
            view.end_log = []
        return kept

    @classmethod
    def build(cls, view: ClusterView, now_s: float) -> ExpectedEnds:
        late = _overdue(view, now_s)
        running = view.running
        fixed = sorted((corrected_end_s(running[rid], now_s), rid, m)
                       for (_, rid), m in zip(view.ends[:late], view.end_milli[:late], strict=True))
        ends, milli = _merge_in(view.ends, view.end_milli, late, fixed)
        items = [(end, rid) for end, rid, _ in fixed]
        return cls(now_s, ends, milli, items, {item[1]: (item, running[item[1]]) for item in items})

    def follow(self, log: list[tuple[int, Running]], view: ClusterView, now_s: float) -> bool:
        """Brought up to `now_s` (not before `self.now_s`); False: a corrected run's record is not
        the view's (replaced outside `end_log`), so they are to be built afresh."""
        ends, milli, fixed, fixed_of = self.ends, self.milli, self.fixed, self.fixed_of
        for sign, run in log:
            rid = run.workload.id
            if sign < 0:
                was = fixed_of.pop(rid, None)
                if was is None:
                    item = (run.planned_end_s, rid)
                else:
                    item = was[0]
                    del fixed[bisect.bisect_left(fixed, item)]
                at = bisect.bisect_left(ends, item)
                del ends[at]
                del milli[at]
            else:  # at its planned end: if past, the clock's step below corrects it
                item = (run.planned_end_s, rid)
                at = bisect.bisect_left(ends, item)
                ends.insert(at, item)
                milli.insert(at, run.device_milli)
        log.clear()
        running = view.running
        if not all(running.get(rid) is run for rid, (_, run) in fixed_of.items()):
            return False
        cut = bisect.bisect_right(ends, now_s, key=_end)
        if cut:
            again = []
            for (_, rid), m in zip(ends[:cut], milli[:cut], strict=True):
                old = fixed_of.get(rid)
                if old is not None:
                    del fixed[bisect.bisect_left(fixed, old[0])]
                run = running[rid]
                item = (corrected_end_s(run, now_s), rid)
                fixed_of[rid] = (item, run)
                bisect.insort(fixed, item)
                again.append((item[0], rid, m))
            again.sort()
            if len(again) > 64:
                self.ends, self.milli = _merge_in(ends, milli, cut, again)
            else:  # the few put back in place: no copy of the whole list
                del ends[:cut]
                del milli[:cut]
                for end, rid, m in again:
                    at = bisect.bisect_left(ends, (end, rid))
                    ends.insert(at, (end, rid))
                    milli.insert(at, m)
        self.now_s = now_s
        return True


def _corrected_kept(view: ClusterView, now_s: float, late: int) -> list[tuple[float, str, int]]:
    """The (corrected end, id, compute) of the `late` overdue runs, sorted, each end the one kept
    since it was computed while `now_s` has not passed it: `corrected_end_s` is constant from the
    time it was computed until the end it returns (the same doublings of the estimate cover the
    work done meanwhile)."""
    running, kept = view.running, view.corrected_ends
    if len(kept) > 2 * late + 1024:  # runs that ended or caught up since: forget them
        live = {rid for _, rid in view.ends[:late]}
        kept = view.corrected_ends = {rid: v for rid, v in kept.items() if rid in live}
    fixed = []
    for (_, rid), m in zip(view.ends[:late], view.end_milli[:late], strict=True):
        run = running[rid]
        found = kept.get(rid)
        if found is None or found[0] is not run or not found[1] <= now_s < found[2]:
            found = kept[rid] = (run, now_s, corrected_end_s(run, now_s))
        fixed.append((found[2], rid, m))
    fixed.sort()
    return fixed


def _overdue_kept(view: ClusterView, now_s: float, late: int, kept: KeptSearch) -> list[_Fixed]:
    """`_corrected_kept(view, now_s, late)`, the last search's list again while it stands: the same
    overdue runs (the same records, planned ends and compute) and the clock not before it was made
    nor at its earliest corrected end (each end is constant from when it was computed until the
    clock reaches it, `corrected_end_s`)."""
    ends, milli = view.ends[:late], view.end_milli[:late]
    running = view.running
    runs = [running[rid] for _, rid in ends]
    last = kept.overdue
    if last is not None and last[0] <= now_s < last[4][0][0] and last[1] == ends and last[2] == milli \
            and len(runs) == len(last[3]) and all(a is b for a, b in zip(runs, last[3], strict=True)):
        return last[4]
    fixed = _corrected_kept(view, now_s, late) if keep_corrected else sorted(
        (corrected_end_s(run, now_s), rid, m) for (_, rid), m, run in zip(ends, milli, runs, strict=True))
    kept.overdue = (now_s, ends, milli, runs, fixed)
    return fixed


def _merge_in(
    ends: list[tuple[float, str]], milli: list[int], late: int, fixed: list[tuple[float, str, int]]
) -> tuple[list[tuple[float, str]], list[int]]:
    """`list(heapq.merge(fixed's (end, id), ends[late:]))` with the compute of each, aligned: the
    sorted rest is copied in slices between the (few) corrected ends, each put where a binary search
    finds it, instead of merging item by item in Python. No two items are equal (the ids differ),
    so the order is the merge's."""
    merged: list[tuple[float, str]] = []
    merged_milli: list[int] = []
    at = late
    for end, rid, m in fixed:
        item = (end, rid)
        cut = bisect.bisect_left(ends, item, lo=at)
        merged += ends[at:cut]
        merged_milli += milli[at:cut]
        merged.append(item)
        merged_milli.append(m)
        at = cut
    merged += ends[at:]
    merged_milli += milli[at:]
    return merged, merged_milli


def reserve(
    head: Workload, view: ClusterView, now_s: float, policy: PlacementPolicy, rng: random.Random,
    correct: bool = True,
) -> Reservation | None:
    """The earliest time the head fits by the running workloads' expected ends; None if never.

    The runs are taken in the order of their expected ends: the view's planned ends (`view.ends`),
    those already past corrected (`corrected_end_s`); `correct=False` expects those to end now
    (`Running.expected_end_s`), as wait-or-spread reads them (`locality`).
    """
    return _reserve(head, view, now_s, policy, rng, correct)[0]


def _reserve(
    head: Workload, view: ClusterView, now_s: float, policy: PlacementPolicy, rng: random.Random,
    correct: bool = True, not_before_s: float = -math.inf, hint_s: float = math.inf,
    wanted: tuple[float, float] | None = None, kept: KeptSearch | None = None,
) -> tuple[Reservation | None, float]:
    """`reserve`, and until when the clock changes nothing in its answer: the earliest corrected end
    at or before the start (inf: none). A reservation reads only the runs expected to end by its
    start: a correction further out moves a run from one time after the start to a later one.
    `not_before_s`: no earlier end time is tried (one the caller knows the head cannot start at);
    `hint_s`: where the search looks first (`_first_fit_in_time`; any value gives the same answer).
    `wanted`: (loss_s, cap_s): the caller uses a start t only when t - not_before_s < loss_s and
    t - not_before_s <= cap_s, so the search stops at the first end time past that (None then, where
    the whole search may have found a later start: `locality.reserve_in_domain`).
    `kept`: what the last search for the same head left (`KeptSearch`; any value gives the same answer)."""
    view.materialize()
    if not view.ends:
        return None, math.inf
    ends, end_milli, first_fix = _expected_ends(view, now_s, correct, kept)
    if wanted is not None:
        # the start found is an end time (or now) and never earlier than the search got to: past
        # the first end time the caller cannot use, none later is of use either (t - not_before_s
        # only grows with t, so the test flips once); the groups before it are whole
        bound = wanted
        cut = bisect.bisect_left(ends, True, key=lambda e: not _wanted(max(e[0], now_s), not_before_s, bound))
        ends, end_milli = ends[:cut], end_milli[:cut]
    if kept is not None:
        kept.floor = None
    found = _first_fit_in_time(head, view, now_s, policy, rng, ends, end_milli, not_before_s, hint_s, kept)
    if found is not None:
        found.narrow = _narrow(head, view, policy, found.fits_on)
    until = first_fix if found is None or first_fix <= found.start_s else math.inf
    return found, until


def _wanted(start_s: float, not_before_s: float, wanted: tuple[float, float]) -> bool:
    """Whether a start is of use to a caller that asked for `wanted` (`_reserve`)."""
    delay_s = start_s - not_before_s
    return delay_s < wanted[0] and delay_s <= wanted[1]


def _first_fit_in_time(
    head: Workload, view: ClusterView, now_s: float, policy: PlacementPolicy, rng: random.Random,
    ends: list[tuple[float, str]], end_milli: list[int], not_before_s: float = -math.inf,
    hint_s: float = math.inf, kept: KeptSearch | None = None,
) -> Reservation | None:
    """The head placed on the shadow pool at each end time in turn, from the first at which enough
    compute is free, until it fits (placed at most MAX_RESERVATION_TRIALS times). `hint_s`: the end
    time at which the device check is expected to pass first (the head's last reserved start,
    `kept_reserve`): tried before the search from the start (`_hinted_first_passing`). `kept`: the
    last search's sums of the runs below the hint and its placements (`KeptSearch`), updated here."""
    running = view.running
    shadow = clone_state(view.state)
    allowed = _allowed(head, shadow)
    # skip ahead to the first end time at which enough compute is free in aggregate (the runs
    # that end at one time are released together, so their order among themselves is moot)
    short = head.total_device_milli - int(shadow.dev_milli_free[allowed].sum())
    i = 0
    if short > 0:
        freed = end_milli if bool(allowed.sum() == shadow.dev_valid.sum()) else \
            (_allowed_milli(running[rid], allowed) for _, rid in ends)
        i = first_reaching(freed, short, len(ends))
    if not_before_s > now_s:
        i = max(i, bisect.bisect_left(ends, not_before_s, key=_end))
    if i >= len(ends):
        return None
    domains = _required_domains(head, view, policy)
    could_fit = kept.device_check(head, domains) if kept is not None and keep_searches else \
        _device_check(head, domains)
    if search_hints and math.isfinite(hint_s):
        done = _hinted_first_passing(shadow, ends, running, i, now_s, could_fit, hint_s, kept)
    else:
        done = _first_passing(shadow, ends, running, i, now_s, could_fit)
    if done is None:
        return None
    if kept is not None:  # the end before the first group that passes, for `KeptReservation.carries`
        below = _group_start(ends, done - 1, now_s)
        kept.floor = (ends[below - 1][0] if below else -math.inf, ends)
    # the device check passes here and, the runs only ever freeing room, at every later end time
    trials = 0
    places = kept.placements(head, view, policy) if kept is not None else None
    while True:
        trials += 1
        fits_on = _place_at(head, shadow, policy, rng, places)
        if fits_on is not None:
            return Reservation(head, max(ends[done - 1][0], now_s), shadow, fits_on=fits_on)
        if done >= len(ends) or trials >= MAX_RESERVATION_TRIALS:
            return None
        i = _group_end(ends, done, now_s)
        release_many(shadow, _records(ends, running, done, i))
        done = i


def first_reaching(amounts: Iterable[int], short: int, count: int) -> int:
    """The first index at which the running total of `amounts` (none negative) reaches `short`,
    `count` where it never does: `np.searchsorted(np.cumsum(amounts), short)`, adding up only as far
    as that index (the head's first end time is mostly among the first few of thousands)."""
    total = 0
    for k, amount in enumerate(amounts):
        total += amount
        if total >= short:
            return k
    return count


def _group_end(ends: list[tuple[float, str]], i: int, now_s: float) -> int:
    """The end of the group of runs expected to end at the time of `ends[i]` (now, if past)."""
    return bisect.bisect_right(ends, max(ends[i][0], now_s), lo=i, key=_end)


def _records(ends: list[tuple[float, str]], running: dict[str, Running], lo: int, hi: int) -> list[PodAlloc]:
    return [rec for _, rid in ends[lo:hi] for _, rec in running[rid].allocs]


search_hints = True
"""Look for the first end time at which the head passes the device check at its last reserved start
first (`_hinted_first_passing`); False searches from the start every time (the same reservations,
slower: kept to check that claim)."""


def _hinted_first_passing(
    shadow: ClusterState, ends: list[tuple[float, str]], running: dict[str, Running], i: int,
    now_s: float, could_fit: Callable[[ClusterState], bool], hint_s: float,
    kept: KeptSearch | None = None,
) -> int | None:
    """`_first_passing(shadow, ends, running, i, now_s, could_fit)`, trying the group at `hint_s`
    first: when the check fails after the group before it and passes after it, that group is the
    first that passes (the check is monotone along the groups: releases only add free room), found
    with two releases and two checks instead of a search over every group from `i`. When the check
    fails there too, the search goes on from that group; when it passes already before it, the
    search starts afresh from `i` (the free amounts put back). The shadow ends as `_first_passing`
    leaves it: the same records released, each once. With `kept`, the runs before the hint's group
    are released as sums kept from the last search, updated by the runs that joined or left them."""
    first = _group_end(ends, i, now_s)  # the first group end `_first_passing` checks
    at = bisect.bisect_left(ends, hint_s, key=_end)  # the first run at or after the hint
    if at >= len(ends):
        return _first_passing(shadow, ends, running, i, now_s, could_fit)
    hinted = _group_end(ends, at, now_s)
    if hinted <= first:  # the hint's group is the first checked anyway
        return _first_passing(shadow, ends, running, i, now_s, could_fit)
    before = _group_start(ends, at, now_s)  # the end of the group before the hint's
    saved = free_amounts(shadow)
    below: list[PodAlloc] | KeptSearch
    if kept is not None and keep_searches:
        kept.release_below(shadow, ends, running, before)
        below = kept
    else:
        below = _records(ends, running, 0, before)
        shift_free(shadow, below, 1)
    if before >= first and could_fit(shadow):  # it passes earlier: search from the start
        restore_free(shadow, saved)
        return _first_passing(shadow, ends, running, i, now_s, could_fit)
    group = _records(ends, running, before, hinted)
    shift_free(shadow, group, 1)
    if isinstance(below, KeptSearch):
        below.note_released(shadow)
    else:
        note_released(shadow, below)
    note_released(shadow, group)
    if could_fit(shadow):
        return hinted
    if hinted >= len(ends):
        return None
    return _first_passing(shadow, ends, running, hinted, now_s, could_fit, released=hinted)


def _group_start(ends: list[tuple[float, str]], i: int, now_s: float) -> int:
    """The start of the group of runs expected to end at the time of `ends[i]` (now, if past)."""
    t = ends[i][0]
    return 0 if t <= now_s else bisect.bisect_left(ends, t, hi=i, key=_end)


def _first_passing(
    shadow: ClusterState, ends: list[tuple[float, str]], running: dict[str, Running], i: int,
    now_s: float, could_fit: Callable[[ClusterState], bool], released: int = 0,
) -> int | None:
    """Release the runs of `ends` up to the end of the first group (from the one holding `ends[i]`;
    the runs before it with the first) after which `could_fit(shadow)` passes, and return that end;
    None (the shadow then freed of them all): it passes at none. `released`: the runs before it
    are released already (a group end at or before `i`).

    The same group as the check made after every group in turn, found in fewer checks: releasing
    runs only adds free room, so the check, once passed, passes at every later group. Groups are
    released in a doubling number (their free amounts only, `shift_free`); a batch after which the
    check passes is taken back (`restore_free`) and searched by halves; one after which it fails is kept."""
    done, at = released, i
    step, within = 1, 0  # within: a pass is known within that many groups from `done` (0: none yet)
    while True:
        cand = at
        for _ in range(step):
            cand = _group_end(ends, cand, now_s)
            if cand >= len(ends):
                break
        records = _records(ends, running, done, cand)
        one = cand == _group_end(ends, at, now_s)
        saved = None if one else free_amounts(shadow)
        shift_free(shadow, records, 1)
        if could_fit(shadow):
            if saved is None:  # one group: the first that passes
                note_released(shadow, records)
                return cand
            restore_free(shadow, saved)
            within = step
            step = max(1, step // 2)
            continue
        note_released(shadow, records)
        done = at = cand
        if cand >= len(ends):
            return None
        if within:
            within -= step
            step = max(1, within // 2)
        else:
            step *= 2


keep_searches = True
"""Start a head's search from what the last search left (`KeptSearch`): the runs below the hint's
group released as kept sums, and a placement not made again where the shadow it read is the same;
False computes both afresh (the same reservations, slower: kept to check that claim)."""

_Fixed = tuple[float, str, int]
_Tried = tuple[tuple[object, ...], BoolArray | None, np.ndarray]


@dataclass(slots=True)
class KeptSearch:
    """What the last reservation search left, kept by the view (one per slot, `kept_reserve`) so the
    next search (a later cycle) recomputes only what changed since.

    `released`: the runs the hinted search released below its hint's group (by id), and `sums`, a
    state whose free amounts, heavy-share count, node versions and pods per node hold what releasing
    exactly those runs adds to a state's (the pods counted up, where a release counts them down).
    The next search releases the runs below its own hint's group by adding the sums, once updated
    by the runs that joined them (started, or now expected to end sooner) and those that left
    (ended, preempted, now expected later), or counted anew when those outnumber the runs below
    (a search for another head): integer sums, so the shadow is the one that releasing each run
    gives, field for field.

    `overdue`: the overdue runs' corrected ends, sorted, while the same runs are overdue and the
    clock has not reached the earliest of them (`_overdue_kept`).

    `check`: the head's quick device check, made once per head (`device_check`).

    `tried`: the placements the last search made, each with the shadow it read (free amounts,
    capacity, heavy shares, pods per node) and what it did (the nodes taken, None: no fit; the node
    versions it bumped). A repeatable policy (`PlacementPolicy.is_repeatable`: the same choice on an
    equal state, nothing drawn, nothing kept) placing without a fabric, not prepared again since, on
    the same slice defaults, places the same head alike on an equal shadow: it is not asked again.
    """

    sums: ClusterState
    released: dict[str, Running] = field(default_factory=dict)
    placer: tuple[object, ...] = ()
    tried: list[_Tried] = field(default_factory=list)
    overdue: tuple[float, list[tuple[float, str]], list[int], list[Running], list[_Fixed]] | None = None
    """(when, the overdue runs' ends, their compute, their records, their corrected ends sorted)
    of the last search (`_overdue_kept`)."""
    check: tuple[Workload, np.ndarray | None, Callable[[ClusterState], bool]] | None = None
    """(head, its required domains, `_device_check` of them) of the last search."""
    floor: tuple[float, list[tuple[float, str]]] | None = None
    """(the latest end before the first group after which the device check passed, the ends the
    search read) of the last search, None where none passed (an output, read by `kept_reserve`:
    `KeptReservation.carries`)."""

    @classmethod
    def fresh(cls, state: ClusterState) -> KeptSearch:
        search = cls(clone_state(state, empty=True))
        search.clear()
        return search

    def clear(self) -> None:
        """Sums of no run."""
        sums = self.sums
        for a in (sums.cpu_free, sums.mem_free, sums.dev_milli_free, sums.dev_mem_free, sums.node_version):
            a[...] = 0
        sums.heavy_slices = 0
        sums.node_pod_kinds = [{}] * len(sums.node_pod_kinds)  # (one empty dict: never changed in place)
        self.released = {}

    def fits(self, state: ClusterState) -> bool:
        """Whether the sums are of this pool (the same nodes and devices)."""
        sums = self.sums
        return sums.nodes is state.nodes and sums.dev_mem_size is state.dev_mem_size

    def release_below(self, shadow: ClusterState, ends: list[tuple[float, str]],
                      running: dict[str, Running], before: int) -> None:
        """`shift_free(shadow, <the records of the runs of ends[:before]>, 1)`, from the sums."""
        now = _runs_of(running, ends, before)
        old = self.released
        left = [run for rid, run in old.items() if now.get(rid) is not run]
        joined = [run for rid, run in now.items() if old.get(rid) is not run]
        sums = self.sums
        if len(left) + len(joined) > len(now):  # mostly other runs (another head's hint): count anew
            self.clear()
            _count_runs(sums, list(now.values()), 1)
        else:
            _count_runs(sums, left, -1)
            _count_runs(sums, joined, 1)
        self.released = now
        shadow.cpu_free += sums.cpu_free
        shadow.mem_free += sums.mem_free
        shadow.dev_milli_free += sums.dev_milli_free
        shadow.dev_mem_free += sums.dev_mem_free
        shadow.heavy_slices += sums.heavy_slices

    def note_released(self, shadow: ClusterState) -> None:
        """`note_released(shadow, <the same records>)` after `release_below`."""
        shadow.node_version += self.sums.node_version
        held_by = shadow.node_pod_kinds
        for node, kinds in enumerate(self.sums.node_pod_kinds):
            if kinds:
                held = held_by[node] = held_by[node].copy()  # (never changed in place: state.py)
                for kind, count in kinds.items():
                    left = held.get(kind, 0) - count
                    if left > 0:
                        held[kind] = left
                    else:
                        held.pop(kind, None)

    def device_check(self, head: Workload, domains: np.ndarray | None) -> Callable[[ClusterState], bool]:
        """`_device_check(head, domains)`, made once for the same head and domains."""
        last = self.check
        if last is None or last[0] is not head or last[1] is not domains:
            last = self.check = (head, domains, _device_check(head, domains))
        return last[2]

    def placements(
        self, head: Workload, view: ClusterView, policy: PlacementPolicy
    ) -> tuple[list[_Tried], list[_Tried]] | None:
        """(the last search's placements, this one's, to fill) when they may be reused; else None."""
        if not policy.is_repeatable() or policy.topology is not None:
            self.tried = []
            return None
        placer = (head, policy, view.state.defaults, _prepared(view, policy), policy.mode())
        last = self.tried
        if not self.placer or any(a is not b for a, b in zip(placer[:3], self.placer, strict=False)) \
                or placer[3:] != self.placer[3:]:
            last = []
        self.placer = placer
        self.tried = []
        return last, self.tried


def _count_runs(sums: ClusterState, runs: list[Running], sign: int) -> None:
    """Add (sign 1) or take out (-1) the runs' records in `KeptSearch.sums`."""
    if not runs:
        return
    records = [rec for run in runs for _, rec in run.allocs]
    shift_free(sums, records, sign)
    version = sums.node_version
    for r in records:
        version[r.node] += sign
    shift_pod_kinds(sums, records, sign)


def _shadow_seen(shadow: ClusterState) -> tuple[object, ...]:
    """What a placement reads of a shadow (`KeptSearch.tried`), copied: the node list and device
    models (shared by every copy of a pool's state), the free amounts and capacity, the heavy
    shares and the pods per node."""
    return (shadow.nodes, shadow.dev_model, b"".join(a.tobytes() for a in _arrays(shadow)),
            shadow.heavy_slices, list(shadow.node_pod_kinds))  # (dicts never changed in place)


def _same_shadow(seen: tuple[object, ...], shadow: ClusterState) -> bool:
    return (
        seen[0] is shadow.nodes and seen[1] is shadow.dev_model and seen[3] == shadow.heavy_slices
        and seen[2] == b"".join(a.tobytes() for a in _arrays(shadow))
        and seen[4] == shadow.node_pod_kinds
    )


def _place_at(
    head: Workload, shadow: ClusterState, policy: PlacementPolicy, rng: random.Random,
    places: tuple[list[_Tried], list[_Tried]] | None,
) -> BoolArray | None:
    """The nodes the head is placed on in the shadow (placed and given back: the shadow's free
    amounts as they were); None: it does not fit. `places`: `KeptSearch.placements`."""
    if places is None:
        gang = place_gang(head, shadow, policy, rng)
        if isinstance(gang, NoFit):
            return None
        release_gang(gang, shadow)
        return nodes_mask(gang, shadow)
    last, tried = places
    for seen, fits_on, bumped in last:
        if _same_shadow(seen, shadow):
            shadow.node_version += bumped
            tried.append((seen, fits_on, bumped))
            return None if fits_on is None else fits_on.copy()
    seen = _shadow_seen(shadow)
    versions = shadow.node_version.copy()
    gang = place_gang(head, shadow, policy, rng)
    fits_on = None
    if not isinstance(gang, NoFit):
        release_gang(gang, shadow)
        fits_on = nodes_mask(gang, shadow)
    tried.append((seen, fits_on, shadow.node_version - versions))
    return None if fits_on is None else fits_on.copy()


keep_locality = True
"""Backfill keeps a gang's reserved placement inside its preferred tier (`Reservation.narrow`):
without it work may start wherever the head still fits at its start, however spread."""


def _narrow(head: Workload, view: ClusterView, policy: PlacementPolicy, fits_on: BoolArray | None
            ) -> np.ndarray | None:
    """The domain ids of the head's preferred tier when its reserved placement lies in one domain
    of it (so backfill may not spread it); None: nothing to keep (no fabric, one pod, no
    preferred tier, a required one the placement keeps anyway, or already spread)."""
    if not keep_locality or fits_on is None:
        return None
    fabric = fabric_spec(head, view, policy)
    if fabric is None:
        return None
    topology, spec = fabric
    if spec.preferred is None:
        return None
    tier = narrowest_tier(topology, np.flatnonzero(fits_on).tolist())
    if tier is None or tier.depth > spec.preferred.depth:
        return None
    return topology.domain_of(spec.preferred)


def _required_domains(head: Workload, view: ClusterView, policy: PlacementPolicy) -> np.ndarray | None:
    """[node] the domain ids of the tier the head must sit inside (required=<tier>); None: none."""
    fabric = fabric_spec(head, view, policy)
    if fabric is None or fabric[1].required is None:
        return None
    return fabric[0].domain_of(fabric[1].required)


def fabric_spec(
    gang: Workload, view: ClusterView, policy: PlacementPolicy
) -> tuple[FabricView, TopologySpec] | None:
    """The fabric and the topology constraint that apply to a gang of several pods; None: no
    fabric in the view or bound to the policy, one pod, or no constraint."""
    topology, context = view.topology, policy.topology
    if topology is None or context is None or len(gang.pods) < 2:
        return None
    spec = context.spec_for(gang)
    return None if spec is None else (topology, spec)


def _device_check(head: Workload, domains: np.ndarray | None = None) -> Callable[[ClusterState], bool]:
    """A quick test a state must pass for the head to fit in it (devices only; placing is the
    real test, many times slower): some node has room for its largest pod's devices, and, when its
    pods are all alike, the nodes have room for all of them (with `domains`, the [node] ids of
    the domains it must sit inside: the nodes of one domain)."""
    pods = [p for p in head.pods if p.num_devices]
    if not pods:
        return _always
    big = max(pods, key=attrgetter("num_devices"))
    alike = len(pods) == len(head.pods) and all(replace(p, name=big.name) == big for p in pods)

    def check(state: ClusterState) -> bool:
        room = (row_counts(state.device_fits(big)) * state.schedulable) // big.num_devices
        if room.max() < 1 or not alike:
            return bool(room.max() >= 1)
        if domains is None:
            return bool(room.sum() >= len(pods))
        return bool(np.bincount(domains, weights=room).max() >= len(pods))

    return check


def _always(state: ClusterState) -> bool:
    return True


@dataclass(slots=True)
class KeptReservation:
    """A reservation (or None: the head fits at no estimated end) with everything it was computed
    from, so that a later cycle asking for the same head on the same pool reuses it.

    `reserve` reads: the head; the running records with an estimate (their allocations and planned
    ends: fixed per record, so the view's `running_version` stands for them); the live state's
    capacity arrays and pods per node (compared whole); the placement policy (the same instance,
    prepared as many times, in the same `mode`, reading the same of the fabric (`_fabric_reads`), on
    the same slice defaults: only a policy whose `place` is repeatable, drawing nothing from the rng
    and keeping nothing, so skipping its calls changes nothing later); and the clock only through
    the ends already past and their corrections, each constant until the clock reaches it
    (`corrected_end_s`). So the result is the same while as many ends are past (`overdue`) and no
    correction is reached (`until_s`) (`matches`); and, across runs that started and ended, while
    the pool from the head's first passing group on is the same (`carries`).
    """

    head: Workload
    running_version: int
    policy: PlacementPolicy
    prepared: int
    mode: object
    """The policy's `mode()` then."""
    fabric: tuple[object, ...] | None
    """What the search read of the fabric besides the state (`_fabric_reads`) then."""
    defaults: SliceDefaults
    state: ClusterState
    live: ClusterState
    """A copy of the live state's capacity, free amounts, heavy shares and pods per node when the
    reservation was made (or last carried); node versions not kept up to date."""
    overdue: int
    until_s: float
    """The earliest corrected end of an overdue run at or before the start (inf: none): the clock
    changes nothing before (`_reserve`)."""
    start_s: float
    shadow: ClusterState | None
    """The shadow state as `reserve` returned it (cycles change their copy); None: no reservation."""
    fits_on: BoolArray | None = None
    """The reservation's `fits_on` as `reserve` returned it (`may_backfill` changes the copies)."""
    narrow: np.ndarray | None = None
    not_before_s: float = -math.inf
    wanted: tuple[float, float] | None = None
    floor_s: float | None = None
    """`KeptSearch.floor`'s end: the device check fails on the pool as the runs ending by it leave
    it (`carries`); None: the reservation is not carried across starts and finishes."""
    ends: list[tuple[float, str]] = field(default_factory=list)
    """A copy of the expected ends the reservation was made (or last carried) on."""
    floor_at: int = 0
    """How many of `ends` end at or before `floor_s`."""
    runs: dict[str, Running] = field(default_factory=dict)
    """The view's running records then (by id) of the runs in `ends[:floor_at]`, the only ones
    `carries` reads (a copy of every record cost a fifth of a millisecond a cycle at 7,000 runs)."""

    def asks_alike(self, head: Workload, view: ClusterView, policy: PlacementPolicy) -> bool:
        """The same head, placed by the same policy (prepared as many times) on the same pool."""
        state = view.state
        return (
            self.head is head
            and self.policy is policy
            and self.prepared == _prepared(view, policy)
            and self.mode == policy.mode()
            and _same_reads(self.fabric, _fabric_reads(head, policy))
            and self.state is state
            and self.defaults is state.defaults
        )

    def matches(self, head: Workload, view: ClusterView, now_s: float, policy: PlacementPolicy) -> bool:
        state, live = view.state, self.live
        return (
            self.running_version == view.running_version
            and self.asks_alike(head, view, policy)
            and now_s < self.until_s
            and _overdue(view, now_s) == self.overdue
            and all(map(_equal, _arrays(live), _arrays(state)))
            and live.node_pod_kinds == state.node_pod_kinds
        )

    def carries(self, head: Workload, view: ClusterView, now_s: float, policy: PlacementPolicy,
                search: KeptSearch, rng: random.Random) -> bool:
        """Whether the reservation stands across the runs that started and ended since (and the
        clock), though the live state changed. On True it is brought up to date (`matches` then
        compares with the state as it is now); once its copy of the live state is changed and found
        to differ, it holds nothing (the caller makes the reservation afresh).

        Why the search finds the same reservation. Write P(t) for the pool as the search sees it at
        time t: the live state with the records of the runs expected to end by t released (free
        amounts, heavy shares, pods per node; the capacity as it is). The search releases the runs
        group by group (one group per end time, every one after now: overdue ends are corrected),
        finds the first group G0 after which the aggregate compute (the free compute of the head's
        allowed devices, which the cumulative sum of the released runs counts) suffices and the
        device check passes, then places the head there and at later groups, in turn, until it fits
        (`_first_fit_in_time`; the hinted search finds the same G0, `_hinted_first_passing`). Both
        tests only get easier as free room grows, so they fail on P(f), f the latest end before G0
        (`floor_s`; -inf: none), and on every pool with no more free room than P(f). The
        reservation stands when, now:

        * the expected ends after f are the same (end, id) list: the groups from G0 on are at the
          same times, and no run ends between f and G0;
        * the live state is the copy made then (`live`) with the records of the runs that left the
          ends up to f given back and those of the runs that joined them taken (a run by its record:
          one started again is one that left and one that joined), field for field, capacity
          included. A run expected to end by t adds nothing to P(t) whether it runs (held, then
          released) or not, so P(f) and P(t) for every later t are the pools the search saw
          (a run after f that another record with the same id and end replaced must then hold
          the same room: the live state shows any difference, as it shows the start or end of a
          run without an estimate, which never ends in this reckoning);
        * every earlier group of the ends now lies at or before f, so the tests fail on its pool,
          which has no more free room than P(f).

        So the search stops at G0 again and places the head on the same pools in the same order:
        with a repeatable policy (the same instance, prepared as many times, in the same `mode`, on
        the same slice defaults, reading the same of the fabric: `_fabric_reads`, nothing for a head
        of one pod), at the same nodes, the same start and the same shadow (free amounts, heavy
        shares, pods per node; its node versions are those of the search that made it, as with
        `matches`: a policy keys what it keeps by node version within one state object, and every
        reservation returned is a new copy).

        Runs that started since and are expected to end after f (`_joined_after`) carry it too, for
        a head of one pod. Each holds room until its end and gives it back then, so no pool the
        search sees has more free room than the one it saw at the same time, and the new end times
        bring no pool that was not one of those (where f is -inf, the live state was no such pool: no
        run may then end before G0). Since f's check failed, and the head fitted no pool
        between G0 and the start S (for one pod, a policy returns NoFit only where no node fits it,
        and a node that fits it no more on less room), the head fits no pool before S now either.
        At S it is placed again, on the kept shadow with the joined runs that still hold there
        taken off it: where it fits, that placement is the reservation's (the search would stop at S
        and make exactly it; the checks pass where the head fits), with no more trials than the
        groups after f up to S (the search may place at most `MAX_RESERVATION_TRIALS` of them).
        f stays a floor: its check failed on more room than now."""
        floor = self.floor_s
        if floor is None or not self.asks_alike(head, view, policy):
            return False
        ends, _, first_fix = _expected_ends(view, now_s, True, search)
        old, k = self.ends, self.floor_at
        j = bisect.bisect_right(ends, floor, key=_end)
        extra: list[tuple[float, str]] = []
        if len(ends) - j != len(old) - k or ends[j:] != old[k:]:
            found = self._joined_after(head, ends, j, now_s)
            if found is None:
                return False
            extra = found
        running, before = view.running, self.runs  # (the records of old[:k]'s runs)
        after = _runs_of(running, ends, j)
        left = [rec for rid, run in before.items() if after.get(rid) is not run for _, rec in run.allocs]
        joined = [rec for rid, run in after.items() if before.get(rid) is not run for _, rec in run.allocs]
        joined += [rec for _, rid in extra for _, rec in running[rid].allocs]
        # the copy made as the live state was, moved by those runs, must be the live state now
        state, live = view.state, self.live
        self.floor_s, self.running_version = None, -1  # changed below: no use unless equal
        shift_free(live, left, 1)
        shift_free(live, joined, -1)
        if not (shift_pod_kinds(live, left, -1, strict=True)
                and shift_pod_kinds(live, joined, 1, strict=True)):
            return False
        if live.heavy_slices != state.heavy_slices or live.node_pod_kinds != state.node_pod_kinds \
                or not all(map(_equal, _arrays(live), _arrays(state))):
            return False
        holding = [rec for end_s, rid in extra if end_s > self.start_s for _, rec in running[rid].allocs]
        if holding and not self._placed_again(head, holding, policy, rng):
            return False
        self.floor_s, self.floor_at, self.ends, self.runs = floor, j, list(ends), after
        self.running_version = view.running_version
        self.overdue = _overdue(view, now_s)
        self.until_s = first_fix if first_fix <= self.start_s else math.inf
        return True

    def _joined_after(self, head: Workload, ends: list[tuple[float, str]], j: int, now_s: float
                      ) -> list[tuple[float, str]] | None:
        """The expected ends after the floor (`ends[j:]`) that the kept ones lack, where every kept
        one is still there: runs started since that end after the floor. None where a kept one is
        gone or moved, where the head is not one pod (a gang's placement may succeed on less room
        where it failed on more), or where the search would place the head more times than it may
        before the start (`carries`)."""
        tail, kept = ends[j:], self.ends[self.floor_at:]
        if not carry_joined or len(head.pods) != 1 or self.shadow is None or len(tail) <= len(kept):
            return None
        have = set(tail)
        if not kept or not have.issuperset(kept):
            return None
        extra = sorted(have.difference(kept))
        if self.floor_s == -math.inf and extra[0][0] < kept[0][0]:
            return None  # it would end where the search saw no pool: the first group was the live one
        upto = bisect.bisect_right(ends, self.start_s, lo=j, key=_end)
        if len({max(end_s, now_s) for end_s, _ in ends[j:upto]}) > MAX_RESERVATION_TRIALS:
            return None
        return extra

    def _placed_again(self, head: Workload, holding: list[PodAlloc], policy: PlacementPolicy,
                      rng: random.Random) -> bool:
        """Take the records of joined runs that still hold at the start off the kept shadow and
        place the head there again (`_place_at`): True (with its nodes kept) where it fits."""
        shadow = self.shadow
        assert shadow is not None
        for record in holding:
            shadow.allocate(record)
        fits_on = _place_at(head, shadow, policy, rng, None)
        if fits_on is None:
            return False
        self.fits_on = fits_on
        return True

    def reservation(self, now_s: float) -> Reservation | None:
        if self.shadow is None:
            return None
        fits_on = None if self.fits_on is None else self.fits_on.copy()
        return Reservation(self.head, self.start_s, clone_state(self.shadow), fits_on=fits_on,
                           narrow=self.narrow)


def _runs_of(running: Mapping[str, Running], ends: Sequence[tuple[float, str]], k: int) -> dict[str, Running]:
    """The running records of the runs in `ends[:k]`, by id."""
    return {rid: running[rid] for _, rid in ends[:k]}


def _arrays(state: ClusterState) -> tuple[np.ndarray, ...]:
    """What `reserve` reads of a state besides its pods per node and its slice defaults."""
    return (
        state.cpu_free, state.mem_free, state.dev_milli_free, state.dev_mem_free,
        state.cpu_cap, state.mem_cap, state.dev_milli_cap, state.dev_mem_cap, state.schedulable,
    )


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    """`np.array_equal(a, b)` for arrays of one type (a state's and its copy's), in fewer steps."""
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def _overdue(view: ClusterView, now_s: float) -> int:
    """How many running workloads should have ended by `now_s` (by their estimates)."""
    return bisect.bisect_right(view.ends, now_s, key=_end)


_end = itemgetter(0)


def _prepared(view: ClusterView, policy: PlacementPolicy) -> int:
    """How many times the policy was prepared; 0 for a policy whose `prepare` does nothing."""
    return 0 if type(policy).prepare is PlacementPolicy.prepare else view.policies.prepare_count


keep_reservations = True
"""Reuse the last reservation while nothing it depends on changed (`KeptReservation`); False
computes it afresh on every call (the same reservations, slower: kept to check that claim)."""


carry_reservations = True
"""Keep the last reservation across runs that started and ended, where they leave the pool the same
from the head's first passing group on (`KeptReservation.carries`: runs expected to end before it,
for a repeatable policy, the fabric read as it was); False makes it afresh after any start or
finish (the same reservations, slower: kept to check that claim)."""


carry_joined = True
"""Carry the reservation across runs that started since and end after its floor too, for a head of
one pod, placing it again at its start where they still hold there (`KeptReservation.carries`);
False makes it afresh (the same reservations, slower: kept to check that claim)."""


def kept_reserve(
    head: Workload, view: ClusterView, now_s: float, policy: PlacementPolicy, rng: random.Random,
    slot: Literal["kept_reservation", "kept_leaf_reservation"] = "kept_reservation",
    not_before_s: float = -math.inf, wanted: tuple[float, float] | None = None,
) -> Reservation | None:
    """`reserve(head, view, now_s, policy, rng)`, reused from the view's last one when it must be
    the same (see `KeptReservation`). `slot`: the view's attribute that keeps it (a stuck gang's
    reservation inside one leaf is kept beside the head's own, `locality.reserve_in_domain`);
    `not_before_s` and `wanted` as `_reserve`'s."""
    view.materialize()
    kept = getattr(view, slot)
    search = view.kept_searches.get(slot)
    if search is None or not search.fits(view.state):
        search = view.kept_searches[slot] = KeptSearch.fresh(view.state)
    if (keep_reservations and kept is not None and kept.not_before_s == not_before_s
            and kept.wanted == wanted
            and (kept.matches(head, view, now_s, policy)
                 or (carry_reservations and kept.carries(head, view, now_s, policy, search, rng)))):
        return kept.reservation(now_s)
    last = view.reserve_hints.get(slot)
    hint_s = last[1] if last is not None and last[0] == head.id else math.inf
    if not policy.is_repeatable():  # its placements draw from the rng or change later ones
        setattr(view, slot, None)
        found = _reserve(head, view, now_s, policy, rng, not_before_s=not_before_s, hint_s=hint_s,
                     wanted=wanted, kept=search)[0]
        _note_hint(view, slot, head, found)
        return found
    state = view.state
    live = clone_state(state)
    found, until_s = _reserve(head, view, now_s, policy, rng, not_before_s=not_before_s, hint_s=hint_s,
                     wanted=wanted, kept=search)
    _note_hint(view, slot, head, found)
    overdue = _overdue(view, now_s)
    # carried across starts and finishes (`KeptReservation.carries`) only without a lower bound or a
    # window; the search reads the running records and leaves them as they were
    floor = search.floor if (found is not None and not_before_s == -math.inf and wanted is None) else None
    floor_at = 0 if floor is None else bisect.bisect_right(floor[1], floor[0], key=_end)
    setattr(view, slot, KeptReservation(
        head=head,
        running_version=view.running_version,
        policy=policy,
        prepared=_prepared(view, policy),
        mode=policy.mode(),
        fabric=_fabric_reads(head, policy),
        defaults=state.defaults,
        state=state,
        live=live,
        overdue=overdue,
        until_s=until_s,
        start_s=math.inf if found is None else found.start_s,
        shadow=None if found is None else clone_state(found.shadow),
        fits_on=None if found is None or found.fits_on is None else found.fits_on.copy(),
        narrow=None if found is None else found.narrow,
        not_before_s=not_before_s,
        wanted=wanted,
        floor_s=None if floor is None else floor[0],
        ends=[] if floor is None else list(floor[1]),
        floor_at=floor_at,
        runs={} if floor is None else _runs_of(view.running, floor[1], floor_at),
    ))
    return found


def _fabric_reads(head: Workload, policy: PlacementPolicy) -> tuple[object, ...] | None:
    """What a search for `head` reads of the fabric besides the state: None where it reads nothing
    (no fabric bound, or a head of one pod, placed pod by pod as without one); else the fabric view
    (by identity) and its version (bumped on every change of its links or of the gangs on them), the
    pool's default constraint, and the scheduler's estimates of the head's run time and
    communication, which a gang's placement weighs."""
    context = policy.topology
    if context is None or len(head.pods) < 2:
        return None
    return (context.view, context.view.version, context.default, context.estimate_s(head),
            context.comm_ratio(head))


def _same_reads(kept: tuple[object, ...] | None, now: tuple[object, ...] | None) -> bool:
    """`_fabric_reads` equal: the same view object, the rest equal."""
    if kept is None or now is None:
        return kept is now
    return kept[0] is now[0] and kept[1:] == now[1:]


def _note_hint(view: ClusterView, slot: str, head: Workload, found: Reservation | None) -> None:
    """Keep the head's reserved start: the next search for it looks there first (`search_hints`)."""
    if found is None:
        view.reserve_hints.pop(slot, None)
    else:
        view.reserve_hints[slot] = (head.id, found.start_s)


def _allowed_milli(run: Running, allowed: BoolArray) -> int:
    return sum(
        m for _, a in run.allocs for d, m in zip(a.devices, a.device_milli, strict=True) if allowed[a.node, d]
    )


def may_backfill(
    gang: GangPlacement,
    estimate_s: float | None,
    reservation: Reservation,
    now_s: float,
    policy: PlacementPolicy,
    rng: random.Random,
) -> bool:
    """Whether a candidate already placed in the live state may start without delaying the head.

    On True the candidate also holds its resources in the shadow state (when it outlasts the
    reservation); on False the shadow state is unchanged.
    """
    if estimate_s is not None and now_s + estimate_s <= reservation.start_s:
        return True
    shadow = reservation.shadow
    statement = shadow.statement()
    for _, record in gang.allocs:
        statement.allocate(record)
    domain = reservation.domain
    if domain is not None and not any(domain[record.node] for _, record in gang.allocs):
        statement.commit()  # the head's domain is untouched: it still fits there
        return True
    fits_on = reservation.fits_on
    if fits_on is not None and not any(fits_on[record.node] for _, record in gang.allocs):
        statement.commit()  # the nodes of the head's placement are untouched: it still fits there
        return True
    head = place_gang(reservation.head, shadow, policy, rng)
    if isinstance(head, NoFit):
        statement.discard()
        return False
    release_gang(head, shadow)
    narrow = reservation.narrow
    if narrow is not None and len(np.unique(narrow[list(head.nodes)])) > 1:
        statement.discard()  # the head would still fit, but only spread wider than reserved
        return False
    statement.commit()
    reservation.fits_on = nodes_mask(head, shadow)
    return True


def nodes_mask(gang: GangPlacement, state: ClusterState) -> BoolArray:
    """[node] the nodes a placement uses."""
    mask = np.zeros(len(state.nodes), dtype=bool)
    mask[list(gang.nodes)] = True
    return mask


def _allowed(w: Workload, state: ClusterState) -> BoolArray:
    labels = shared_labels(w.pods)
    if any(not p.allowed_models for p in w.pods if p.num_devices):
        return state.allowed_devices(frozenset(), labels)
    return state.allowed_devices(frozenset().union(*(p.allowed_models for p in w.pods)), labels)


@dataclass(slots=True)
class EstimateError:
    """Running totals of the estimator's error over finished workloads that had an estimate."""

    count: int = 0
    abs_error_s: float = 0.0
    abs_rel_error: float = 0.0
    under: int = 0

    def add(self, estimate_s: float, actual_s: float) -> None:
        self.count += 1
        self.abs_error_s += abs(estimate_s - actual_s)
        self.abs_rel_error += abs(estimate_s - actual_s) / max(actual_s, 1.0)
        self.under += estimate_s < actual_s

    def summary(self) -> dict[str, float]:
        n = max(self.count, 1)
        return {
            "estimated": self.count,
            "mean_abs_error_s": self.abs_error_s / n,
            "mean_abs_rel_error": self.abs_rel_error / n,
            "underestimated_pct": 100.0 * self.under / n,
        }


history_by: Literal["shape", "tenant"] = "shape"
"""Where history estimates come from: "shape", the runs of the same tenant, queue and shape (and
name, when known); "tenant", the older reckoning: the same (tenant, name), else the tenant's runs,
else all runs (kept to measure what the change does: `bench/replay_philly.py --estimates`)."""


def history_key(w: Workload) -> tuple[str, str, Shape]:
    """What history estimates are kept by: (tenant, queue, shape)."""
    return (w.tenant, w.queue, shape_of(w))


@dataclass(slots=True)
class RuntimeEstimator:
    """Run-time history per (tenant, queue, shape), with and without the workload's name; the
    user's estimate wins (the module docstring)."""

    by_key: dict[tuple[str, str, Shape], tuple[int, float]] = field(default_factory=dict)
    by_key_name: dict[tuple[tuple[str, str, Shape], str], tuple[int, float]] = field(default_factory=dict)
    by_name: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    by_tenant: dict[str, tuple[int, float]] = field(default_factory=dict)
    overall: tuple[int, float] = (0, 0.0)
    user_error: EstimateError = field(default_factory=EstimateError)
    history_error: EstimateError = field(default_factory=EstimateError)

    def estimate_s(self, w: Workload) -> float | None:
        """The user's estimate, else the history mean (`history_s`), else None."""
        if w.runtime_estimate_s is not None:
            return w.runtime_estimate_s
        return self.history_s(w)

    def history_s(self, w: Workload) -> float | None:
        """The mean run time of earlier runs of the same tenant, queue, shape and name, else of the
        same tenant, queue and shape; None: no such run finished yet (`history_by`)."""
        candidates: tuple[tuple[int, float] | None, ...]
        if history_by == "shape":
            key = history_key(w)
            candidates = (self.by_key_name.get((key, w.name)) if w.name else None, self.by_key.get(key))
        else:
            candidates = (
                self.by_name.get((w.tenant, w.name)) if w.name else None,
                self.by_tenant.get(w.tenant),
                self.overall if self.overall[0] else None,
            )
        for found in candidates:
            if found is not None:
                return found[1] / found[0]
        return None

    def observe(self, w: Workload, actual_s: float, estimate_used_s: float | None) -> None:
        """A workload finished after `actual_s` of run time; record it and the error of its estimate."""
        if estimate_used_s is not None:
            target = self.user_error if w.runtime_estimate_s is not None else self.history_error
            target.add(estimate_used_s, actual_s)
        key = history_key(w)
        n, total = self.by_key.get(key, (0, 0.0))
        self.by_key[key] = (n + 1, total + actual_s)
        if w.name:
            n, total = self.by_key_name.get((key, w.name), (0, 0.0))
            self.by_key_name[(key, w.name)] = (n + 1, total + actual_s)
            n, total = self.by_name.get((w.tenant, w.name), (0, 0.0))
            self.by_name[(w.tenant, w.name)] = (n + 1, total + actual_s)
        n, total = self.by_tenant.get(w.tenant, (0, 0.0))
        self.by_tenant[w.tenant] = (n + 1, total + actual_s)
        self.overall = (self.overall[0] + 1, self.overall[1] + actual_s)
