"""What a gang's placement costs in communication, in GPU-seconds, from the fabric's alpha-beta model.

API:
  - `CommModel(message_mb=, step_compute_s=, base_alpha_s=, cross_leaf_efficiency=,
    cross_spine_efficiency=)`: the scheduler's assumption about a data-parallel job: every step
    computes for `step_compute_s` and all-reduces `message_mb` of gradients over a ring of its nodes
    (`core.fabric.collective.ring_allreduce_s`), with beta from the placement's bottleneck bandwidth
    (shared with the gangs already on its links, see `FabricView.share_gbps`) times the share of it
    a flow gets once it crosses leaves (4 hops) or spine groups (6 hops): static ECMP hashing and
    congestion control leave a crossing flow only part of its path (collisions), which an operator
    measures with nccl-tests across leaves; the defaults (0.6 and 0.5) are this scheduler's
    assumption, not the replay's truth (sim/comm.py draws its own). Alpha comes from the hop count.
  - `slowdown(ranks, gbps, hops)`: T_net / T_comp, the time lost to communication per unit of work.
  - `loss_gpu_s(view, nodes, gpus, run_s)`: GPU-seconds the gang is expected to lose to communication
    on `nodes` (0 on one node), inf when a link pool it needs is dead.
  - `others_gpu_s(view, nodes)`: GPU-seconds the gangs already on those link pools are expected to
    lose because one more gang shares them.
  - `packed_slowdown(view, nodes)`: the slowdown the same nodes' access links alone would give (the
    gang inside one leaf): what spreading is compared with.
  - `ratio(ref_gbps)` / `for_ratio(ratio, ref_gbps)`: a job's communication ratio, T_net / T_comp of
    its step on a packed large ring at `ref_gbps` (the bandwidth term, 2 x message / bandwidth, over
    the compute time), and the same model with the compute step set so that its ratio is `ratio`
    (one job's own estimate; the model itself is the assumption for a job whose ratio is unknown).
  - `for_job(ratio, view)`: `for_ratio` at the view's reference bandwidth (`FabricView.ref_gbps`)
    when the job's ratio is known, else the model itself.

`run_s` is the scheduler's own estimate of the remaining run time (user's or history's); never the
job's real duration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpupool.core.fabric.collective import DEFAULT_BASE_ALPHA_S, ring_allreduce_s
from gpupool.core.fabric.model import DEFAULT_CABLE_LATENCY_NS, DEFAULT_SWITCH_LATENCY_NS
from gpupool.core.scheduling.topology import ACCESS, FabricView

DEFAULT_REF_GBPS = 200.0
"""The reference bandwidth a ratio is stated at when the view knows no link rates."""


@dataclass(frozen=True, slots=True)
class CommModel:
    """The scheduler's communication assumption for a multi-node gang (see the module docstring)."""

    message_mb: float = 1000.0
    step_compute_s: float = 1.0
    base_alpha_s: float = DEFAULT_BASE_ALPHA_S
    cross_leaf_efficiency: float = 0.6
    cross_spine_efficiency: float = 0.5

    def efficiency(self, hops: int) -> float:
        """The share of its bottleneck bandwidth a flow of `hops` links gets (1 inside one leaf)."""
        if hops <= 2:
            return 1.0
        return self.cross_leaf_efficiency if hops <= 4 else self.cross_spine_efficiency

    def step_net_s(self, ranks: int, gbps: float, hops: int) -> float:
        """One ring all-reduce over `ranks` nodes at `gbps` per flow across `hops` links."""
        if ranks <= 1 or math.isinf(gbps):
            return 0.0
        gbps *= self.efficiency(hops)
        if gbps <= 0:
            return math.inf
        switches = max(hops - 1, 0)
        latency_ns = switches * DEFAULT_SWITCH_LATENCY_NS + hops * DEFAULT_CABLE_LATENCY_NS
        alpha = self.base_alpha_s + latency_ns * 1e-9
        return ring_allreduce_s(ranks, self.message_mb * 1e6, alpha, 8.0 / (gbps * 1e9))

    def slowdown(self, ranks: int, gbps: float, hops: int) -> float:
        if math.isinf(self.step_compute_s):  # a job that does not communicate (ratio 0)
            return 0.0
        return self.step_net_s(ranks, gbps, hops) / self.step_compute_s

    def ratio(self, ref_gbps: float) -> float:
        """T_net / T_comp of a step on a packed large ring at `ref_gbps` (bandwidth term only)."""
        return _bandwidth_term_s(self.message_mb, ref_gbps) / self.step_compute_s

    def for_ratio(self, ratio: float, ref_gbps: float) -> CommModel:
        """The same model for a job whose `ratio` at `ref_gbps` is known: only its compute step
        changes, so every slowdown scales by ratio / self.ratio(ref_gbps)."""
        if not ratio > 0:
            return replace(self, step_compute_s=math.inf)
        return replace(self, step_compute_s=_bandwidth_term_s(self.message_mb, ref_gbps) / ratio)

    def for_job(self, ratio: float | None, view: FabricView) -> CommModel:
        """`for_ratio` at the view's reference bandwidth when the job's ratio is known; else this
        model, the uniform assumption (the scheduler knows hop counts only)."""
        if ratio is None:
            return self
        return self.for_ratio(ratio, view.ref_gbps if view.ref_gbps > 0 else DEFAULT_REF_GBPS)

    def loss_gpu_s(self, view: FabricView, nodes: Sequence[int], gpus: float, run_s: float) -> float:
        distinct = sorted(set(nodes))
        if len(distinct) < 2:
            return 0.0
        if not view.reachable(distinct):
            return math.inf
        lost = self.slowdown(len(distinct), view.share_gbps(distinct), view.max_hops(distinct))
        return gpus * run_s * lost if lost > 0 else 0.0  # nothing lost, however long it runs

    def others_gpu_s(self, view: FabricView, nodes: Sequence[int]) -> float:
        total = 0.0
        for avail, flows, stake in view.sharing(nodes):
            if flows <= 0 or stake <= 0 or avail <= 0 or math.isinf(avail):
                continue
            before = self.slowdown(2, avail / flows, 2)
            after = self.slowdown(2, avail / (flows + 1), 2)
            total += stake * (after - before)  # each of them slows by the same step
        return total

    def packed_slowdown(self, view: FabricView, nodes: Sequence[int], own: Sequence[int] = ()) -> float:
        """Its slowdown on `nodes`' host links with one more flow on each; `own`: nodes whose flow
        is already the gang's (a running gang that keeps them), not counted twice."""
        distinct = sorted(set(nodes))
        if len(distinct) < 2:
            return 0.0
        at = np.asarray(distinct, dtype=np.int64)
        others = view.flows[ACCESS][at] - np.isin(at, own) if own else view.flows[ACCESS][at]
        share = view.avail[ACCESS][at] / (others + 1)
        return self.slowdown(len(distinct), float(share.min()), 2)


def _bandwidth_term_s(message_mb: float, gbps: float) -> float:
    """A large ring all-reduce's bandwidth term: twice the message over the bandwidth."""
    return 2.0 * message_mb * 1e6 * 8.0 / (gbps * 1e9)
