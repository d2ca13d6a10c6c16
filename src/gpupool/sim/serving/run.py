"""One serving run from its options: instances planned and placed, the trace simulated, metrics out.

Modes: `colocated` (every instance both phases, on the cluster's H100s, else its A100s),
`split-hh` (H100 prefill and decode pools), `split-ha` (H100 prefill, A100 decode), `split-hhcap`
(H100 prefill, power-capped H100 decode: the `h100-80gb-pcap` profile). Instances take `tp` devices
of one node; a split mode gives `prefill_share` of its H100 instances to prefill (split-ha: every
H100 prefills, every A100 decodes).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import numpy as np

from gpupool.core.fabric.model import Fabric
from gpupool.core.model import Node
from gpupool.core.scheduling.topology import FabricView
from gpupool.errors import InvalidInput
from gpupool.sim.serving.engine import EngineOptions, Instance, Outcome, ServingSim
from gpupool.sim.serving.metrics import latency_table, unloaded
from gpupool.sim.serving.network import DEFAULT_NIC_GBPS, KVNetwork, TrainingSpec
from gpupool.sim.serving.placement import InstanceSpec, Placement, place_instances
from gpupool.sim.serving.profiles import (
    MODELS,
    ProfileBook,
    StepProfile,
    instance_kv_tokens,
    splitwise_decode_lookup,
)
from gpupool.sim.serving.trace import Request

H100, A100 = "H100-SXM-80GB", "A100-80GB"
HARDWARE_OF_DEVICE = {H100: "h100-80gb", A100: "a100-80gb"}
PCAP_POWER = 0.7
"""The power a capped H100 draws at most, as a fraction of rated: the profile file records none for
it; 70 % is the cap Splitwise's HHcap design applies to its token machines (our reading)."""
LONGEST_REQUEST_TOKENS = 8192
"""An instance must hold the weights and at least one request of this many tokens."""


class Mode(StrEnum):
    COLOCATED = "colocated"
    SPLIT_HH = "split-hh"
    SPLIT_HA = "split-ha"
    SPLIT_HHCAP = "split-hhcap"


@dataclass(frozen=True, slots=True)
class ServeOptions:
    model: str = "llama2-70b"
    mode: Mode = Mode.SPLIT_HH
    placement: Placement = Placement.BEST_FIT
    router: str = "jsq"
    tp: int = 8
    prefill_share: float = 0.5
    overlap: bool = False
    first_token: str = "prefill"
    token_budget: int = 2048
    max_batch: int = 64
    nic_gbps: float = DEFAULT_NIC_GBPS
    rails: int = 1
    routing: str = "static"
    """`static` (one fixed path per host pair, from the forwarding tables) or `pooled` (a leaf's
    uplinks as one pool: the earlier rounds); see `network`."""
    mixed_pool: bool = False
    """Split modes: decode instances run prompts while the prefill queues are long (Splitwise's
    mixed pool, `EngineOptions.mixed_pool`)."""
    """HCAs a host has, each on its own plane of the fabric (a DGX-H100: 8); flows stripe across them."""
    training: TrainingSpec = field(default_factory=TrainingSpec)
    seed: int = 0
    decode_model: str = "fit"
    """`fit` (the measured batch sweep, `StepProfile.decode`) or `splitwise` (Splitwise's simulator's
    lookup by batch tokens: a step's time hardly grows with its batch; a sensitivity)."""
    slo_reference: str = "a100-80gb"
    """The hardware whose unloaded run (tp as the instances') the slowdowns are taken against:
    Splitwise states its SLOs against the request alone on a DGX-A100 (our reading of its Table IV)."""


def _device_model(node: Node) -> str:
    return node.devices[0].model if node.devices else ""


def plan_instances(
    nodes: Sequence[Node], book: ProfileBook, opt: ServeOptions, reserved_nodes: int = 0
) -> tuple[list[InstanceSpec], list[StepProfile]]:
    """The instances a mode runs on this cluster and each one's profile; raises InvalidInput for a
    model or hardware without a profile, or a cluster too small for one instance."""
    arch = MODELS.get(opt.model)
    if arch is None or opt.model not in book.models():
        known = ", ".join(m for m in book.models() if m in MODELS) or "none"
        raise InvalidInput(f"No profile for the model {opt.model!r}; profiles exist for: {known}.")
    count: dict[str, int] = {}
    memory: dict[str, int] = {}
    for n in nodes:
        model = _device_model(n)
        if model in HARDWARE_OF_DEVICE and len(n.devices) >= opt.tp:
            count[model] = count.get(model, 0) + len(n.devices) // opt.tp
            memory[model] = n.devices[0].memory_mib
    if reserved_nodes:
        per = max((len(n.devices) // opt.tp for n in nodes), default=0)
        for model in (A100, H100):
            take = min(count.get(model, 0), reserved_nodes * per)
            count[model] = count.get(model, 0) - take
            reserved_nodes -= take // max(per, 1)
    if not count:
        have = sorted({_device_model(n) for n in nodes})
        raise InvalidInput(
            f"No node has {opt.tp} devices of a profiled kind ({', '.join(HARDWARE_OF_DEVICE)}); "
            f"this cluster has {', '.join(have) or 'no devices'}."
        )
    for model, mib in memory.items():
        if instance_kv_tokens(arch, mib * 2**20, opt.tp) < LONGEST_REQUEST_TOKENS:
            need = (arch.weight_bytes + LONGEST_REQUEST_TOKENS * arch.kv_bytes_per_token) / 0.9 / 2**30
            raise InvalidInput(
                f"One {opt.model} instance needs {need:,.0f} GiB of device memory (weights "
                f"{arch.weight_bytes / 2**30:,.0f} GiB and the KV cache of one "
                f"{LONGEST_REQUEST_TOKENS}-token request, at 90 % use); {opt.tp} x {model} hold "
                f"{opt.tp * mib / 1024:,.0f} GiB. "
                "Give a larger --tp or bigger devices."
            )
    h100, a100 = count.get(H100, 0), count.get(A100, 0)
    if opt.mode is Mode.COLOCATED:
        device = H100 if h100 else A100
        roles = [("both", device, HARDWARE_OF_DEVICE[device])] * (h100 or a100)
    elif opt.mode is Mode.SPLIT_HA:
        if not h100 or not a100:
            raise InvalidInput(
                f"split-ha runs prefill on H100 and decode on A100; this cluster has "
                f"{h100} H100 and {a100} A100 instances of tp {opt.tp}."
            )
        roles = [("prefill", H100, "h100-80gb")] * h100 + [("decode", A100, "a100-80gb")] * a100
    else:
        if h100 < 2:
            raise InvalidInput(
                f"{opt.mode} needs at least two H100 instances of tp {opt.tp}; this cluster has {h100}."
            )
        prefill = min(max(1, round(h100 * opt.prefill_share)), h100 - 1)
        decode_hw = "h100-80gb-pcap" if opt.mode is Mode.SPLIT_HHCAP else "h100-80gb"
        roles = [("prefill", H100, "h100-80gb")] * prefill + [("decode", H100, decode_hw)] * (h100 - prefill)
    specs = [InstanceSpec(role, device, opt.tp) for role, device, _ in roles]
    profiles = [book.get(opt.model, hw, opt.tp) for _, _, hw in roles]
    if opt.decode_model == "splitwise":
        profiles = [
            replace(p, decode_by_tokens=splitwise_decode_lookup(book.points[(p.model, p.hardware, p.tp)]))
            for p in profiles
        ]
    elif opt.decode_model != "fit":
        raise InvalidInput(f"Unknown decode model {opt.decode_model!r}; use fit or splitwise.")
    return specs, profiles


def run_serving(
    nodes: Sequence[Node],
    fabric: Fabric | None,
    requests: Sequence[Request],
    book: ProfileBook,
    opt: ServeOptions,
    prices: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Place, simulate and measure one run (see the module docstring); a dict ready for JSON."""
    wall = time.perf_counter()
    train_nodes = opt.training.gangs * opt.training.nodes_per_gang
    specs, profiles = plan_instances(nodes, book, opt, reserved_nodes=train_nodes)
    arch = MODELS[opt.model]
    view = FabricView.from_fabric(fabric, nodes) if fabric is not None else None
    kv_ratio = 1.0
    placed = place_instances(
        nodes, view, specs, opt.placement, opt.seed, opt.training.gangs, opt.training.nodes_per_gang, kv_ratio
    )
    net = KVNetwork(view, opt.nic_gbps, opt.training, rails=opt.rails, fabric=fabric, routing=opt.routing)
    net.add_training(placed.training_nodes)
    instances = []
    for i, (spec, prof, node) in enumerate(zip(specs, profiles, placed.instance_nodes, strict=True)):
        mib = nodes[node].devices[0].memory_mib
        instances.append(
            Instance(
                i,
                spec.role,
                node,
                prof,
                instance_kv_tokens(arch, mib * 2**20, spec.tp),
                opt.token_budget,
                opt.max_batch,
            )
        )
    sim = ServingSim(
        instances,
        requests,
        net,
        EngineOptions(
            opt.router, opt.overlap, opt.first_token, arch.kv_bytes_per_token, arch.layers, opt.mixed_pool
        ),
    )
    outcome = sim.run()
    ref = book.get(opt.model, opt.slo_reference, opt.tp)
    table = latency_table(
        {"ttft": outcome.ttft, "tbt": outcome.tbt, "e2e": outcome.e2e}, unloaded(requests, ref)
    )
    span = max((r.arrival_s for r in requests), default=0.0) - min(
        (r.arrival_s for r in requests), default=0.0
    )
    finished = int(np.isfinite(outcome.e2e).sum())
    rate = len(requests) / span if span > 0 else 0.0
    price = prices or {}
    usd_h = sum(spec.tp * price.get(spec.device_model, 0.0) for spec in specs)
    power_kw = sum(_power_w(p) for p in profiles) / 1000.0
    return {
        "mode": str(opt.mode),
        "placement": str(opt.placement),
        "router": opt.router,
        "routing": opt.routing,
        "seed": opt.seed,
        "overlap": opt.overlap,
        "first_token": opt.first_token,
        "requests": len(requests),
        "finished": finished,
        "rate_rps": rate,
        "instances": {
            "prefill": sum(s.role == "prefill" for s in specs),
            "decode": sum(s.role == "decode" for s in specs),
            "colocated": sum(s.role == "both" for s in specs),
        },
        "latency": table,
        "mixed_pool": opt.mixed_pool,
        "prompts_on_decode_instances": sim.borrowed,
        "usd_per_hour": usd_h,
        "power_kw": power_kw,
        "requests_per_usd": rate * 3600 / usd_h if usd_h > 0 else math.nan,
        "rps_per_kw": rate / power_kw if power_kw > 0 else math.nan,
        "kv_bytes": net.kv_bytes,
        "kv_cross_leaf_bytes": net.cross_leaf_bytes,
        "kv_cross_spine_bytes": net.cross_spine_bytes,
        "links": net.link_report(outcome.end_s),
        "kv_wait": _kv_wait(outcome),
        "training_slowdown": net.training_slowdown(outcome.end_s),
        "busy_share": float(np.mean(outcome.busy_s)) / outcome.end_s if outcome.end_s > 0 else 0.0,
        "cdf_s": {
            k: _quantiles(v) for k, v in (("ttft", outcome.ttft), ("tbt", outcome.tbt), ("e2e", outcome.e2e))
        },
        "sim_wall_s": time.perf_counter() - wall,
    }


def _kv_wait(outcome: Outcome) -> dict[str, float]:
    """How long KV caches took to be ready after their prefill (p50/p99 over the requests that moved),
    and what of the slowest 1 % of TTFTs they make up: the part placement can change."""
    wait = outcome.kv_wait[np.isfinite(outcome.kv_wait)]
    ttft = np.where(np.isnan(outcome.ttft), np.inf, outcome.ttft)
    tail = ttft >= np.percentile(ttft, 99) if len(ttft) else np.zeros(0, dtype=bool)
    tail &= np.isfinite(ttft)
    tail_wait = np.nan_to_num(outcome.kv_wait[tail], nan=0.0)
    return {
        "p50_s": float(np.percentile(wait, 50)) if len(wait) else 0.0,
        "p99_s": float(np.percentile(wait, 99)) if len(wait) else 0.0,
        "ttft_tail_s": float(ttft[tail].mean()) if tail.any() else 0.0,
        "ttft_tail_kv_s": float(tail_wait.mean()) if tail.any() else 0.0,
    }


def _quantiles(values: np.ndarray) -> list[float]:
    """The 0th..100th percentiles (unfinished requests as inf, written as null by the JSON writer)."""
    finite = np.where(np.isnan(values), np.inf, values)
    return [float(x) for x in np.percentile(finite, np.arange(101))] if len(finite) else []


def _power_w(profile: StepProfile) -> float:
    if profile.hardware.endswith("pcap"):
        return profile.tp * 700.0 * PCAP_POWER
    return profile.power_w
