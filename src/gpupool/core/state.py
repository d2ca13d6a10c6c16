"""Mutable, numpy-backed free capacity of every node and device, with checked allocations.

The placement policies score thousands of nodes per pod, so free capacity lives in arrays
(`[node]` and `[node, device slot]`) rather than in objects. Every allocation is checked in every
dimension and raises `OverAllocation` instead of ever going negative; a `Statement` groups
tentative allocations that are committed or discarded as a whole (a gang).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpupool.core.model import (
    UNKNOWN_MEMORY_MIB,
    ClusterSnapshot,
    Node,
    PodPlacement,
    PodRequest,
    Slice,
)
from gpupool.core.units import MILLI
from gpupool.errors import OverAllocation

UNBOUNDED_MIB = 1 << 50
"""Stands for the memory of a device whose size is unknown: never the binding constraint."""

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class PodAlloc:
    """What one placed pod holds: host resources on a node and a slice on each of its devices."""

    node: int
    devices: tuple[int, ...]
    device_milli: tuple[int, ...]
    device_memory_mib: tuple[int, ...]
    cpu_milli: int
    memory_mib: int

    def slices(self) -> tuple[Slice, ...]:
        return tuple(
            Slice(device_index=d, compute_milli=m, memory_mib=mem)
            for d, m, mem in zip(self.devices, self.device_milli, self.device_memory_mib, strict=True)
        )


class ClusterState:
    """Free and total capacity of a set of nodes; the one place allocations are applied."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.node_index: dict[str, int] = {n.name: i for i, n in enumerate(self.nodes)}
        n = len(self.nodes)
        width = max((len(node.devices) for node in self.nodes), default=0) or 1
        self.models: list[str] = sorted({d.model for node in self.nodes for d in node.devices})
        self.model_id: dict[str, int] = {m: i for i, m in enumerate(self.models)}

        self.cpu_cap: IntArray = np.array([x.cpu_milli for x in self.nodes], dtype=np.int64)
        self.mem_cap: IntArray = np.array([x.memory_mib for x in self.nodes], dtype=np.int64)
        self.cpu_free: IntArray = self.cpu_cap.copy()
        self.mem_free: IntArray = self.mem_cap.copy()
        self.schedulable: BoolArray = np.array([x.schedulable for x in self.nodes], dtype=bool)

        self.dev_valid: BoolArray = np.zeros((n, width), dtype=bool)
        self.dev_model: IntArray = np.full((n, width), -1, dtype=np.int64)
        self.dev_milli_cap: IntArray = np.zeros((n, width), dtype=np.int64)
        self.dev_mem_cap: IntArray = np.zeros((n, width), dtype=np.int64)
        # Filled in bulk (one pass over the devices, then fancy-indexed assignment).
        model_id = self.model_id
        rows = [i for i, node in enumerate(self.nodes) for _ in node.devices]
        slots = [slot for node in self.nodes for slot in range(len(node.devices))]
        devs = [dev for node in self.nodes for dev in node.devices]
        if devs:
            usable = np.array([dev.healthy for dev in devs], dtype=bool)
            mems = np.array(
                [UNBOUNDED_MIB if d.memory_mib == UNKNOWN_MEMORY_MIB else d.memory_mib for d in devs],
                dtype=np.int64,
            )
            self.dev_valid[rows, slots] = True
            self.dev_model[rows, slots] = [model_id[dev.model] for dev in devs]
            self.dev_milli_cap[rows, slots] = np.where(usable, MILLI, 0)
            self.dev_mem_cap[rows, slots] = np.where(usable, mems, 0)
        self.dev_milli_free: IntArray = self.dev_milli_cap.copy()
        self.dev_mem_free: IntArray = self.dev_mem_cap.copy()
        self.dev_count: IntArray = self.dev_valid.sum(axis=1).astype(np.int64)
        self._allowed_cache: dict[frozenset[str], BoolArray] = {}
        # Bumped on every change of a node's free capacity, so policies can cache per-node scores.
        self.node_version: IntArray = np.zeros(n, dtype=np.int64)
        # Per node: how many placed pods of each kind ("cpu", "share", "<k>-dev") it holds.
        self.node_pod_kinds: list[dict[str, int]] = [{} for _ in range(n)]

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_snapshot(cls, snapshot: ClusterSnapshot) -> ClusterState:
        """A state with every allocation of the snapshot applied (checked)."""
        state = cls(snapshot.nodes)
        for alloc in snapshot.allocations:
            pods = {p.name: p for p in alloc.workload.pods}
            for placement in alloc.placements:
                state.apply_placement(pods[placement.pod], placement)
        return state

    def apply_placement(self, pod: PodRequest, placement: PodPlacement) -> PodAlloc:
        """Re-apply a recorded placement (from a store or snapshot) to this state."""
        record = PodAlloc(
            node=self.node_index[placement.node],
            devices=tuple(s.device_index for s in placement.slices),
            device_milli=tuple(s.compute_milli for s in placement.slices),
            device_memory_mib=tuple(s.memory_mib for s in placement.slices),
            cpu_milli=pod.cpu_milli,
            memory_mib=pod.memory_mib,
        )
        self.allocate(record)
        return record

    # ----------------------------------------------------------------- totals

    @property
    def total_device_milli(self) -> int:
        return int(self.dev_milli_cap.sum())

    @property
    def allocated_device_milli(self) -> int:
        return int(self.dev_milli_cap.sum() - self.dev_milli_free.sum())

    # ----------------------------------------------------------------- feasibility

    def allowed_devices(self, allowed_models: frozenset[str]) -> BoolArray:
        """[node, slot] mask of valid devices whose model the pod accepts (cached per set)."""
        cached = self._allowed_cache.get(allowed_models)
        if cached is None:
            if allowed_models:
                ids = [self.model_id[m] for m in allowed_models if m in self.model_id]
                cached = self.dev_valid & np.isin(self.dev_model, ids)
            else:
                cached = self.dev_valid.copy()
            self._allowed_cache[allowed_models] = cached
        return cached

    def device_fits(self, pod: PodRequest) -> BoolArray:
        """[node, slot] mask of devices that could hold one of the pod's device shares now."""
        allowed = self.allowed_devices(pod.allowed_models)
        if pod.device_milli >= MILLI:
            ok = (self.dev_milli_free == MILLI) & (self.dev_mem_free == self.dev_mem_cap)
            ok &= self.dev_milli_cap == MILLI
        else:
            ok = self.dev_milli_free >= pod.device_milli
        if pod.device_memory_mib:
            ok &= self.dev_mem_free >= pod.device_memory_mib
        return ok & allowed

    def host_fits(self, pod: PodRequest) -> BoolArray:
        """[node] mask of schedulable nodes with enough free cpu and memory for the pod."""
        return self.schedulable & (self.cpu_free >= pod.cpu_milli) & (self.mem_free >= pod.memory_mib)

    def node_fits(self, pod: PodRequest) -> BoolArray:
        """[node] mask of nodes that can hold the whole pod right now."""
        ok = self.host_fits(pod)
        if pod.num_devices:
            ok &= self.device_fits(pod).sum(axis=1) >= pod.num_devices
        return ok

    # ----------------------------------------------------------------- allocation

    def make_alloc(self, pod: PodRequest, node: int, devices: Iterable[int]) -> PodAlloc:
        """The record for placing `pod` on `node` using the given device slots."""
        slots = tuple(int(d) for d in devices)
        if len(slots) != pod.num_devices:
            raise OverAllocation(
                f"Pod {pod.name!r} asks for {pod.num_devices} devices but {len(slots)} were chosen."
            )
        if pod.device_milli >= MILLI:
            milli = tuple(int(self.dev_milli_cap[node, d]) for d in slots)
            mem = tuple(
                pod.device_memory_mib or int(self.dev_mem_cap[node, d])
                if self.dev_mem_cap[node, d] != UNBOUNDED_MIB
                else pod.device_memory_mib
                for d in slots
            )
        else:
            milli = (pod.device_milli,) * len(slots)
            mem = (pod.device_memory_mib,) * len(slots)
        return PodAlloc(node, slots, milli, mem, pod.cpu_milli, pod.memory_mib)

    def allocate(self, record: PodAlloc) -> None:
        """Take the record's resources; raise OverAllocation (changing nothing) if any would overflow."""
        node = record.node
        if self.cpu_free[node] < record.cpu_milli or self.mem_free[node] < record.memory_mib:
            raise OverAllocation(f"Node {self.nodes[node].name!r} has too little free cpu or memory.")
        if len(set(record.devices)) != len(record.devices):
            raise OverAllocation("A pod may not take two shares of the same device.")
        for d, milli, mem in zip(
            record.devices, record.device_milli, record.device_memory_mib, strict=True
        ):
            if not self.dev_valid[node, d]:
                raise OverAllocation(f"Node {self.nodes[node].name!r} has no device slot {d}.")
            if self.dev_milli_free[node, d] < milli or self.dev_mem_free[node, d] < mem:
                raise OverAllocation(
                    f"Device {d} of node {self.nodes[node].name!r} has too little free capacity."
                )
        self.cpu_free[node] -= record.cpu_milli
        self.mem_free[node] -= record.memory_mib
        for d, milli, mem in zip(
            record.devices, record.device_milli, record.device_memory_mib, strict=True
        ):
            self.dev_milli_free[node, d] -= milli
            self.dev_mem_free[node, d] -= mem
        self._note_change(record, +1)

    def release(self, record: PodAlloc) -> None:
        """Give the record's resources back; raise OverAllocation if more would be freed than exists."""
        node = record.node
        if (
            self.cpu_free[node] + record.cpu_milli > self.cpu_cap[node]
            or self.mem_free[node] + record.memory_mib > self.mem_cap[node]
        ):
            raise OverAllocation(f"Releasing more than node {self.nodes[node].name!r} holds.")
        for d, milli, mem in zip(
            record.devices, record.device_milli, record.device_memory_mib, strict=True
        ):
            if (
                self.dev_milli_free[node, d] + milli > self.dev_milli_cap[node, d]
                or self.dev_mem_free[node, d] + mem > self.dev_mem_cap[node, d]
            ):
                raise OverAllocation(f"Releasing more than device {d} holds.")
        self.cpu_free[node] += record.cpu_milli
        self.mem_free[node] += record.memory_mib
        for d, milli, mem in zip(
            record.devices, record.device_milli, record.device_memory_mib, strict=True
        ):
            self.dev_milli_free[node, d] += milli
            self.dev_mem_free[node, d] += mem
        self._note_change(record, -1)

    def pod_kind(self, record: PodAlloc) -> str:
        """The kind of a placed pod: "cpu", "share" (a fraction of one device) or "<k>-dev"."""
        if not record.devices:
            return "cpu"
        if len(record.devices) == 1 and record.device_milli[0] < MILLI:
            return "share"
        return f"{len(record.devices)}-dev"

    def _note_change(self, record: PodAlloc, sign: int) -> None:
        self.node_version[record.node] += 1
        kinds = self.node_pod_kinds[record.node]
        kind = self.pod_kind(record)
        count = kinds.get(kind, 0) + sign
        if count:
            kinds[kind] = count
        else:
            kinds.pop(kind, None)

    def set_schedulable(self, node: int, schedulable: bool) -> None:
        """Cordon or uncordon a node: running work stays, new work is not placed there."""
        self.schedulable[node] = schedulable
        self.node_version[node] += 1

    def statement(self) -> Statement:
        return Statement(self)

    def check_invariants(self) -> None:
        """Raise OverAllocation if any dimension is negative or above capacity (for tests)."""
        pairs = [
            (self.cpu_free, self.cpu_cap),
            (self.mem_free, self.mem_cap),
            (self.dev_milli_free, self.dev_milli_cap),
            (self.dev_mem_free, self.dev_mem_cap),
        ]
        for free, cap in pairs:
            if (free < 0).any() or (free > cap).any():
                raise OverAllocation("Free capacity out of range: a resource was over-allocated.")


class Statement:
    """Tentative allocations committed or discarded as a whole (all-or-nothing for gangs)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.records: list[PodAlloc] = []

    def allocate(self, record: PodAlloc) -> None:
        self.state.allocate(record)
        self.records.append(record)

    def discard(self) -> None:
        for record in reversed(self.records):
            self.state.release(record)
        self.records.clear()

    def commit(self) -> list[PodAlloc]:
        records, self.records = self.records, []
        return records
