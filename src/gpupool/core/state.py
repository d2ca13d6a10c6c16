"""Mutable, numpy-backed free capacity of every node and device, with checked allocations.

The placement policies score thousands of nodes per pod, so free capacity lives in arrays
(`[node]` and `[node, device slot]`) rather than in objects. Every allocation is checked in every
dimension and raises `OverAllocation` instead of ever going negative; a `Statement` groups
tentative allocations that are committed or discarded as a whole (a gang). The functions at the
end change a state in bulk: a snapshot's placements, many records released at once, a copy.

What a pod holds where its request names no amount follows the state's `SliceDefaults` (none
unless given: then a pod holds exactly what it names): the `*_need` methods give the effective
amounts, per node (`[node]`) or per device (`[node, slot]`) where they depend on it, and every fit
test and allocation record uses them.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from gpupool.core.model import (
    NO_DEFAULTS,
    UNKNOWN_MEMORY_MIB,
    Allocation,
    ClusterSnapshot,
    Labels,
    Node,
    PodPlacement,
    PodRequest,
    Slice,
    SliceDefaults,
    labels_match,
)
from gpupool.core.units import MILLI
from gpupool.errors import OverAllocation

UNBOUNDED_MIB = 1 << 50
"""Stands for the memory of a device whose size is unknown: never the binding constraint."""

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Need = int | IntArray
"""An effective amount: one number, or one per node ([node]) or per device ([node, slot])."""

_NEED_CACHE_SIZE = 64
"""Per-device memory needs kept per state (one [node, slot] array per share); cleared when full."""
_LABEL_CACHE_SIZE = 256
"""Distinct node-label sets (and model and label pairs) whose masks a state keeps (tenants choose
them); cleared when full."""


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

    def __init__(self, nodes: Sequence[Node], defaults: SliceDefaults | None = None) -> None:
        self.nodes: tuple[Node, ...] = tuple(nodes)
        # Without defaults a pod holds exactly what it names (the fill protocol replays OpenB's
        # requests as they are); the scheduling cycle sets its Policies' defaults (`set_defaults`).
        self.defaults = NO_DEFAULTS if defaults is None else defaults
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
        # The devices' physical memory (0: unknown) and count, whatever their health: the base of
        # the default shares, which a device's failure and repair must not change.
        self.dev_mem_size: IntArray = np.zeros((n, width), dtype=np.int64)
        if devs:
            self.dev_mem_size[rows, slots] = [d.memory_mib for d in devs]
        self.memory_known = bool(self.dev_mem_size.any())
        self.heavy_slices = 0
        """Placed shares holding more device memory than their compute's share of it (see
        `device_fits`); while there are none, a default share that fits in compute fits in memory."""
        self._set_need_caches()
        self._allowed_cache: dict[frozenset[str], BoolArray] = {}
        self._label_cache: dict[Labels, BoolArray] = {}
        self._labelled_cache: dict[tuple[frozenset[str], Labels], BoolArray] = {}
        # Bumped on every change of a node's free capacity, so policies can cache per-node scores.
        self.node_version: IntArray = np.zeros(n, dtype=np.int64)
        # Per node: how many placed pods of each kind ("cpu", "share", "<k>-dev") it holds. A node's
        # dict is never changed in place: a change puts a changed copy in its slot, so copies of the
        # state share the dicts of the nodes neither changed since (`clone_state`).
        self.node_pod_kinds: list[dict[str, int]] = [{} for _ in range(n)]

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_snapshot(cls, snapshot: ClusterSnapshot, defaults: SliceDefaults | None = None) -> ClusterState:
        """A state with every allocation of the snapshot applied (checked)."""
        state = cls(snapshot.nodes, defaults)
        for alloc in snapshot.allocations:
            pods = {p.name: p for p in alloc.workload.pods}
            for placement in alloc.placements:
                state.apply_placement(pods[placement.pod], placement)
        return state

    def apply_placement(self, pod: PodRequest, placement: PodPlacement) -> PodAlloc:
        """Re-apply a recorded placement (from a store or snapshot) to this state."""
        record = self.record_of(pod, placement)
        self.allocate(record)
        return record

    def record_of(self, pod: PodRequest, placement: PodPlacement) -> PodAlloc:
        """The record of what a recorded placement holds (its recorded amounts, not the defaults now)."""
        # PodPlacement.held_host, inlined: a snapshot rebuilds every running pod's record.
        return PodAlloc(
            node=self.node_index[placement.node],
            devices=tuple(s.device_index for s in placement.slices),
            device_milli=tuple(s.compute_milli for s in placement.slices),
            device_memory_mib=tuple(s.memory_mib for s in placement.slices),
            cpu_milli=placement.cpu_milli or pod.cpu_milli,
            memory_mib=placement.memory_mib or pod.memory_mib,
        )

    # ----------------------------------------------------------------- effective amounts

    def set_defaults(self, defaults: SliceDefaults) -> None:
        """Use other defaults for placements from now on (what is placed keeps its records)."""
        if defaults != self.defaults:
            self.defaults = defaults
            self._set_need_caches()

    def _set_need_caches(self) -> None:
        # New dicts, not cleared ones: copies of this state (clone_state) share the old ones.
        self._host_need: dict[tuple[bool, int], IntArray] = {}
        self._dev_mem_need: dict[int, IntArray] = {}

    def cpu_need(self, pod: PodRequest) -> Need:
        """The cpu (milli) the pod would hold: its request, else its default share ([node])."""
        return self._host_need_of(pod, pod.cpu_milli, self.defaults.cpu_milli_per_device, cpu=True)

    def mem_need(self, pod: PodRequest) -> Need:
        """The host memory (MiB) the pod would hold: its request, else its default share ([node])."""
        return self._host_need_of(pod, pod.memory_mib, self.defaults.memory_mib_per_device, cpu=False)

    def _host_need_of(self, pod: PodRequest, requested: int, per_device: int | None, *, cpu: bool) -> Need:
        """`requested`, else the configured amount per device, else the node's share ([node])."""
        if requested or not pod.num_devices:
            return requested
        if per_device is not None:
            return per_device * pod.total_device_milli // MILLI
        return self._node_share(cpu, pod.total_device_milli)

    def _node_share(self, cpu: bool, milli: int) -> IntArray:
        """[node] floor(node total * milli / (its devices * 1000)), 0 on nodes without devices."""
        found = self._host_need.get((cpu, milli))
        if found is None:
            total = self.cpu_cap if cpu else self.mem_cap
            # dev_count is every device of the node, healthy or not (failures never change it).
            per = np.maximum(self.dev_count, 1) * MILLI
            found = np.where(self.dev_count > 0, total * milli // per, 0).astype(np.int64)
            self._host_need[(cpu, milli)] = found
        return found

    def device_memory_need(self, pod: PodRequest) -> Need:
        """Device memory one fractional share of the pod holds: its request, else its default
        proportional share of each device ([node, slot]); whole devices: the request (the fit test
        asks for a wholly free device and the record takes all of it)."""
        if (
            pod.device_memory_mib
            or not pod.is_fractional
            or not self.memory_known
            or not self.defaults.proportional_device_memory
        ):
            return pod.device_memory_mib
        share = pod.memory_share_milli or pod.device_milli
        found = self._dev_mem_need.get(share)
        if found is None:
            if len(self._dev_mem_need) >= _NEED_CACHE_SIZE:
                self._dev_mem_need = {}
            found = self._dev_mem_need[share] = self.dev_mem_size * share // MILLI
        return found

    # ----------------------------------------------------------------- totals

    @property
    def total_device_milli(self) -> int:
        return int(self.dev_milli_cap.sum())

    @property
    def allocated_device_milli(self) -> int:
        return int(self.dev_milli_cap.sum() - self.dev_milli_free.sum())

    # ----------------------------------------------------------------- feasibility

    def allowed_devices(self, allowed_models: frozenset[str], node_labels: Labels = frozenset()) -> BoolArray:
        """[node, slot] mask of valid devices whose model the pod accepts, on nodes carrying the
        labels it requires (cached per set, and per pair of sets where labels are given)."""
        if node_labels:
            key = (allowed_models, node_labels)
            found = self._labelled_cache.get(key)
            if found is None:
                if len(self._labelled_cache) >= _LABEL_CACHE_SIZE:
                    self._labelled_cache = {}
                found = self.allowed_devices(allowed_models) & self.labelled(node_labels)[:, None]
                self._labelled_cache[key] = found
            return found
        cached = self._allowed_cache.get(allowed_models)
        if cached is None:
            if allowed_models:
                ids = [self.model_id[m] for m in allowed_models if m in self.model_id]
                cached = self.dev_valid & np.isin(self.dev_model, ids)
            else:
                cached = self.dev_valid.copy()
            self._allowed_cache[allowed_models] = cached
        return cached

    def labelled(self, node_labels: Labels) -> BoolArray:
        """[node] mask of the nodes carrying every one of `node_labels` (all nodes: empty set)."""
        cached = self._label_cache.get(node_labels)
        if cached is None:
            if len(self._label_cache) >= _LABEL_CACHE_SIZE:
                self._label_cache, self._labelled_cache = {}, {}
            cached = np.array([labels_match(node_labels, n.labels) for n in self.nodes], dtype=bool)
            self._label_cache[node_labels] = cached
        return cached

    def device_fits(self, pod: PodRequest) -> BoolArray:
        """[node, slot] mask of devices that could hold one of the pod's device shares now."""
        allowed = self.allowed_devices(pod.allowed_models, pod.node_labels)
        if pod.device_milli >= MILLI:
            ok = (self.dev_milli_free == MILLI) & (self.dev_mem_free == self.dev_mem_cap)
            ok &= self.dev_milli_cap == MILLI
        else:
            ok = self.dev_milli_free >= pod.device_milli
        need = self.device_memory_need(pod)
        if isinstance(need, np.ndarray):
            # A default share needs floor(size * milli / 1000). While every placed share holds at most
            # its compute's share of memory, each device has free memory >= size * free milli / 1000,
            # so fitting in compute implies fitting in memory and the comparison is skipped.
            if self.heavy_slices:
                ok &= self.dev_mem_free >= need
        elif need:
            ok &= self.dev_mem_free >= need
        return ok & allowed

    def node_fits_at(self, pod: PodRequest, rows: Iterable[int]) -> bool:
        """`node_fits(pod)[rows].any()`, computed on those nodes only (host resources first)."""
        schedulable, cpu_free, mem_free = self.schedulable, self.cpu_free, self.mem_free
        cpu, mem = self.cpu_need(pod), self.mem_need(pod)
        if pod.node_labels:
            schedulable = schedulable & self.labelled(pod.node_labels)
        if isinstance(cpu, int) and isinstance(mem, int):  # the common case, kept a plain comparison
            hosts = [n for n in rows if schedulable[n] and cpu_free[n] >= cpu and mem_free[n] >= mem]
        else:
            hosts = [
                n
                for n in rows
                if schedulable[n] and cpu_free[n] >= at_node(cpu, n) and mem_free[n] >= at_node(mem, n)
            ]
        if not hosts or not pod.num_devices:
            return bool(hosts)
        dev = self.device_fits_at(pod, np.asarray(hosts, dtype=np.intp))
        return bool((row_counts(dev) >= pod.num_devices).any())

    def node_fits_rows(self, pod: PodRequest, rows: Sequence[int]) -> BoolArray:
        """`node_fits(pod)[rows]`, computed on those nodes only (as `node_fits_at` does, per row)."""
        at = np.asarray(rows, dtype=np.intp)
        cpu, mem = self.cpu_need(pod), self.mem_need(pod)
        ok = self.schedulable[at] & (self.cpu_free[at] >= at_nodes(cpu, at))
        ok &= self.mem_free[at] >= at_nodes(mem, at)
        if pod.node_labels:
            ok &= self.labelled(pod.node_labels)[at]
        if not pod.num_devices:
            return np.asarray(ok)
        return np.asarray(ok & (row_counts(self.device_fits_at(pod, at)) >= pod.num_devices))

    def device_fits_at(self, pod: PodRequest, at: IntArray | int) -> BoolArray:
        """`device_fits(pod)[at]`, computed on those nodes' rows only (a node's row: `at` an index,
        for the slots a pod placed there takes)."""
        milli_free, mem_free_dev = self.dev_milli_free[at], self.dev_mem_free[at]
        if pod.device_milli >= MILLI:
            dev = (milli_free == MILLI) & (mem_free_dev == self.dev_mem_cap[at])
            dev &= self.dev_milli_cap[at] == MILLI
        else:
            dev = milli_free >= pod.device_milli
        need = self.device_memory_need(pod)
        if isinstance(need, np.ndarray):
            if self.heavy_slices:  # see device_fits
                dev &= mem_free_dev >= need[at]
        elif need:
            dev &= mem_free_dev >= need
        dev &= self.allowed_devices(pod.allowed_models, pod.node_labels)[at]
        return dev

    def host_fits(self, pod: PodRequest) -> BoolArray:
        """[node] mask of schedulable nodes with enough free cpu and memory for the pod."""
        cpu, mem = self.cpu_need(pod), self.mem_need(pod)
        ok = self.schedulable & (self.cpu_free >= cpu) & (self.mem_free >= mem)
        if pod.node_labels:
            ok &= self.labelled(pod.node_labels)
        return ok

    def node_fits(self, pod: PodRequest) -> BoolArray:
        """[node] mask of nodes that can hold the whole pod right now."""
        return self.node_fits_parts(pod)[0]

    def node_fits_parts(self, pod: PodRequest) -> tuple[BoolArray, BoolArray, IntArray | None]:
        """(`node_fits(pod)`, the host mask and the per-node counts of fitting devices it is made
        of (None for a pod without devices)), for a caller that words a refusal from them."""
        host = self.host_fits(pod)
        if not pod.num_devices:
            return host, host, None
        counts = row_counts(self.device_fits(pod))
        return host & (counts >= pod.num_devices), host, counts

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
            need = self.device_memory_need(pod)
            if isinstance(need, np.ndarray):
                mem = tuple(int(need[node, d]) for d in slots)
            else:
                mem = (need,) * len(slots)
        cpu = at_node(self.cpu_need(pod), node)
        return PodAlloc(node, slots, milli, mem, cpu, at_node(self.mem_need(pod), node))

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
            if milli < MILLI and mem and self._heavy(node, d, milli, mem):
                self.heavy_slices += 1
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
            if milli < MILLI and mem and self._heavy(node, d, milli, mem):
                self.heavy_slices -= 1
        self._note_change(record, -1)

    def _heavy(self, node: int, d: int, milli: int, mem: int) -> bool:
        """Whether a share holds more memory than its compute's share of a device of known size."""
        size = int(self.dev_mem_size[node, d])
        return bool(size) and mem > size * milli // MILLI

    def pod_kind(self, record: PodAlloc) -> str:
        """The kind of a placed pod: "cpu", "share" (a fraction of one device) or "<k>-dev"."""
        if not record.devices:
            return "cpu"
        if len(record.devices) == 1 and record.device_milli[0] < MILLI:
            return "share"
        return f"{len(record.devices)}-dev"

    def _note_change(self, record: PodAlloc, sign: int) -> None:
        self.node_version[record.node] += 1
        kinds = self.node_pod_kinds[record.node].copy()  # (never changed in place: see __init__)
        kind = self.pod_kind(record)
        count = kinds.get(kind, 0) + sign
        if count:
            kinds[kind] = count
        else:
            kinds.pop(kind, None)
        self.node_pod_kinds[record.node] = kinds

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


_WORD = {2: np.uint16, 4: np.uint32, 8: np.uint64}
"""The unsigned integer that holds a row of this many booleans (one byte each)."""
_BYTE_ONES: dict[int, Any] = {width: dtype(int.from_bytes(b"\x01" * width, "little"))
                              for width, dtype in _WORD.items()}
_TOP_BYTE: dict[int, Any] = {width: dtype(8 * (width - 1)) for width, dtype in _WORD.items()}


def _row_words(mask: BoolArray) -> npt.NDArray[np.unsignedinteger[Any]] | None:
    """Each row of a [node, slot] mask read as one unsigned integer of its bytes (one per slot: 0 or
    1), where the rows are 2, 4 or 8 contiguous bytes wide; else None."""
    width = mask.shape[1] if mask.ndim == 2 else 0
    word = _WORD.get(width)
    if word is None or mask.dtype != np.bool_ or not mask.flags.c_contiguous:
        return None
    return mask.view(word).reshape(len(mask))


def row_counts(mask: BoolArray) -> IntArray:
    """`mask.sum(axis=1)` of a [node, slot] mask. A row of 2, 4 or 8 slots is summed as one integer
    of its bytes, multiplied by 0x0101...01: its top byte then holds the sum of the bytes (at most
    8, so no carry reaches it), whatever the byte order (a sum does not depend on it). Other widths
    are summed as a product with a vector of ones on the bytes (fewer than 256 slots), else by
    `sum`. The same counts every way (int64)."""
    words = _row_words(mask)
    if words is not None:
        width = mask.shape[1]
        counts = (words * _BYTE_ONES[width]) >> _TOP_BYTE[width]
        return counts.view(np.int64) if width == 8 else counts.astype(np.int64)
    width = mask.shape[1]
    if width < 256 and mask.flags.c_contiguous and mask.dtype == np.bool_:
        return np.asarray(mask.view(np.uint8) @ np.ones(width, dtype=np.uint8)).astype(np.int64)
    return np.asarray(mask.sum(axis=1), dtype=np.int64)


def rows_all(mask: BoolArray) -> BoolArray:
    """`mask.all(axis=1)` of a [node, slot] mask: a row of 2, 4 or 8 slots is all true when its
    bytes, read as one integer, are 0x0101...01."""
    words = _row_words(mask)
    if words is not None:
        return np.asarray(words == _BYTE_ONES[mask.shape[1]])
    return np.asarray(mask.all(axis=1))


def row_sums(values: IntArray) -> IntArray:
    """`values.sum(axis=1)` of an integer [node, slot] array, as a product with a vector of ones
    (integers: the same sums; a product of a few hundred rows takes a quarter of `sum`'s time)."""
    if values.ndim == 2 and values.dtype == np.int64 and len(values) >= _SUM_BY_PRODUCT:
        return np.asarray(values @ np.ones(values.shape[1], dtype=np.int64))
    return np.asarray(values.sum(axis=1))


_SUM_BY_PRODUCT = 64
"""From this many rows, `row_sums` takes the product (below it `sum` is as fast)."""


def at_node(need: Need, node: int) -> int:
    """One node's value of an effective amount."""
    return int(need[node]) if isinstance(need, np.ndarray) else need


def at_nodes(need: Need, nodes: IntArray | slice) -> Need:
    """The values of an effective amount on some nodes (a number stays a number)."""
    return need[nodes] if isinstance(need, np.ndarray) else need


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


# ----------------------------------------------------------------- bulk changes

Allocs = tuple[tuple[PodRequest, PodAlloc], ...]
"""A workload's placed pods, each with the record of what it holds."""


def allocs_of(state: ClusterState, alloc: Allocation) -> Allocs:
    """The records of an allocation's placements, each with its pod."""
    pods = {p.name: p for p in alloc.workload.pods}
    return tuple((pods[pl.pod], state.record_of(pods[pl.pod], pl)) for pl in alloc.placements)


def clone_state(state: ClusterState, *, empty: bool = False, whole: bool = False) -> ClusterState:
    """An independent copy of a state's capacity arrays (empty: nothing allocated; whole, with empty:
    the pool as built, every node schedulable and every device healthy, as cordons, failures and
    repairs come and go)."""
    new = copy.copy(state)
    new.cpu_cap = state.cpu_cap.copy()
    new.mem_cap = state.mem_cap.copy()
    if empty and whole:
        unknown = state.dev_mem_size == UNKNOWN_MEMORY_MIB
        new.dev_milli_cap = np.where(state.dev_valid, MILLI, 0).astype(np.int64)
        new.dev_mem_cap = np.where(state.dev_valid, np.where(unknown, UNBOUNDED_MIB, state.dev_mem_size),
                                   0).astype(np.int64)
        new.schedulable = np.ones_like(state.schedulable)
    else:
        new.dev_milli_cap = state.dev_milli_cap.copy()
        new.dev_mem_cap = state.dev_mem_cap.copy()
        new.schedulable = state.schedulable.copy()
    src = new if empty else state
    new.cpu_free = (src.cpu_cap if empty else src.cpu_free).copy()
    new.mem_free = (src.mem_cap if empty else src.mem_free).copy()
    new.dev_milli_free = (src.dev_milli_cap if empty else src.dev_milli_free).copy()
    new.dev_mem_free = (src.dev_mem_cap if empty else src.dev_mem_free).copy()
    new.node_version = state.node_version.copy()
    # the dicts are shared: a change to either state puts a new dict in its own list (`__init__`)
    new.node_pod_kinds = [{} for _ in state.node_pod_kinds] if empty else list(state.node_pod_kinds)
    if empty:
        new.heavy_slices = 0
    return new


def allocate_placements(state: ClusterState, allocations: Sequence[Allocation]) -> None:
    """Take the capacity of recorded placements in bulk, then check nothing is over-allocated."""
    placements, pods = _pods_placed(allocations)
    if not placements:
        state.check_invariants()
        return
    nodes = list(map(state.node_index.__getitem__, map(_node_name, placements)))
    slices = list(map(_slices, placements))
    counts = list(map(len, slices))
    # What the placements recorded (the effective amounts), else the pods' requests.
    cpu = np.fromiter(map(_cpu, placements), np.int64, len(pods))
    mem = np.fromiter(map(_mem, placements), np.int64, len(pods))
    np.add.at(state.cpu_free, nodes, -np.maximum(cpu, np.fromiter(map(_cpu, pods), np.int64, len(pods))))
    np.add.at(state.mem_free, nodes, -np.maximum(mem, np.fromiter(map(_mem, pods), np.int64, len(pods))))
    flat = list(chain.from_iterable(slices))
    if flat:
        where = (np.repeat(np.asarray(nodes, dtype=np.int64), counts), list(map(_slot, flat)))
        shares = np.fromiter(map(_milli, flat), np.int64, len(flat))
        memory = np.fromiter(map(_slice_mem, flat), np.int64, len(flat))
        np.add.at(state.dev_milli_free, where, -shares)
        np.add.at(state.dev_mem_free, where, -memory)
        state.heavy_slices += _count_heavy(state, where, shares, memory)
    np.add.at(state.node_version, nodes, 1)
    kinds = [
        "cpu" if not k else "share" if k == 1 and sl[0].compute_milli < MILLI else f"{k}-dev"
        for sl, k in zip(slices, counts, strict=True)
    ]
    node_kinds = state.node_pod_kinds
    for (n, kind), count in Counter(zip(nodes, kinds, strict=True)).items():
        held = node_kinds[n] = node_kinds[n].copy()
        held[kind] = held.get(kind, 0) + count
    state.check_invariants()


def _pods_placed(allocations: Sequence[Allocation]) -> tuple[list[PodPlacement], list[PodRequest]]:
    """Every placement of the allocations with its pod (bulk path for one-pod workloads)."""
    groups = list(map(_placements, allocations))
    gangs = list(map(_pods, map(_workload, allocations)))
    if set(map(len, groups)) <= {1} and set(map(len, gangs)) <= {1}:
        placements = [g[0] for g in groups]
        pods = [g[0] for g in gangs]
        if list(map(_pod_name, placements)) == list(map(_name, pods)):
            return placements, pods
    placements = []
    pods = []
    for apl, wpods in zip(groups, gangs, strict=True):
        by_name = {p.name: p for p in wpods}
        placements.extend(apl)
        pods.extend([by_name[pl.pod] for pl in apl])
    return placements, pods


_placements = attrgetter("placements")
_workload = attrgetter("workload")
_pods = attrgetter("pods")
_pod_name = attrgetter("pod")
_name = attrgetter("name")
_node_name = attrgetter("node")
_slices = attrgetter("slices")
_cpu = attrgetter("cpu_milli")
_mem = attrgetter("memory_mib")
_slot = attrgetter("device_index")
_milli = attrgetter("compute_milli")
_slice_mem = attrgetter("memory_mib")


def allocate_many(state: ClusterState, records: Sequence[PodAlloc]) -> None:
    """Apply many records at once (vectorised), then check that nothing is over-allocated."""
    if not records:
        return
    _add_many(state, records, -1)
    state.check_invariants()
    np.add.at(state.node_version, [r.node for r in records], 1)
    shift_pod_kinds(state, records, 1)


SMALL_BATCH = 16
"""Up to this many records are applied one by one: `np.add.at` costs more than the loop on few."""


def _add_many(state: ClusterState, records: Sequence[PodAlloc], sign: int) -> None:
    if len(records) <= SMALL_BATCH:
        cpu_free, mem_free = state.cpu_free, state.mem_free
        milli_free, dev_mem_free = state.dev_milli_free, state.dev_mem_free
        for r in records:
            n = r.node
            cpu_free[n] += sign * r.cpu_milli
            mem_free[n] += sign * r.memory_mib
            for d, milli, mem in zip(r.devices, r.device_milli, r.device_memory_mib, strict=True):
                milli_free[n, d] += sign * milli
                dev_mem_free[n, d] += sign * mem
                if milli < MILLI and mem and state._heavy(n, d, milli, mem):
                    state.heavy_slices -= sign
        return
    nodes = [r.node for r in records]
    np.add.at(state.cpu_free, nodes, [sign * r.cpu_milli for r in records])
    np.add.at(state.mem_free, nodes, [sign * r.memory_mib for r in records])
    dev_nodes = [r.node for r in records for _ in r.devices]
    if dev_nodes:
        slots = [d for r in records for d in r.devices]
        shares = np.fromiter((m for r in records for m in r.device_milli), np.int64, len(slots))
        memory = np.fromiter((m for r in records for m in r.device_memory_mib), np.int64, len(slots))
        np.add.at(state.dev_milli_free, (dev_nodes, slots), sign * shares)
        np.add.at(state.dev_mem_free, (dev_nodes, slots), sign * memory)
        state.heavy_slices -= sign * _count_heavy(state, (dev_nodes, slots), shares, memory)


def _count_heavy(state: ClusterState, where: Any, milli: IntArray, held: IntArray) -> int:
    """How many of these shares hold more memory than their compute's share (ClusterState._heavy)."""
    size = state.dev_mem_size[where]
    return int(((size > 0) & (milli < MILLI) & (held > size * milli // MILLI)).sum())


def release_many(state: ClusterState, records: Sequence[PodAlloc]) -> None:
    """Give back many records at once (vectorised; unchecked: only for states built from them)."""
    if not records:
        return
    _add_many(state, records, 1)
    note_released(state, records)


def shift_free(state: ClusterState, records: Sequence[PodAlloc], sign: int) -> None:
    """Add the records' resources to the free amounts (sign 1) or take them back (-1), and nothing
    else: no node versions, no pods per node. A probe of how the free amounts would look: the
    caller takes it back, or completes the release with `note_released` (the two together are
    `release_many`)."""
    if records:
        _add_many(state, records, sign)


FreeAmounts = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]


def free_amounts(state: ClusterState) -> FreeAmounts:
    """A copy of what `shift_free` changes, for `restore_free`."""
    return (state.cpu_free.copy(), state.mem_free.copy(), state.dev_milli_free.copy(),
            state.dev_mem_free.copy(), state.heavy_slices)


def restore_free(state: ClusterState, saved: FreeAmounts) -> None:
    """Put back the free amounts `free_amounts` copied (in place: the arrays stay the same objects)."""
    cpu, mem, milli, dev_mem, heavy = saved
    np.copyto(state.cpu_free, cpu)
    np.copyto(state.mem_free, mem)
    np.copyto(state.dev_milli_free, milli)
    np.copyto(state.dev_mem_free, dev_mem)
    state.heavy_slices = heavy


def note_released(state: ClusterState, records: Sequence[PodAlloc]) -> None:
    """What `release_many` does besides the free amounts: node versions and pods per node."""
    if not records:
        return
    if len(records) <= SMALL_BATCH:
        for r in records:
            state.node_version[r.node] += 1
    else:
        np.add.at(state.node_version, [r.node for r in records], 1)
    shift_pod_kinds(state, records, -1)


def shift_pod_kinds(
    state: ClusterState, records: Sequence[PodAlloc], sign: int, strict: bool = False
) -> bool:
    """Count the records' pods in `node_pod_kinds` (sign 1) or take them out (-1); a kind whose
    count reaches 0 leaves its node's dict. `strict`: stop and return False (the counts then partly
    moved) where a count would fall below zero (a record taken out of a state that does not hold it);
    otherwise such a kind just leaves. True when every record was counted."""
    node_kinds = state.node_pod_kinds
    for r in records:
        kinds = node_kinds[r.node] = node_kinds[r.node].copy()
        kind = state.pod_kind(r)
        count = kinds.get(kind, 0) + sign
        if count > 0:
            kinds[kind] = count
        elif count == 0 or not strict:
            kinds.pop(kind, None)
        else:
            return False
    return True
