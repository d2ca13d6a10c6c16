"""Read your own writes: the scheduler's cached placements checked against the store read afresh.

`load` (snapshot.py) reads in full only the workloads whose active pod ids (or priority) changed
since the last cycle; every other allocation comes from `WorkloadCache`. A change this loop did not
make that keeps a workload's pod ids (a pod row moved to another node or device, its slices or
host share rewritten), a pod row that vanished, or a workload status that no longer matches its pods
would stay unseen by every later cycle. The kept view's own audit (`ViewKeeper.drifted`) cannot see
it either: it compares the kept view with one built from the same cached snapshot.

So at most once per interval (`Settings.store_audit_interval_s`), before a cycle reads its snapshot,
`StoreAudit.check` reads every active pod with its workload's status (one query), then the ids of
the admitted and running workloads (a second one), straight from the store, and compares them with
the cache:

* `placement`: a workload whose active pods in the store are exactly those the cache holds for it,
  where a pod's node, device slices (index, compute milli, memory MiB) or host share (CPU milli,
  memory MiB) differ from its row: the cache would go on using them;
* `missing`: a pod the cache holds whose row the store no longer has (pods are never deleted);
* `status`: a workload the cache holds with exactly its active pods whose status is not admitted or
  running, or an admitted or running workload with no active pod at all.

Work whose active pods changed since the cache read them (pods ended, cancels, admissions) is no
difference: the next `load` reads it in full anyway. The pods are read before the workloads, and
only this loop makes a workload admitted or running, so a cancel committed between the two reads
never looks like a difference. A difference is logged in one line (counts and a few examples),
counted by kind (`gpupool_store_view_divergence_total` on /metrics), and the cache's allocations
are dropped, so that same cycle's `load` reads every allocation from the store.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from gpupool.core.model import Allocation, WorkloadStatus
from gpupool.server.loops.snapshot import WorkloadCache
from gpupool.server.orm import PodRow, WorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.states import ACTIVE_POD_STATES

log = logging.getLogger("gpupool.scheduler")

KINDS = ("placement", "missing", "status")
"""The kinds of difference, the counter's `kind` label."""
EXAMPLES = 3
"""Examples named in the log line, per kind."""
_PLACED = (WorkloadStatus.ADMITTED.value, WorkloadStatus.RUNNING.value)
_ID_CHUNK = 500
"""Pod ids per `IN (...)` when looking for rows that vanished."""

_Where = tuple[str, tuple[tuple[int, int, int], ...], int, int]
"""Where one pod is: node, device slices (index, compute milli, memory MiB), CPU milli and memory
MiB held on the host."""


@dataclass(slots=True)
class Divergence:
    """What one audit found: how many of each kind, and a few examples of each."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, example: str) -> None:
        self.counts[kind] += 1
        shown = self.examples.setdefault(kind, [])
        if len(shown) < EXAMPLES:
            shown.append(example)

    def __bool__(self) -> bool:
        return bool(self.counts)

    def line(self) -> str:
        parts = []
        for kind in KINDS:
            if self.counts[kind]:
                more = self.counts[kind] - len(self.examples[kind])
                parts.append(f"{kind} {self.counts[kind]} ({'; '.join(self.examples[kind])}"
                             f"{f'; {more} more' if more else ''})")
        return ", ".join(parts)


class StoreAudit:
    """Compares `WorkloadCache`'s allocations with the store, at most once per `interval_s` of the
    runtime's clock (0: never)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.next_s = float("-inf")
        self.runs = 0
        self.found: Counter[str] = Counter()
        """Differences found so far, by kind."""
        self.on_divergence: Callable[[str, int], None] | None = None
        """Called with (kind, how many) for each kind an audit found (the /metrics counter)."""

    def due(self, now_s: float) -> bool:
        """Whether an audit is due at `now_s`; if so, the next one is due an interval later."""
        if self.interval_s <= 0 or now_s < self.next_s:
            return False
        self.next_s = now_s + self.interval_s
        return True

    def check(self, rt: Runtime, cache: WorkloadCache) -> bool:
        """Compare, and on a difference log it, count it and drop the cache's allocations.
        Returns whether anything differed."""
        self.runs += 1
        found = compare(rt, cache)
        if not found:
            return False
        log.error("the scheduler's cached placements differed from the store read afresh: %s; "
                  "the cache was dropped and this cycle rebuilds it from the store", found.line())
        cache.drop_allocations()
        for kind, count in found.counts.items():
            self.found[kind] += count
            if self.on_divergence is not None:
                self.on_divergence(kind, count)
        return True


def compare(rt: Runtime, cache: WorkloadCache) -> Divergence:
    """The differences between the cache's allocations and the store (see the module docstring)."""
    cached = cache.allocations()
    known = cache.allocation_nodes
    found = Divergence()
    gone: list[str] = []
    with rt.store.read() as session:
        conn = session.connection()
        pods = conn.execute(
            select(PodRow.id, PodRow.workload_id, PodRow.rank, PodRow.node, PodRow.slices, PodRow.cpu_milli,
                   PodRow.memory_mib, WorkloadRow.status)
            .join(WorkloadRow, WorkloadRow.id == PodRow.workload_id)
            .where(PodRow.status.in_(ACTIVE_POD_STATES))
        ).all()
        placed = set(conn.scalars(select(WorkloadRow.id).where(WorkloadRow.status.in_(_PLACED))))
        by_workload: dict[str, list[Any]] = {}
        for pod in pods:
            by_workload.setdefault(pod.workload_id, []).append(pod)
        for wid in sorted(cached):
            ids, allocation = cached[wid]
            rows = by_workload.get(wid)
            stored_ids = () if rows is None else tuple(sorted(p.id for p in rows))
            if stored_ids != ids:
                # its pods changed since the cache read them: the next read takes them in full; only
                # a pod whose row is gone altogether is a difference
                gone += set(ids).difference(stored_ids)
                continue
            assert rows is not None
            status = rows[0].status
            if status not in _PLACED:
                found.add("status", f"workload {wid} holds {len(rows)} active pods in the cache and the "
                                    f"store, but its status is {status}")
            _compare_placements(found, wid, allocation, rows, known)
        still = _existing(conn, gone)
    for pod_id in sorted(set(gone) - still):
        found.add("missing", f"pod {pod_id}: held in the cache, no row in the store")
    for wid in sorted(placed - set(by_workload)):
        found.add("status", f"workload {wid} is admitted or running in the store with no active pod")
    return found


def _compare_placements(found: Divergence, wid: str, allocation: Allocation, rows: Sequence[Any],
                        known: frozenset[str]) -> None:
    requests = allocation.workload.pods
    held: dict[int, _Where] = {}
    for p in allocation.placements:
        rank = int(p.pod.removeprefix("r"))
        cpu, mem = p.held_host(requests[rank])
        slices = tuple((s.device_index, s.compute_milli, s.memory_mib) for s in p.slices)
        held[rank] = (p.node, slices, cpu, mem)
    stored: dict[int, _Where] = {}
    for row in rows:
        if row.node not in known:
            continue  # left out of the snapshot (the provider no longer lists its node), as by `load`
        request = requests[row.rank] if row.rank < len(requests) else None
        cpu = row.cpu_milli or (request.cpu_milli if request is not None else 0)
        mem = row.memory_mib or (request.memory_mib if request is not None else 0)
        slices = tuple((s["device_index"], s["compute_milli"], s.get("memory_mib", 0)) for s in row.slices)
        stored[row.rank] = (row.node, slices, cpu, mem)
    if held == stored:
        return
    pod_ids = {row.rank: row.id for row in rows}
    for rank in sorted(set(held) | set(stored)):
        mine, theirs = held.get(rank), stored.get(rank)
        if mine != theirs:
            found.add("placement", f"pod {pod_ids.get(rank, f'{wid} rank {rank}')}: {_where(mine)} in the "
                                   f"cache, {_where(theirs)} in the store")


def _where(where: _Where | None) -> str:
    if where is None:
        return "nowhere"
    node, slices, cpu, mem = where
    devices = ",".join(f"{index}:{milli}m/{memory}MiB" for index, milli, memory in slices)
    return f"{node} [{devices}] cpu {cpu}m mem {mem}MiB"


def _existing(conn: Any, pod_ids: Iterable[str]) -> set[str]:
    """Which of `pod_ids` the store still has a row for (in any state)."""
    ids = sorted(set(pod_ids))
    still: set[str] = set()
    for start in range(0, len(ids), _ID_CHUNK):
        still.update(conn.scalars(select(PodRow.id).where(PodRow.id.in_(ids[start:start + _ID_CHUNK]))))
    return still
