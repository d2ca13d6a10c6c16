"""What the active pods hold, kept in memory and brought up to date from the store cheaply.

A pod's node, slices, cpu and memory never change once written, and neither do its workload's
tenant, queue and name, so the set of active pod ids says everything: each read takes the ids
(one narrow query), drops the pods that left it and reads only the new ones in full. The answer is
an immutable `HeldView`, numbered so that answers built from it can be cached per version. The
routes that show the pool (`/pool`, `/nodes`, `/queues`) read it instead of every pod's slices.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType

from sqlalchemy import Connection, select

from gpupool.server.orm import PodRow, WorkloadRow
from gpupool.server.states import ACTIVE_POD_STATES

READ_CHUNK = 500
"""Pod ids per `IN (...)` when new pods are read in full (below SQLite's variable limit)."""


@dataclass(frozen=True, slots=True)
class HeldSlice:
    """One slice an active pod holds on one device."""

    workload: str
    name: str
    tenant: str
    device_index: int
    compute_milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class HeldPod:
    id: str
    workload: str
    tenant: str
    queue: str
    node: str
    cpu_milli: int
    memory_mib: int
    slices: tuple[HeldSlice, ...]


@dataclass(frozen=True, slots=True)
class NodeHeld:
    """What the active pods hold on one node (pods sorted by workload, then pod id)."""

    pods: tuple[HeldPod, ...] = ()

    @property
    def cpu_milli(self) -> int:
        return sum(p.cpu_milli for p in self.pods)

    @property
    def memory_mib(self) -> int:
        return sum(p.memory_mib for p in self.pods)

    def device_milli(self) -> dict[int, int]:
        use: dict[int, int] = defaultdict(int)
        for pod in self.pods:
            for s in pod.slices:
                use[s.device_index] += s.compute_milli
        return use

    def device_memory_mib(self) -> dict[int, int]:
        use: dict[int, int] = defaultdict(int)
        for pod in self.pods:
            for s in pod.slices:
                use[s.device_index] += s.memory_mib
        return use


EMPTY_NODE = NodeHeld()


class HeldView:
    """The active pods at one moment; never changed once made (aggregates are computed once)."""

    def __init__(self, version: int, pods: Mapping[str, HeldPod]) -> None:
        self.version = version
        self.pods: Mapping[str, HeldPod] = MappingProxyType(dict(pods))

    @cached_property
    def by_node(self) -> Mapping[str, NodeHeld]:
        grouped: dict[str, list[HeldPod]] = defaultdict(list)
        for pod in self.pods.values():
            grouped[pod.node].append(pod)
        return MappingProxyType({
            node: NodeHeld(tuple(sorted(pods, key=lambda p: (p.workload, p.id))))
            for node, pods in grouped.items()
        })

    @cached_property
    def milli_by_tenant(self) -> Mapping[str, int]:
        held: Counter[str] = Counter()
        for pod in self.pods.values():
            held[pod.tenant] += sum(s.compute_milli for s in pod.slices)
        return MappingProxyType(dict(held))

    @cached_property
    def milli_by_queue(self) -> Mapping[tuple[str, str], int]:
        held: Counter[tuple[str, str]] = Counter()
        for pod in self.pods.values():
            held[(pod.tenant, pod.queue)] += sum(s.compute_milli for s in pod.slices)
        return MappingProxyType(dict(held))

    @cached_property
    def milli_by_device(self) -> Mapping[tuple[str, int], int]:
        held: Counter[tuple[str, int]] = Counter()
        for pod in self.pods.values():
            for s in pod.slices:
                held[(pod.node, s.device_index)] += s.compute_milli
        return MappingProxyType(dict(held))


class HeldPods:
    """The last `HeldView` read, shared by every request of this process (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._view = HeldView(0, {})

    def read(self, conn: Connection) -> HeldView:
        """The active pods as `conn`'s transaction sees them: one query of ids, plus one of the
        new pods' details when some appeared. Blocks while another thread brings the view up to
        date (then usually finds nothing left to read)."""
        ids = _active_ids(conn)
        with self._lock:
            view = self._view
            if ids == view.pods.keys():
                return view
            kept = {i: p for i, p in view.pods.items() if i in ids}
            kept.update(_read_pods(conn, sorted(ids - kept.keys())))
            self._view = HeldView(view.version + 1, kept)
            return self._view


_ACTIVE_IDS = "SELECT id FROM pods WHERE status IN ({})".format(
    ", ".join(f"'{state}'" for state in ACTIVE_POD_STATES))
"""Constants only (no parameters), so the same text runs on every driver."""


def _active_ids(conn: Connection) -> set[str]:
    """The ids of the active pods, read through the driver's own cursor in `conn`'s transaction:
    at 8,000 pods this takes half the time of a SQLAlchemy result (rows made one by one)."""
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(_ACTIVE_IDS)
        return {row[0] for row in cursor.fetchall()}
    finally:
        cursor.close()


def _read_pods(conn: Connection, ids: list[str]) -> dict[str, HeldPod]:
    found: dict[str, HeldPod] = {}
    for start in range(0, len(ids), READ_CHUNK):
        rows = conn.execute(
            select(PodRow.id, PodRow.workload_id, PodRow.node, PodRow.cpu_milli, PodRow.memory_mib,
                   PodRow.slices, WorkloadRow.tenant, WorkloadRow.queue, WorkloadRow.name)
            .join(WorkloadRow, WorkloadRow.id == PodRow.workload_id)
            .where(PodRow.id.in_(ids[start:start + READ_CHUNK]))
        ).all()
        for r in rows:
            slices = tuple(
                HeldSlice(workload=r.workload_id, name=r.name, tenant=r.tenant,
                          device_index=int(s["device_index"]), compute_milli=int(s["compute_milli"]),
                          memory_mib=int(s["memory_mib"]))
                for s in r.slices or ()
            )
            found[r.id] = HeldPod(id=r.id, workload=r.workload_id, tenant=r.tenant, queue=r.queue,
                                  node=r.node, cpu_milli=int(r.cpu_milli or 0),
                                  memory_mib=int(r.memory_mib or 0), slices=slices)
    return found
