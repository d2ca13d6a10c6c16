"""The replay's network truth: running gangs on the fabric's link pools, their rates and traffic.

`CommTracker` keeps its own `FabricView` (the scheduler's view is another object: what the
scheduler estimates never feeds the truth). Every start, stop and link change re-rates the running
multi-node gangs (`rates`); `advance(now_s)` integrates what held since the last event: bytes that
crossed leaves and spine groups, link-pool utilisation (a histogram, time-weighted, over pools that
carry traffic) and GPU-seconds lost to communication. A link pool is what the view shares flows on:
a node's HCA links, a leaf domain's uplinks, a spine group's uplinks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpupool.core.fabric.model import Fabric
from gpupool.core.model import Node, Workload
from gpupool.core.scheduling.topology import ACCESS, LEAF_UP, SPINE_UP, FabricView
from gpupool.sim.comm import (
    MIB,
    CommModel,
    EstimateMode,
    JobComm,
    assign_classes,
    class_counts,
    packed_nodes,
    path_latency_ns,
    slowdown,
    step_time_s,
)

UTIL_BINS = 2000
UTIL_MAX = 2.0
MIN_RATE = 1e-6
"""A gang whose every path is cut makes (almost) no progress until a link comes back."""


@dataclass(slots=True)
class _Gang:
    nodes: tuple[int, ...]
    gpus: float
    job: JobComm
    leaves: tuple[int, ...]
    spines: tuple[int, ...]
    bytes_per_step: float
    slowdown: float = 1.0
    step_s: float = math.inf


class CommTracker:
    """Truth of the communication model for one replay (see the module docstring)."""

    def __init__(self, fabric: Fabric, nodes: Sequence[Node], model: CommModel,
                 profiles: Mapping[str, JobComm]) -> None:
        self.net = FabricView.from_fabric(fabric, nodes)
        self.model = model
        self.profiles = profiles
        self.ref_gbps = max((link.data_rate_gbps for _, _, link in fabric.ca_leaf.values()), default=100.0)
        self.leaf_size = int(np.bincount(self.net.leaf_id[self.net.leaf_id >= 0]).max(initial=1))
        self.gangs: dict[str, _Gang] = {}
        self.last_s: float | None = None
        self.cross_leaf_bytes = 0.0
        self.cross_spine_bytes = 0.0
        self.lost_gpu_s = 0.0
        self.util_hist = np.zeros(UTIL_BINS + 1)
        self.util_max = 0.0
        self.placed = 0
        self.fit_one_leaf = 0
        self.in_one_leaf = 0
        self.hops: list[int] = []
        self.bottleneck_gangs: list[int] = []
        self.across_failed = 0
        self.on_degraded = 0
        self._pool_keys: dict[tuple[int, int], list[tuple[str, int, str, int]]] = {}

    # ------------------------------------------------------------------ events

    def advance(self, now_s: float) -> None:
        """Integrate traffic, utilisation and lost GPU-seconds since the last call."""
        dt = 0.0 if self.last_s is None else now_s - self.last_s
        self.last_s = now_s
        if dt <= 0 or not self.gangs:
            return
        for gang in self.gangs.values():
            if not math.isfinite(gang.step_s) or gang.step_s <= 0:
                continue
            rate_bps = gang.bytes_per_step / gang.step_s
            if len(gang.leaves) > 1:
                self.cross_leaf_bytes += len(gang.leaves) * rate_bps * dt
            if len(gang.spines) > 1:
                self.cross_spine_bytes += len(gang.spines) * rate_bps * dt
            self.lost_gpu_s += gang.gpus * (1.0 - 1.0 / gang.slowdown) * dt
        utils = list(self.pool_utilisation().values())
        if utils:
            values = np.asarray(utils)
            self.util_max = max(self.util_max, float(values.max()))
            bins = np.minimum((values / UTIL_MAX * UTIL_BINS).astype(np.int64), UTIL_BINS)
            np.add.at(self.util_hist, bins, dt)

    def start(self, wid: str, nodes: Sequence[int], gpus: float) -> bool:
        """A gang started on `nodes` (scheduler node indices); False for work on one node (not tracked)."""
        distinct = tuple(sorted(set(nodes)))
        job = self.profiles.get(wid)
        if len(distinct) < 2 or job is None:
            return False
        leaves = tuple(sorted(set(self.net.leaf_id[list(distinct)].tolist())))
        spines = tuple(sorted(set(self.net.spine_id[list(distinct)].tolist())))
        p = len(distinct)
        per_step = 2.0 * (p - 1) / p * job.spec.gradient_mib * MIB
        gang = _Gang(distinct, gpus, job, leaves, spines, per_step)
        self._placement_stats(gang)
        self.gangs[wid] = gang
        self.net.add_gang(wid, distinct, 0.0)
        self._bottleneck_count(gang)
        return True

    def stop(self, wid: str) -> bool:
        """The gang ended or was stopped; False when it was not tracked."""
        if self.gangs.pop(wid, None) is None:
            return False
        self.net.remove_gang(wid)
        return True

    def set_link(self, key: tuple[str, int, str, int], healthy: bool) -> bool:
        return self.net.set_link(key, healthy=healthy)

    def rates(self) -> dict[str, float]:
        """Every tracked gang's progress rate now (work seconds per second)."""
        out: dict[str, float] = {}
        for wid, gang in self.gangs.items():
            job = gang.job
            if not job.passed:
                gang.slowdown, gang.step_s = 1.0, math.inf
                out[wid] = 1.0
                continue
            bw = self._bandwidth(gang)
            tier = 2 if len(gang.spines) > 1 else 1 if len(gang.leaves) > 1 else 0
            alpha = self.model.base_alpha_s
            s = slowdown(job.spec, len(gang.nodes), bw, self.ref_gbps, tier, alpha)
            gang.slowdown = s if math.isfinite(s) else 1.0 / MIN_RATE
            latency = path_latency_ns(tier)
            gang.step_s = step_time_s(job.spec, len(gang.nodes), bw, self.ref_gbps, latency, alpha)
            out[wid] = max(MIN_RATE, job.origin_slowdown / gang.slowdown)
        return out

    def pool_utilisation(self) -> dict[tuple[int, int], float]:
        """(kind, owner) -> carried Gb/s over available Gb/s of every link pool that carries traffic
        at the current rates (`rates`), capped at UTIL_MAX (a dead pool counts as UTIL_MAX): the
        values `advance` histograms."""
        carried: dict[tuple[int, int], float] = {}
        for gang in self.gangs.values():
            if not math.isfinite(gang.step_s) or gang.step_s <= 0:
                continue
            gbps = gang.bytes_per_step / gang.step_s * 8 / 1e9
            for pool in self._pools(gang):
                carried[pool] = carried.get(pool, 0.0) + gbps
        out = {}
        for (kind, owner), gbps in carried.items():
            cap = float(self.net.avail[kind][owner])
            out[(kind, owner)] = min(gbps / cap, UTIL_MAX) if cap > 0 and math.isfinite(cap) else UTIL_MAX
        return out

    def bottleneck_utilisation(self, pools: Mapping[tuple[int, int], float] | None = None
                               ) -> dict[str, float]:
        """Each tracked gang's bottleneck pool's utilisation (`pool_utilisation`, or `pools` when
        given): what the congestion rule compares with its threshold.

        The bottleneck is the pool with the smallest per-flow share (as `_bottleneck_count` picks
        it: the slowest cable as the server sees it), among the pools a move can relieve: the leaf
        and spine-group uplinks the gang crosses, and access links it shares with another gang.
        Not simply the most utilised pool, and not its own HCA links: one busy gang fills those
        alone wherever it runs, so a gang packed in one leaf would be "congested" by its own
        traffic and moved again and again. A gang with no such pool counts 0."""
        util = self.pool_utilisation() if pools is None else pools
        out = {}
        for wid, gang in self.gangs.items():
            pool = self._bottleneck_pool(gang, movable=True)
            out[wid] = util.get(pool, 0.0) if pool is not None else 0.0
        return out

    def pool_links(self, pool: tuple[int, int]) -> list[tuple[str, int, str, int]]:
        """The fabric links (`Link.key`) of one link pool: what a telemetry sample sets the load of."""
        found = self._pool_keys.get(pool)
        if found is None:
            key_of = {k: key for key, k in self.net.link_index.items()}
            sel = np.flatnonzero((self.net.owner_kind == pool[0]) & (self.net.owner_id == pool[1]))
            found = self._pool_keys[pool] = [key_of[k] for k in sel.tolist() if k in key_of]
        return found

    # ------------------------------------------------------------------ helpers

    def _bandwidth(self, gang: _Gang) -> float:
        share = self.net.share_gbps(gang.nodes, joining=False)
        if len(gang.spines) > 1:
            share *= self.model.cross_spine_efficiency
        elif len(gang.leaves) > 1:
            share *= self.model.cross_leaf_efficiency
        return min(share, self.ref_gbps)

    def _pools(self, gang: _Gang) -> list[tuple[int, int]]:
        pools = [(ACCESS, n) for n in gang.nodes]
        if len(gang.leaves) > 1:
            pools += [(LEAF_UP, d) for d in gang.leaves]
        if len(gang.spines) > 1:
            pools += [(SPINE_UP, g) for g in gang.spines]
        return [p for p in pools if math.isfinite(float(self.net.avail[p[0]][p[1]]))]

    def _placement_stats(self, gang: _Gang) -> None:
        self.placed += 1
        self.hops.append(self.net.max_hops(gang.nodes))
        if len(gang.nodes) <= self.leaf_size:
            self.fit_one_leaf += 1
            self.in_one_leaf += int(len(gang.leaves) == 1)
        pools = self._pools(gang)
        if any(float(self.net.avail[k][o]) <= 0 for k, o in pools):
            self.across_failed += 1
        elif any(self._has_failed_link(k, o) for k, o in pools):
            self.on_degraded += 1

    def _has_failed_link(self, kind: int, owner: int) -> bool:
        net = self.net
        sel = (net.owner_kind == kind) & (net.owner_id == owner)
        return bool((~net.healthy[sel]).any())

    def _bottleneck_pool(self, gang: _Gang, movable: bool = False) -> tuple[int, int] | None:
        """The gang's pool with the smallest per-flow share (the first such in `_pools` order);
        `movable`: only uplinks and access links shared with another gang."""
        worst, found = math.inf, None
        for kind, owner in self._pools(gang):
            flows = int(self.net.flows[kind][owner])
            if movable and kind == ACCESS and flows < 2:
                continue
            share = float(self.net.avail[kind][owner]) / max(flows, 1)
            if found is None or share < worst:
                worst, found = share, (kind, owner)
        return found

    def _bottleneck_count(self, gang: _Gang) -> None:
        pool = self._bottleneck_pool(gang)
        self.bottleneck_gangs.append(0 if pool is None else int(self.net.flows[pool[0]][pool[1]]))

    # ------------------------------------------------------------------ report

    def report(self, end_s: float, total_gpus: float, span_s: float) -> dict[str, Any]:
        self.advance(end_s)
        total = self.util_hist.sum()
        p99 = 0.0
        if total > 0:
            at = int(np.searchsorted(np.cumsum(self.util_hist), 0.99 * total))
            p99 = min(at, UTIL_BINS) * UTIL_MAX / UTIL_BINS
        return {
            "gangs_across_failed_links": self.across_failed,
            "gangs_on_degraded_link_pools": self.on_degraded,
            "cross_leaf_bytes": self.cross_leaf_bytes,
            "cross_spine_bytes": self.cross_spine_bytes,
            "link_util_max": self.util_max,
            "link_util_p99": p99,
            "comm": {
                "model": self.model.model_dump(mode="json"),
                "classes": class_counts(self.profiles),
                "multi_node_gangs": self.placed,
                "fit_one_leaf": self.fit_one_leaf,
                "placed_in_one_leaf": self.in_one_leaf,
                "hops_mean": float(np.mean(self.hops)) if self.hops else 0.0,
                "gangs_per_bottleneck_mean": (float(np.mean(self.bottleneck_gangs))
                                              if self.bottleneck_gangs else 0.0),
                "gangs_per_bottleneck_max": int(max(self.bottleneck_gangs, default=0)),
                "lost_gpu_hours": self.lost_gpu_s / 3600.0,
                "lost_alloc_pct": 100.0 * self.lost_gpu_s / max(total_gpus * span_s, 1e-9),
            },
        }


@dataclass(frozen=True, slots=True)
class CommSetup:
    """What a replay needs for the communication model: the fabric, the model, each job's class."""

    fabric: Fabric
    model: CommModel
    profiles: Mapping[str, JobComm]

    def estimate_ratio(self, workload: Workload) -> float | None:
        """What the scheduler is told of the job's communication ratio (`JobComm.estimate_ratio`,
        set by the estimate mode: exact, noisy or none), never the class's truth itself."""
        job = self.profiles.get(workload.id)
        return None if job is None else job.estimate_ratio


@dataclass(frozen=True, slots=True)
class LinkFailure:
    """A fabric link (by `Link.key`) fails at `at_s` and is repaired `repair_after_s` later."""

    at_s: float
    key: tuple[str, int, str, int]
    repair_after_s: float = math.inf


def comm_setup(fabric: Fabric, jobs: Sequence[Any], model: CommModel, seed: int,
               devices_per_node: int, estimate: EstimateMode = EstimateMode.EXACT,
               error: float = 0.5) -> CommSetup:
    """The model's classes drawn for `jobs` (TraceJobs; every one taken as passed: the trace files
    gpupool reads carry no job status), with what the scheduler is told of each (`assign_classes`)."""
    profiles = assign_classes(
        ((j.workload.id, packed_nodes([p.num_devices for p in j.workload.pods], devices_per_node), True)
         for j in jobs), model, seed, estimate, error)
    return CommSetup(fabric, model, profiles)
