"""A `ClusterView` kept across cycles for a caller that sees the pool as a series of snapshots.

`run_cycle` builds its view from the whole snapshot: every node and every running allocation, on
every cycle. A long-running caller (the server's scheduling loop) sees snapshots that differ from
the previous one by a few finished and started workloads, so `ViewKeeper` keeps the view of the
last cycle, with the decisions that cycle took, and brings it up to date with the next snapshot:

* allocations the view holds that the snapshot no longer has are given back (finished,
  cancelled, or an admission the caller did not carry out);
* allocations the snapshot has that the view does not hold (or holds with other placements) are
  taken;
* a node or device that broke or was repaired is applied to the kept view as the replay applies
  it (`mark_unhealthy` / `mark_healthy`), so its work is evicted by the next cycle;
* any other change of nodes (added, removed, resized, cordoned), of the quota configuration or
  of the priority classes builds the view afresh, as `run_cycle` would;
* a change of a running workload's `WorkloadInfo` (progress, estimate) rebuilds its record.

So a cycle costs work proportional to what changed plus the walk over the pending workloads, not
to the size of the pool. The decisions are those `run_cycle` takes on the same snapshot, except
that the placement policy's estimate of the workload mix (`prepare`) is drawn from every
workload seen, as in the replay, not only from those of this snapshot, and that an admission
the next snapshot shows with the same placements keeps the cycle's time as its start.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from copy import copy
from dataclasses import replace
from itertools import compress, filterfalse, repeat
from operator import attrgetter, is_not, not_
from typing import Any

import numpy as np

from gpupool.core.fabric.model import Fabric
from gpupool.core.model import Allocation, AllocationChanges, ClusterSnapshot, Node, PodPlacement, Workload
from gpupool.core.priority import PriorityClasses
from gpupool.core.quota import QuotaConfig
from gpupool.core.scheduling.cycle import (
    Admit,
    CycleResult,
    EventKind,
    Policies,
    Refuse,
    Reserve,
    Stop,
    Wait,
    cycle_on,
    unhandled,
)
from gpupool.core.scheduling.topology import FabricView, topology_for
from gpupool.core.scheduling.view import ClusterView

_workload_id = attrgetter("workload.id")

PRUNE_SLACK = 4096
"""Per-workload caches are trimmed to the live workloads once they hold this many more."""


_KEPT = ("congestion_sample", "congested_since", "moves_tried", "locality_waits", "locality_caps")
"""What a view keeps across cycles beyond what a snapshot holds, and that a cycle changes."""


class ViewKeeper:
    """Runs cycles on a view kept in step with successive snapshots (see the module docstring)."""

    def __init__(self) -> None:
        self.view: ClusterView | None = None
        self._nodes: tuple[Node, ...] = ()
        self._quota: QuotaConfig | None = None
        self._classes: PriorityClasses | None = None
        self._held: dict[str, Allocation | tuple[PodPlacement, ...]] = {}
        """What the view holds per workload: the snapshot's allocation, or the placements of an
        admission this keeper's last cycle made (until a snapshot shows it). Changed only through
        `_hold` and `_unhold`, which keep `_objs` and `_placed` with it."""
        self._objs: dict[int, Allocation] = {}
        """By `id()`: the allocation objects in `_held` (so a sync finds the snapshot's changes by
        identity, in C, and walks only those in Python)."""
        self._placed: set[str] = set()
        """The workloads `_held` holds as placements (not yet shown by a snapshot)."""
        self._loose: dict[int, Allocation] | None = None
        """By `id()`: the allocations the last snapshot listed that the view does not hold (on
        broken hardware, or stopped by the last cycle); None when not known."""
        self._serial = -1
        """The `AllocationChanges.serial` of the snapshot synced last (-1: none)."""
        self.drifts = 0
        """How many times a caller found the kept view differing from a fresh one (a bug)."""
        self.rebuilds = 0
        """How many times the view was built afresh (the first cycle counts)."""
        self.fabric: Fabric | None = None
        self.topology: FabricView | None = None
        """The view's fabric (`set_fabric`; else from node labels, else None), kept across rebuilds
        while the node names stay the same; the caller updates its link state in place."""
        self._before: dict[str, Any] | None = None
        """What the view kept beyond the snapshot before an undoable cycle (`cycle(undoable=True)`)."""
        self._discarded = False

    def set_fabric(self, fabric: Fabric | None) -> None:
        """Place by `fabric` from now on (None: none known, node labels may still give domains).
        Does not block; the nodes are mapped onto its hosts (InvalidInput when it has too few)."""
        self.fabric = fabric
        self.topology = None
        if self.view is not None:
            self._attach(self.view, self._nodes)

    def _attach(self, view: ClusterView, nodes: Sequence[Node]) -> None:
        if self.topology is None or self.topology.node_names != tuple(n.name for n in nodes):
            self.topology = topology_for(nodes, self.fabric)
        else:
            self.topology.clear_gangs()  # the new view puts its running gangs back
        view.set_topology(self.topology)

    def cycle(
        self,
        snapshot: ClusterSnapshot,
        pending: Sequence[Workload],
        policies: Policies,
        now_s: float,
        rng: random.Random,
        audit: bool = False,
        undoable: bool = False,
    ) -> CycleResult:
        """`run_cycle(snapshot, pending, policies, now_s, rng)` on the kept view; with `audit`, the
        kept view is first checked against one built afresh (see `drifted`); with `undoable`, the
        caller may `discard` the cycle's decisions instead of carrying them out."""
        view = self.sync(snapshot, policies)
        if audit and self.drifted(snapshot, policies):
            self.drifts += 1
            view = self._rebuild(snapshot, policies)
        self._before = {name: copy(getattr(view, name)) for name in _KEPT} if undoable else None
        result = cycle_on(view, pending, policies, now_s, rng)
        decisions = result.decisions
        # waits are most of a cycle's decisions and change nothing held: passed over in C
        for decision in compress(decisions, map(is_not, map(type, decisions), repeat(Wait))):
            listed = self._held.get(decision.workload_id)
            if self._loose is not None and isinstance(listed, Allocation):
                self._loose[id(listed)] = listed  # listed until the caller carries the decision out
            match decision:
                case Stop(kind=EventKind.MOVE):
                    self._hold(decision.workload_id, decision.placements)
                case Stop():
                    self._unhold(decision.workload_id)
                case Admit():
                    self._hold(decision.workload_id, decision.placements)
                case Wait() | Refuse() | Reserve():
                    pass
                case _:
                    unhandled(decision)
        self._prune(view, pending)
        return result

    def discard(self) -> None:
        """Forget the last cycle (made `undoable`): none of its decisions is carried out, so the
        next sync builds the view afresh from the snapshot, with what the view kept beyond the
        snapshot (telemetry's congestion clock, move and locality-wait times) as before that cycle."""
        if self._before is None:
            raise ValueError("Only a cycle run with undoable=True can be discarded.")
        self._discarded = True

    def sync(self, snapshot: ClusterSnapshot, policies: Policies) -> ClusterView:
        """The kept view, brought up to date with `snapshot` (built afresh when it must be)."""
        view = self.view
        health = None if view is None else _health_changes(self._nodes, snapshot.nodes)
        if (
            view is None
            or self._discarded
            or health is None
            or policies.quota != self._quota
            or policies.priority_classes != self._classes
        ):
            return self._rebuild(snapshot, policies)
        view.to_evict.clear()  # reported by the last cycle; the snapshot says whether they still run
        if health:
            self._apply_health(view, health)
            self._nodes = snapshot.nodes
        info, before = snapshot.workload_info, view.info  # the view keeps the last snapshot's
        held = self._held
        allocations = snapshot.allocations
        delta = self._delta(snapshot.changes)
        self._serial = -1 if snapshot.changes is None else snapshot.changes.serial
        plain = False
        changed: list[Allocation] | None
        if delta is not None:  # the caller handed over what started and ended: nothing to find
            changed, gone = delta
        elif (changed := self._new_objects(allocations, ids := set(map(id, allocations)))) is None:
            # an object listed twice, or two listing one workload: the last one counts
            plain = True
            current = dict(zip(map(_workload_id, allocations), allocations, strict=True))
            gone = list(compress(held, map(not_, map(current.__contains__, held))))
            allocations = tuple(current.values())
        else:
            # The allocations the view does not hold as these very objects, found by identity (passes
            # in C over every allocation; only what changed is walked in Python), in snapshot order.
            changed_wids = set(map(_workload_id, changed))
            objs = self._objs
            gone_objs = map(objs.__getitem__, filterfalse(ids.__contains__, objs))
            gone = sorted((set(map(_workload_id, gone_objs)) | self._placed) - changed_wids)
        for wid in gone:  # held, and the snapshot no longer has it
            self._unhold(wid)
            view.remove(wid)
        if info or before:  # a running workload whose info changed gets its record rebuilt
            rebuilt = [w for w in set(info) | set(before) if info.get(w) is not before.get(w) and w in held]
            for wid in rebuilt:
                self._unhold(wid)
                view.remove(wid)
            if rebuilt:
                changed = None  # taken again from the snapshot, in its order, below
        view.info = dict(info)
        if changed is None:
            # every allocation the view does not hold as this very object (the plain definition)
            changed = list(compress(allocations, map(is_not, map(held.get, map(_workload_id, allocations)),
                                                     allocations)))
        for alloc in changed:  # those the view does not hold as this very allocation
            wid = alloc.workload.id
            mine = held.get(wid)
            if mine is not None:
                same = mine == alloc if isinstance(mine, Allocation) else mine == alloc.placements
                if same:
                    self._hold(wid, alloc)
                    continue
                self._unhold(wid)
                view.remove(wid)
            if view.add_allocation(alloc):
                self._hold(wid, alloc)
        # (changed: every listed allocation not held as this object before the walk above)
        self._loose = None if plain else {id(a): a for a in changed if held.get(a.workload.id) is not a}
        return view

    def _delta(self, changes: AllocationChanges | None) -> tuple[list[Allocation], list[str]] | None:
        """What to take and what to give back, read from `changes` (the allocations not held as these
        objects, in snapshot order; the workloads held that the snapshot no longer lists); None when
        they do not follow the snapshot synced last, or leave listed an allocation not held."""
        loose = self._loose
        if changes is None or changes.serial != self._serial + 1 or loose is None:
            return None
        ended = {id(a): a for a in changes.ended}
        if not loose.keys() <= ended.keys():
            return None  # listed, not held, not ended: taken as the plain definition takes it
        objs, held = self._objs, self._held
        changed = list(changes.started)
        wids = set(map(_workload_id, changed))
        if len(wids) != len(changed) or any(id(h) in objs and id(h) not in ended
                                            for h in map(held.get, wids)):
            return None  # (two listing one workload, or one started that was listed already)
        gone = {a.workload.id for a in ended.values() if id(a) in objs} | self._placed
        return changed, sorted(gone - wids)

    def _new_objects(self, allocations: Sequence[Allocation], ids: set[int]) -> list[Allocation] | None:
        """The allocations not held as these objects (`ids`: theirs), in their order; None when an
        object is listed twice or two list one workload (then the caller takes the plain definition)."""
        if len(ids) != len(allocations):
            return None
        objs, held = self._objs, self._held
        new = ids.difference(objs)
        if not new:
            return []
        tail = allocations[len(allocations) - len(new):]  # what started last usually comes last
        found = list(tail) if all(id(a) in new for a in tail) else [a for a in allocations if id(a) in new]
        wids = set(map(_workload_id, found))
        if len(wids) != len(found) or any(id(held.get(wid)) in ids for wid in wids):
            return None  # (a workload's held allocation is listed beside a new one)
        return found

    def _hold(self, wid: str, value: Allocation | tuple[PodPlacement, ...]) -> None:
        self._unhold(wid)
        self._held[wid] = value
        if isinstance(value, Allocation):
            self._objs[id(value)] = value
        else:
            self._placed.add(wid)

    def _unhold(self, wid: str) -> None:
        old = self._held.pop(wid, None)
        if isinstance(old, Allocation):
            del self._objs[id(old)]
        elif old is not None:
            self._placed.discard(wid)

    def drifted(self, snapshot: ClusterSnapshot, policies: Policies) -> bool:
        """Whether the kept view (just synced with `snapshot`) holds other free capacity than a
        view built afresh from it: never, unless there is a bug; a caller audits now and then."""
        kept = self.view
        if kept is None:
            return False
        p = policies
        fresh = ClusterView.from_snapshot(snapshot, p.quota, p.priority_classes, p.defaults)
        if not np.array_equal(kept.state.schedulable, fresh.state.schedulable):
            return True
        # A node that is down takes nothing in either (`mark_unhealthy` also zeroes its devices,
        # a fresh view only marks it): compare the nodes that can take work.
        up = fresh.state.schedulable
        return any(not np.array_equal(getattr(kept.state, name)[up], getattr(fresh.state, name)[up])
                   for name in ("cpu_free", "mem_free", "dev_milli_free", "dev_mem_free"))

    def _apply_health(self, view: ClusterView, changes: Sequence[tuple[Node, Node]]) -> None:
        """Nodes or devices that broke or were repaired, applied to the kept view as the replay
        applies them (`mark_unhealthy`, `mark_healthy`): the work on broken hardware is evicted by
        the next cycle, and the view (with the placement policy's estimate of the workload mix)
        lives on, so the server decides as the replay does."""
        state = view.state
        for before, after in changes:
            i = state.node_index[after.name]
            nodes = list(state.nodes)
            nodes[i] = after
            state.nodes = tuple(nodes)
            healed = (after.healthy and not before.healthy) or any(
                b.healthy and not a.healthy for a, b in zip(before.devices, after.devices, strict=True))
            if healed:
                view.mark_healthy(after.name)  # every device the node now reports healthy
                if not after.healthy:
                    view.mark_unhealthy(after.name)
                continue
            if before.healthy and not after.healthy:
                view.mark_unhealthy(after.name)
                continue
            for a, b in zip(before.devices, after.devices, strict=True):
                if a.healthy and not b.healthy:
                    view.mark_unhealthy(after.name, b.index)
        # the evicted stay in `_held` until the cycle reports them (so this sync does not take
        # their allocations, which the snapshot still shows, back onto the broken hardware)

    def _rebuild(self, snapshot: ClusterSnapshot, policies: Policies) -> ClusterView:
        p = policies
        old = self.view
        view = ClusterView.from_snapshot(snapshot, p.quota, p.priority_classes, p.defaults)
        if self._discarded and self._before is not None:  # as before the discarded cycle
            for name, value in self._before.items():
                setattr(view, name, value)
        elif old is not None:  # telemetry's clock outlives a rebuild (the snapshot does not hold it)
            view.congestion_sample, view.congested_since = old.congestion_sample, old.congested_since
        self._discarded, self._before = False, None
        evicted = {run.workload.id for run in view.to_evict}
        self._attach(view, snapshot.nodes)
        self.view = view
        self._nodes = snapshot.nodes
        self._quota = policies.quota
        self._classes = policies.priority_classes
        self._held = {a.workload.id: a for a in snapshot.allocations if a.workload.id not in evicted}
        self._objs = {id(a): a for a in self._held.values() if isinstance(a, Allocation)}
        self._placed = set()
        self._loose = None
        self._serial = -1 if snapshot.changes is None else snapshot.changes.serial
        self.rebuilds += 1
        return view

    def _prune(self, view: ClusterView, pending: Sequence[Workload]) -> None:
        """Forget per-workload caches of work neither pending nor held, once they have grown."""
        live = len(pending) + len(self._held)
        if len(view.metas) <= live + PRUNE_SLACK and len(view.policies.seen) <= live + PRUNE_SLACK:
            return
        keep = {w.id for w in pending} | set(self._held)
        view.forget_workloads_except(keep)


def _health_changes(before: Sequence[Node], after: Sequence[Node]) -> list[tuple[Node, Node]] | None:
    """The nodes whose health (of the node or of its devices) is all that changed between two
    snapshots; None when anything else changed (nodes added, removed, resized or cordoned)."""
    if len(before) != len(after):
        return None
    changed = []
    for a, b in zip(before, after, strict=True):
        if a is b or a == b:
            continue
        if _all_healthy(a) != _all_healthy(b):
            return None
        changed.append((a, b))
    return changed


def _all_healthy(node: Node) -> Node:
    return replace(node, healthy=True, devices=tuple(replace(d, healthy=True) for d in node.devices))
