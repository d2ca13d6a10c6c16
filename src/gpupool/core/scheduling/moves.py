"""Locality by moving running work: a spread gang is moved into one leaf, single-node work makes room.

On a saturated pool a gang rarely finds a leaf with room when it starts (the nodes that free up
lie in several leaves), so it starts spread and runs slower for the whole of its run, hours or
days. But most of a leaf is usually held by single-node work, which runs as fast anywhere. Gandiva
(OSDI'18) moves jobs to improve locality; this module does the same for gangs, deterministically,
once per cycle, before anything is admitted:

for each running multi-pod gang spread over several leaves (its longest estimated remaining run
first; each gang looked at again only `retry_s` after the last look), each leaf that holds some of
its nodes (most first) is tried: on a copy of the pool, the gang's own resources are released, then
the single-node work of the leaf's other nodes, node by node (the least occupied first; only nodes
without multi-pod work, only work that is preemptible and checkpoints, and that was moved fewer than
`max_moves_each` times and not within its last checkpoint interval), until the gang fits inside
the leaf (pod by pod, as the policy places pods); the released work is then placed again wherever
the policy puts it (usually the nodes the gang left). The move is taken when every moved workload
found a place, at most `max_moved` single-node workloads move, and the gang's expected gain
exceeds the cost of the move by `min_gain`:

  gain = its estimated remaining run x (its slowdown spread - its slowdown in the leaf) x its GPUs,
         the slowdowns from the policy's `comm_cost.CommModel` for the job (`locality.job_comm`,
         as wait-or-spread's loss; the gang's own flows on the host links it keeps counted once);
  cost = for every moved workload, (the work since its last checkpoint + `restart_s`) x its GPUs.

A move is carried out like a preemption whose workloads restart at once at the chosen placements:
each checkpoints (the work since its last checkpoint is lost, as for a preemption) and restarts on
its new nodes. The view is updated in place (the moved workloads removed and admitted again, with
the progress they keep); the caller (the replay) restarts them.

API: `MoveRule`, `Move`, `plan_moves(view, policy, now_s, rng, rule) -> list[Move]`.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.model import PodPlacement, Workload, WorkloadInfo
from gpupool.core.scheduling.domains import only
from gpupool.core.scheduling.gang import GangPlacement, place_pods
from gpupool.core.scheduling.locality import job_comm
from gpupool.core.scheduling.policies.base import PlacementPolicy
from gpupool.core.scheduling.preemption import lost_work_s
from gpupool.core.scheduling.topology import FabricView
from gpupool.core.scheduling.view import ClusterView, Running
from gpupool.core.state import ClusterState, clone_state, release_many
from gpupool.core.topology_spec import Tier
from gpupool.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class MoveRule:
    """When a spread gang is moved into a leaf (the module docstring)."""

    restart_s: float = 300.0
    """Run time a moved workload spends restarting (loading its checkpoint), on its devices."""
    max_moved: int = 8
    """At most this many single-node workloads move to make room for one gang."""
    retry_s: float = 600.0
    """A gang looked at and not moved is looked at again after this long."""
    min_gain: float = 1.0
    """Move only when the gain exceeds the cost x this."""
    max_moves_each: int = 2
    """A workload is moved at most this many times in all (as the gang or to make room for one),
    and at most once per its own checkpoint interval: what one job pays for others' locality is
    bounded, whatever the gangs' estimates claim."""

    def __post_init__(self) -> None:
        for name in ("restart_s", "retry_s"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise InvalidInput(
                    f"The move rule's {name} must be a finite number of seconds >= 0, got {value}.")
        if self.max_moved < 0:
            raise InvalidInput(f"The move rule's max_moved must be >= 0, got {self.max_moved}.")
        if self.max_moves_each < 1:
            raise InvalidInput(f"The move rule's max_moves_each must be >= 1 (leave topology moves off "
                               f"to move nothing), got {self.max_moves_each}.")
        if not 0 < self.min_gain < math.inf:
            raise InvalidInput(f"The move rule's min_gain must be a finite number > 0, got {self.min_gain}.")


@dataclass(frozen=True, slots=True)
class Move:
    """A running workload restarted at once on new nodes: the gang moved into a leaf (`gang_id` is
    itself), or single-node work moved to make room for it."""

    workload_id: str
    gang_id: str
    placements: tuple[PodPlacement, ...]
    resume_progress_s: float
    """Work kept (its last checkpoint); the restart resumes from it."""
    lost_work_s: float
    """Run time since that checkpoint, done again."""


def plan_moves(
    view: ClusterView, policy: PlacementPolicy, now_s: float, rng: random.Random, rule: MoveRule,
) -> list[Move]:
    """The moves of this cycle, already applied to `view` (see the module docstring)."""
    topology = view.topology
    if topology is None or not topology.fabric_known or policy.topology is None:
        return []
    view.materialize()
    ids = topology.domain_of(Tier.LEAF)
    tried = view.moves_tried
    for wid in [w for w in tried if w not in view.running]:
        del tried[wid]
    due: list[tuple[float, str]] = []
    for wid, run in view.running.items():
        if len(run.workload.pods) < 2 or now_s - tried.get(wid, -math.inf) < rule.retry_s:
            continue
        nodes = {a.node for _, a in run.allocs}
        leaves = {int(ids[n]) for n in nodes}
        if len(leaves) < 2 or min(leaves) < 0 or not _movable(view, run, now_s, rule):
            continue
        remaining = _remaining_s(run, now_s)
        if remaining is not None and remaining > 0:
            due.append((-remaining, wid))
    moves: list[Move] = []
    for _, wid in sorted(due):
        tried[wid] = now_s
        found = _plan_one(view, policy, topology, ids, view.running[wid], now_s, rng, rule)
        if found is not None:
            moves.extend(_apply(view, found, wid, now_s))
    return moves


def _movable(view: ClusterView, run: Running, now_s: float, rule: MoveRule) -> bool:
    """Preemptible work that checkpoints, moved fewer than `max_moves_each` times and not within
    its last checkpoint interval."""
    interval = run.workload.checkpoint_interval_s
    if not (run.preemptible and interval):
        return False
    info = view.info.get(run.workload.id)
    if info is None or not info.moves:
        return True
    recent = info.moved_s is not None and now_s - info.moved_s < interval
    return info.moves < rule.max_moves_each and not recent


def _remaining_s(run: Running, now_s: float) -> float | None:
    if run.estimate_s is None:
        return None
    return run.estimate_s - (run.progress_s + max(0.0, now_s - run.start_time_s))


def _single_node_work(view: ClusterView, gang_id: str) -> tuple[dict[int, list[Running]], set[int]]:
    """[node] the single-node workloads on it, and the nodes some other multi-node workload uses."""
    on_node: dict[int, list[Running]] = {}
    shared: set[int] = set()
    for rid, run in view.running.items():
        if rid == gang_id:
            continue
        nodes = {a.node for _, a in run.allocs}
        if len(nodes) == 1:
            on_node.setdefault(next(iter(nodes)), []).append(run)
        else:
            shared.update(nodes)
    return on_node, shared


def _plan_one(
    view: ClusterView, policy: PlacementPolicy, topology: FabricView, ids: np.ndarray, gang: Running,
    now_s: float, rng: random.Random, rule: MoveRule,
) -> dict[str, GangPlacement] | None:
    """Placements for the gang (inside one leaf) and the work moved for it, or None."""
    w = gang.workload
    own = sorted({a.node for _, a in gang.allocs})
    own_set = set(own)
    counts: dict[int, int] = {}
    for n in own:
        counts[int(ids[n])] = counts.get(int(ids[n]), 0) + 1
    on_node, shared = _single_node_work(view, w.id)
    remaining = _remaining_s(gang, now_s) or 0.0
    comm = job_comm(w, topology, policy)
    spread = comm.slowdown(len(own), topology.share_gbps(own, joining=False), topology.max_hops(own))
    for leaf in sorted(counts, key=lambda k: (-counts[k], k)):
        inside = ids == leaf
        nodes = [int(n) for n in np.flatnonzero(inside) if int(n) not in own_set]
        candidates = [n for n in nodes if n not in shared and bool(view.state.schedulable[n])
                      and all(_movable(view, r, now_s, rule) for r in on_node.get(n, []))]
        candidates.sort(key=lambda n: (sum(r.device_count for r in on_node.get(n, [])), n))
        trial = clone_state(view.state)
        release_many(trial, [record for _, record in gang.allocs])
        moved: list[Running] = []
        placed = _inside(w, trial, policy, rng, inside)
        for n in candidates:
            if placed is not None:
                break
            if len(moved) + len(on_node.get(n, [])) > rule.max_moved:
                break
            for run in on_node.get(n, []):
                release_many(trial, [record for _, record in run.allocs])
                moved.append(run)
            placed = _inside(w, trial, policy, rng, inside)
        if placed is None:
            continue
        found = {w.id: placed}
        for run in sorted(moved, key=lambda r: (-r.workload.total_device_milli, r.workload.id)):
            again = place_pods(run.workload, trial, policy, rng)
            if not isinstance(again, GangPlacement):
                found = {}
                break
            found[run.workload.id] = again
        if not found:
            continue
        packed = comm.packed_slowdown(topology, placed.nodes, own)
        gain = remaining * (spread - packed) * gang.device_count
        cost = sum((lost_work_s(r, now_s)[1] + rule.restart_s) * r.device_count for r in (gang, *moved))
        if gain > cost * rule.min_gain:
            return found
    return None


def _inside(
    w: Workload, state: ClusterState, policy: PlacementPolicy, rng: random.Random, mask: np.ndarray,
) -> GangPlacement | None:
    with only(state, mask):
        placed = place_pods(w, state, policy, rng)
    return placed if isinstance(placed, GangPlacement) else None


def _apply(view: ClusterView, found: dict[str, GangPlacement], gang_id: str, now_s: float) -> Sequence[Move]:
    """Carry the planned placements out on the view: every moved workload removed, then admitted
    again at its new placement with the progress its last checkpoint keeps."""
    stopped: list[tuple[Running, float, float]] = []
    for wid in found:
        run = view.running[wid]
        resume, lost = lost_work_s(run, now_s)
        stopped.append((run, resume, lost))
        view.remove(wid)
    moves: list[Move] = []
    for run, resume, lost in stopped:
        wid = run.workload.id
        info = view.info.get(wid) or WorkloadInfo()
        view.info[wid] = dataclasses.replace(info, progress_s=resume, moves=info.moves + 1, moved_s=now_s)
        placed = found[wid]
        for _, record in placed.allocs:
            view.state.allocate(record)
        view.admit(run.workload, placed, run.cluster_queue, now_s)
        moves.append(Move(wid, gang_id, placed.placements(view.state), resume, lost))
    return moves
