"""Victims of a search taken off the state and put back, in bulk, and where a pod fits meanwhile.

The victim search (`preemption.py`) tries placements on states with some running work taken off;
these helpers make those states as `ClusterView.detach`/`attach` one run at a time would, and
track without rescanning every node whether the preemptor's first pod fits some node of them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Iterable, Sequence
from itertools import compress

import numpy as np

from gpupool.core.model import PodRequest
from gpupool.core.quota import Usage
from gpupool.core.scheduling.view import ClusterView, Running
from gpupool.core.state import (
    ClusterState,
    FreeAmounts,
    PodAlloc,
    allocate_many,
    release_many,
    restore_free,
    row_counts,
    shift_free,
    shift_pod_kinds,
)
from gpupool.core.units import MILLI


class Detached:
    """Victims of a greedy search: those taken off the state, and those taken but not yet off it."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self.done: list[Running] = []
        self.pending: list[Running] = []

    def flush(self, rows: Collection[int] | None = None) -> None:
        """Take the pending victims off the state and their queues, as `view.detach` one by one would;
        with `rows`, only those holding something on one of those nodes (the others stay pending:
        the state at those nodes is then as with every victim off)."""
        if rows is not None:
            on = set(rows)
            take = [run for run in self.pending  # (most runs are one pod: read without a generator)
                    if (run.allocs[0][1].node in on if len(run.allocs) == 1
                        else any(a.node in on for _, a in run.allocs))]
            if take and len(take) < len(self.pending):
                detach_all(self.view, take)
                self.done += take
                gone = set(map(id, take))
                self.pending = [run for run in self.pending if id(run) not in gone]
                return
            if not take:
                return
        if self.pending:
            detach_all(self.view, self.pending)
            self.done += self.pending
            self.pending = []

    def flush_all(self, rows: Collection[int] | None = None) -> None:
        """`flush()`, whatever the rows."""
        self.flush()

    def restore(self) -> None:
        attach_all(self.view, self.done)
        self.done = []
        self.pending = []


def detach_all(view: ClusterView, runs: Sequence[Running]) -> None:
    """`view.detach` of every run, in one step: the same free capacity and quota usage after it."""
    if len(runs) == 1:
        view.detach(runs[0])
        return
    release_many(view.state, [record for run in runs for _, record in run.allocs])
    for cq, usage in usage_by_queue(runs, view.quota.queues).items():
        view.quota.remove(cq, usage)


def attach_all(view: ClusterView, runs: Sequence[Running]) -> None:
    """`view.attach` of every run, in one step."""
    if len(runs) == 1:
        view.attach(runs[0])
        return
    records = [record for run in runs for _, record in run.allocs]
    if len(records) > _BULK:
        allocate_many(view.state, records)
    else:
        for record in records:
            view.state.allocate(record)
    for cq, usage in usage_by_queue(runs, view.quota.queues).items():
        view.quota.add(cq, usage)


def attach_back(view: ClusterView, runs: Sequence[Running], base: FreeAmounts, held: Sequence[Running]
                ) -> None:
    """`attach_all(view, runs)` where the state's free amounts were `base` and then exactly `runs`
    and `held` were taken off: the free amounts are set back to `base` and `held` is taken off again
    (few records, when most victims go back), the rest as `allocate_many` does it."""
    state = view.state
    restore_free(state, base)
    shift_free(state, [record for run in held for _, record in run.allocs], 1)
    records = [record for run in runs for _, record in run.allocs]
    np.add.at(state.node_version, [r.node for r in records], 1)
    shift_pod_kinds(state, records, 1)
    for cq, usage in usage_by_queue(runs, view.quota.queues).items():
        view.quota.add(cq, usage)


_BULK = 16
"""Above this many records, attaching checks the whole state once instead of each record (at 58
records, what a search's victims apart from its placement number, 75 against 185 microseconds)."""


def usage_by_queue(runs: Iterable[Running], queues: Container[str]) -> dict[str, Usage]:
    """The runs' quota usage summed per ClusterQueue with a quota (integers: the same totals in any
    order; a queue without one keeps no usage)."""
    total: dict[str, Usage] = {}
    for run in runs:
        cq = run.cluster_queue
        usage = total.get(cq)
        if usage is None:
            if cq not in queues:
                continue
            usage = total[cq] = {}
        for r, amount in run.usage.items():
            usage[r] = usage.get(r, 0) + amount
    return total


def _nothing(rows: Collection[int] | None = None) -> None:
    """No victim waits to be taken off the state."""


class FirstPodFits:
    """Whether a pod fits some node of a state that only gains free capacity (victims freed).

    `state.node_fits(pod).any()` without scanning every node each time: if no node fits it before
    any victim is freed, only the nodes victims were freed from can change that answer, and once
    one fits it stays so (freeing capacity never makes a pod fit less). Each node is first held to a
    bound (its free cpu and memory, plus what the victims freed there, must cover the pod's, and
    enough devices of the models it accepts must have the milli of one share free): only a node
    within the bound is checked on the state, after `flush` has taken the victims off it. The bound
    reads a node's free capacity when a victim is first freed there, so `freed` must be told of a
    victim before it leaves the state.
    """

    def __init__(self, state: ClusterState, pod: PodRequest) -> None:
        self.state = state
        self.pod = pod
        self.base: bool | None = None
        """Whether the pod fits some node before any victim is freed (scanned once, when first asked)."""
        self.known: bool | None = None
        self.touched: set[int] = set()
        self.flush: Callable[[Collection[int] | None], None] = _nothing
        self.cpu = state.cpu_need(pod)
        self.mem = state.mem_need(pod)
        self.share = min(pod.device_milli, MILLI)
        """The free milli a device needs to take one of the pod's shares (whole: all of it)."""
        self.allowed = state.allowed_devices(pod.allowed_models, pod.node_labels) if pod.num_devices else None
        self._base: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None] | None = None
        """Every node's slacks on the state before any victim is freed (see `_slacks`)."""
        self.free: dict[int, list[int]] = {}
        """Per node touched, once the victims are freed: [free cpu less the pod's, free memory less
        the pod's, devices with a share free less the pod's devices, free milli of each device]; the
        node is within the bound when the first three are all >= 0 (see `_add`)."""
        self.later: dict[int, list[PodAlloc]] = {}
        """Per node, the records of victims freed by `resume` that `free` does not count yet: added
        when a later victim first touches the node (until then it is known not to hold the pod)."""

    def start(self, flush: Callable[[Collection[int] | None], None] = _nothing) -> None:
        """A new sequence of victims on the base state; `flush(rows)` takes those told of off the
        state (at least those holding something on `rows`; None: all of them)."""
        self.known = None
        self.touched.clear()
        self.free.clear()
        self.later = {}
        self._base = None
        self.flush = flush

    def resume(self, prefix: Sequence[Running], changed: Callable[[list[int]], np.ndarray]) -> bool:
        """After `start`: the victims of `prefix` are freed at once, without a bound per victim,
        where a walk over them on an earlier state found that the pod fits no node once they are all
        freed, and `changed(rows)` marks which of those nodes' free amounts differ from that state's
        (a node where a victim of the walk has left since, its amounts the same, frees less: it fits
        the pod no more than then). Checks that the pod fits no node here
        either: not before any victim, and on no changed node the prefix frees from (by the bound).
        False: it may, and nothing was told (walk the victims one by one)."""
        if self.fits_alone():
            return False
        later: dict[int, list[PodAlloc]] = {}
        for run in prefix:
            for _, a in run.allocs:
                on = later.get(a.node)
                if on is None:
                    later[a.node] = [a]
                else:
                    on.append(a)
        self._base = self._slacks()  # (read before any victim leaves the state, as `_add` reads it)
        self.later = later
        rows = list(later)
        for n in compress(rows, changed(rows)):
            amounts = self._open(n)
            if amounts[0] >= 0 and amounts[1] >= 0 and amounts[2] >= 0:
                self.free.clear()
                self.later = {}
                return False
        self.known = False
        return True

    def _open(self, n: int) -> list[int]:
        """Node n's amounts in `free` as `_slacks` starts them, with the records `resume` left."""
        assert self._base is not None
        cpu, mem, ready, devices = self._base
        amounts = self.free[n] = [int(cpu[n]), int(mem[n]), int(ready[n])]
        if devices is not None:
            amounts += devices[n].tolist()
        share = self.share
        for a in self.later.pop(n, ()):
            _give_back(amounts, a, share)
        return amounts

    def fits_alone(self) -> bool:
        if self.base is None:
            self.base = bool(self.state.node_fits(self.pod).any())
        return self.base

    def fits_with(self, run: Running) -> bool:
        """Whether the pod fits some node once `run` alone is freed from the base state."""
        if self.fits_alone():
            return True
        free: dict[int, list[int]] = {}
        self._add(run, free)
        rows = [n for n, a in free.items() if a[0] >= 0 and a[1] >= 0 and a[2] >= 0]
        if not rows:
            return False
        state = self.state
        for _, record in reversed(run.allocs):
            state.release(record)
        fits = state.node_fits_at(self.pod, rows)
        for _, record in run.allocs:
            state.allocate(record)
        return fits

    def freed(self, run: Running) -> None:
        """`run` is freed (or about to be: see the class docstring)."""
        if self.known is not True:
            self._add(run, self.free, self.touched)

    def fits_somewhere(self) -> bool:
        if self.known is None:
            self.known = self.fits_alone()
        if not self.known and self.touched:
            free = self.free
            rows = [n for n in self.touched if (a := free[n])[0] >= 0 and a[1] >= 0 and a[2] >= 0]
            if rows:
                self.flush(rows)  # (the rows read below: as with every victim off)
                self.known = self.state.node_fits_at(self.pod, rows)
        self.touched.clear()
        return self.known

    def sole_candidate(self) -> int | None:
        """The one node within the bound once the victims told of are freed, where the pod fitted no
        node before them and exactly one is (then the pod fits that node alone, `fits_somewhere`
        having found it fits some node); else None."""
        if self.base is not False:
            return None
        found = None
        for n, a in self.free.items():
            if a[0] >= 0 and a[1] >= 0 and a[2] >= 0:
                if found is not None:
                    return None
                found = n
        return found

    def _slacks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Every node's amounts as `_add` starts them, read from the state in one step: cpu and
        memory free less the pod's (an unschedulable node's cpu slack no victim can fill), devices
        with a share free less the pod's devices, and each device's free milli (_REFUSED: a model
        the pod refuses). Read before any victim is freed: a node's values are used only when a
        victim is first freed there, and until then nothing has changed on it."""
        state = self.state
        usable = state.schedulable
        if self.pod.node_labels:
            usable = usable & state.labelled(self.pod.node_labels)
        cpu = np.where(usable, state.cpu_free - self.cpu, _REFUSED)
        mem = state.mem_free - self.mem
        if self.allowed is None:
            return cpu, mem, np.zeros(len(cpu), dtype=np.int64), None
        devices = np.where(self.allowed, state.dev_milli_free, _REFUSED)
        ready = row_counts(devices >= self.share) - self.pod.num_devices
        return cpu, mem, ready, devices

    def _add(self, run: Running, free: dict[int, list[int]], touched: set[int] | None = None) -> None:
        """Add what `run` holds to the free amounts per node (see `_slacks` for where they start).

        The amounts are kept as slacks against the pod's need, so the bound is three comparisons
        (`_within`); a device is counted as having a share free when its free milli crosses it.
        The nodes are added to `touched` when given.
        """
        share = self.share
        for _, a in run.allocs:
            n = a.node
            if touched is not None:
                touched.add(n)
            amounts = free.get(n)
            if amounts is None:
                if self._base is None:
                    self._base = self._slacks()
                if free is self.free and n in self.later:
                    amounts = self._open(n)
                else:
                    cpu, mem, ready, devices = self._base
                    amounts = free[n] = [int(cpu[n]), int(mem[n]), int(ready[n])]
                    if devices is not None:
                        amounts += devices[n].tolist()
            _give_back(amounts, a, share)

    def _within(self, n: int, amounts: list[int]) -> bool:
        """Whether the node's free amounts (see `_add`) may hold the pod: a necessary condition."""
        return amounts[0] >= 0 and amounts[1] >= 0 and amounts[2] >= 0


_REFUSED = -(1 << 62)
"""The free milli a bound gives a device of a model the pod refuses (never enough)."""


def _give_back(amounts: list[int], a: PodAlloc, share: int) -> None:
    """Add an allocation to a node's free amounts ([cpu, memory, devices with `share` free, each
    device's free milli...]): a device is counted once its free milli crosses the share."""
    amounts[0] += a.cpu_milli
    amounts[1] += a.memory_mib
    if len(amounts) > 3:
        for d, milli in zip(a.devices, a.device_milli, strict=True):
            was = amounts[3 + d]
            amounts[3 + d] = was + milli
            if was < share <= was + milli:
                amounts[2] += 1


def node_fits_at(state: ClusterState, pod: PodRequest, rows: Iterable[int]) -> bool:
    """`state.node_fits(pod)[rows].any()`, computed on those nodes only (with the slice defaults)."""
    return state.node_fits_at(pod, rows)


class PutBack:
    """Victims put back on the state while the chosen set is trimmed, and where the first pod fits.

    With `watch`, the nodes where the pod fits are scanned once, before the first victim goes
    back; putting victims back only takes capacity from their own nodes, so only those are checked
    again. A placement tried when the pod fits no node returns NoFit without a draw from the rng,
    so a caller may skip it (where the policy does not count its calls).
    """

    def __init__(self, view: ClusterView, pod: PodRequest, watch: bool,
                 only: Sequence[int] | None = None, base: FreeAmounts | None = None) -> None:
        self.view = view
        self.pod = pod
        self.watch = watch
        self.only = only
        """When known, the only nodes the pod may fit when the first victim goes back (the nodes the
        victims were freed from, where it fitted no node before): the first scan reads those alone."""
        self.fitting: np.ndarray | None = None
        self.base: FreeAmounts | None = base
        """The free amounts before any victim of the search went (see `attach`)."""
        self.last: list[Running] = []
        self.saved: dict[int, bool] = {}

    def attach(self, runs: list[Running], held: Sequence[Running] | None = None) -> bool:
        """Put `runs` back; whether the pod may still fit (False: it fits no node). `held`: the
        other victims off the state, when `base` holds the free amounts before all of them went."""
        state = self.view.state
        if self.watch and self.fitting is None:
            if self.only is None:
                self.fitting = state.node_fits(self.pod)
            else:
                self.fitting = np.zeros(len(state.nodes), dtype=bool)
                if self.only:
                    self.fitting[self.only] = state.node_fits_rows(self.pod, self.only)
        if held is not None and self.base is not None and len(runs) > _BULK:
            attach_back(self.view, runs, self.base, held)
        else:
            attach_all(self.view, runs)
        self.last = runs
        fitting = self.fitting
        if fitting is None:
            return True
        saved = self.saved = {}
        check = []
        for run in runs:
            for _, a in run.allocs:
                n = a.node
                if n not in saved:
                    saved[n] = was = bool(fitting[n])
                    if was:
                        check.append(n)
        if check:  # every node the pod fitted that took capacity back, checked in one step
            fitting[check] = state.node_fits_rows(self.pod, check)
        return bool(fitting.any())

    def undo(self) -> None:
        """Take the runs put back last off the state again: the pod fits where it did before."""
        detach_all(self.view, self.last)
        if self.fitting is not None:
            for n, was in self.saved.items():
                self.fitting[n] = was
