"""Benchmark: prefill/decode LLM serving in the simulator (Azure LLM traces 2023, Splitwise's profiles).

Three parts, each printing a table and writing its JSON under bench/results/:

- `reproduce` (Poisson arrivals at the trace's rate x scale, its requests' token counts, as
  Splitwise's simulator replays them): Splitwise's iso-cost comparison (Llama-2-70B, DGX
  machines of 8 GPUs, tensor parallelism 8, the code and conversation traces): the highest
  request rate (trace rate x scale, found by bisection) at which all nine SLOs hold, for
  co-located H100 and A100 clusters and the split designs (HH, HHcap on the same machines; HA at
  the same cost), and the ratio of each to co-located H100. Splitwise's scale by default: the cost
  of 40 DGX-H100 (`--machines`), instances of up to 512 requests an iteration; `--decode-model
  splitwise` takes its simulator's decode lookup instead of the measured batch sweep. No fabric:
  every machine's KV cache leaves at 400 Gb/s.
- `fabric`: a 3-level fat tree, 2:1 oversubscribed at the leaves, training gangs beside the
  service, Poisson arrivals; fabric-blind (best-fit placement, JSQ routing) against fabric-aware
  (network-aware placement with the `fabric` router, and with `fabric-local`) at the same load,
  over seeds (training placement and arrivals), flows on the forwarding tables' static routes
  (`--routing pooled`: a leaf's uplinks as one pool, the earlier rounds), with
  95 % intervals (t distribution) of the cross-spine KV bytes and p99 TTFT, and their ratios.
- `speed`: one hour of the conversation trace, wall seconds of the simulation.

    python bench/pd_serving.py reproduce
    python bench/pd_serving.py reproduce --prices splitwise --traces conv  # Splitwise's prices, mixed pool
    python bench/pd_serving.py reproduce --prices splitwise --decode-model splitwise  # and its decode lookup
    python bench/pd_serving.py fabric --rails 8 --model bloom-176b  # 8 HCAs a host, a larger KV cache
    python bench/pd_serving.py fabric --seeds 1,2,3,4,5 --rate-scale 12 --limit-s 300
    python bench/pd_serving.py fabric --sides fabric-blind --seeds 1 --rate-scale 14  # the load edge
    python bench/pd_serving.py speed
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from gpupool.core.fabric.generate import fat_tree
from gpupool.core.fabric.rates import LinkSpeed
from gpupool.providers.nodespec import nodes_from_spec
from gpupool.sim.datadir import require_data_dir
from gpupool.sim.serving.network import TrainingSpec
from gpupool.sim.serving.placement import Placement
from gpupool.sim.serving.profiles import ProfileBook
from gpupool.sim.serving.run import Mode, ServeOptions, run_serving
from gpupool.sim.serving.trace import Request, load_azure

PRICES = {"H100-SXM-80GB": 2.5, "A100-80GB": 1.8}  # the profiles' reference prices (price book default)
# Splitwise's own cost model (its simulator's iso-cost sizing: a DGX-H100 costs 4.76 / 2.21 = 2.15 DGX-A100s,
# so 40 DGX-H100 cost what 86 DGX-A100 do); the H100 price kept, the A100 scaled to that ratio
SPLITWISE_PRICES = {"H100-SXM-80GB": 2.5, "A100-80GB": 2.5 * 2.21 / 4.76}
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def _trace(
    kind: str, scale: float, limit_s: float | None = None, poisson_seed: int | None = None
) -> list[Request]:
    path = require_data_dir() / "azure-llm-2023" / f"AzureLLMInferenceTrace_{kind}.csv"
    return load_azure(path, scale, limit_s, poisson_seed)


def _book() -> ProfileBook:
    return ProfileBook.from_csv(require_data_dir() / "splitwise-perf" / "perf_model.csv")


def max_rate(
    book: ProfileBook,
    kind: str,
    cluster: str,
    opt: ServeOptions,
    poisson_seed: int | None = 0,
    limit_s: float | None = None,
    lo: float = 0.05,
    hi: float = 16.0,
    steps: int = 9,
    prices: dict[str, float] | None = None,
) -> tuple[float, dict[str, Any]]:
    """The highest rate scale in [lo, hi] at which every SLO holds (bisection on a log scale)."""
    nodes = nodes_from_spec(cluster)
    prices = prices or PRICES

    def run(scale: float) -> dict[str, Any]:
        result = run_serving(nodes, None, _trace(kind, scale, limit_s, poisson_seed), book, opt, prices)
        result["rate_scale"] = scale
        return result

    best = run(lo)
    if not best["latency"]["slo_met"]:
        return 0.0, best
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        result = run(mid)
        if result["latency"]["slo_met"]:
            lo, best = mid, result
        else:
            hi = mid
    return lo, best


H100_TO_A100_COST = 4.76 / 2.21
"""Splitwise's cost ratio of a DGX-H100 to a DGX-A100 (its iso-cost sizing: 40 DGX-H100 = 86 DGX-A100)."""
SPLIT_SHARES = [0.25, 0.375, 0.5, 0.625, 0.75, 0.875]


def designs(machines: int, prices: str) -> list[tuple[str, str, Mode, list[float]]]:
    """The designs at the cost of `machines` DGX-H100: co-located H100 and A100, split HH/HHcap on the
    same machines (prefill shares swept), split HA with h H100 and the A100s the rest of the money buys
    (Splitwise's sizing, `int(4.76 x (N - h) / 2.21)` at its prices; the price book's ratio otherwise)."""
    ratio = H100_TO_A100_COST if prices == "splitwise" else PRICES["H100-SXM-80GB"] / PRICES["A100-80GB"]
    n = machines
    out: list[tuple[str, str, Mode, list[float]]] = [
        ("co-located H100", f"{n}x8xH100", Mode.COLOCATED, [0.5]),
        ("co-located A100", f"{int(n * ratio)}x8xA100", Mode.COLOCATED, [0.5]),
        ("split HH", f"{n}x8xH100", Mode.SPLIT_HH, SPLIT_SHARES),
        ("split HHcap", f"{n}x8xH100", Mode.SPLIT_HHCAP, SPLIT_SHARES),
    ]
    for share in (0.5, 0.625, 0.75):
        h = max(1, round(n * share))
        out.append(("split HA", f"{h}x8xH100,{int(ratio * (n - h))}x8xA100", Mode.SPLIT_HA, [0.5]))
    return out


def reproduce(args: argparse.Namespace) -> dict[str, Any]:
    book = _book()
    rows = []
    for kind in args.traces.split(","):
        for name, cluster, mode, shares in designs(args.machines, args.prices):
            wanted = args.designs.split(",") if args.designs else []
            if wanted and not any(name == d or name.startswith(d + " ") for d in wanted):
                continue
            if args.shares and len(shares) > 1:
                shares = [float(x) for x in args.shares.split(",")]
            for share in shares:
                t0 = time.perf_counter()
                opt = ServeOptions(
                    mode=mode,
                    prefill_share=share,
                    slo_reference=args.slo_reference,
                    mixed_pool=args.mixed_pool,
                    max_batch=args.max_batch,
                    decode_model=args.decode_model,
                )
                prices = SPLITWISE_PRICES if args.prices == "splitwise" else PRICES
                lo, hi = 0.05, 16.0 * args.machines / 8  # the trace's rate x 16 saturates 8 machines
                if args.bracket:
                    lo, hi = (float(x) for x in args.bracket.split(","))
                scale, result = max_rate(
                    book, kind, cluster, opt, args.seed, args.limit_s, lo, hi, args.steps, prices
                )
                rows.append(
                    {
                        "trace": kind,
                        "design": name,
                        "cluster": cluster,
                        "prefill_share": share,
                        "max_scale": scale,
                        "max_rps": result["rate_rps"] if scale else 0.0,
                        "usd_per_hour": result["usd_per_hour"],
                        "power_kw": result["power_kw"],
                        "instances": result["instances"],
                        "wall_s": time.perf_counter() - t0,
                    }
                )
                print(
                    f"{kind:5} {name:16} {cluster:18} share {share:5.3f}: x{scale:6.3f} "
                    f"{rows[-1]['max_rps']:6.2f} req/s  ${result['usd_per_hour']:.0f}/h",
                    flush=True,
                )
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["trace"], row["design"])
        if key not in best or row["max_rps"] > best[key]["max_rps"]:
            best[key] = row
    print(
        f"\n{'trace':5} {'design':16} {'cluster':18} {'share':>5} {'req/s':>7} {'$/h':>5} {'kW':>6} "
        f"{'req/$':>7} {'req/s/kW':>8} {'vs H100':>7} {'iso-cost':>8}"
    )
    table = []
    for (kind, name), row in best.items():
        base = best.get((kind, "co-located H100"))  # absent when --designs leaves it out
        ratio = row["max_rps"] / base["max_rps"] if base and base["max_rps"] else math.nan
        iso = ratio * base["usd_per_hour"] / row["usd_per_hour"] if base else math.nan
        row = {
            **row,
            "vs_colocated_h100": ratio,
            "iso_cost_ratio": iso,
            "requests_per_usd": row["max_rps"] * 3600 / row["usd_per_hour"],
            "rps_per_kw": row["max_rps"] / row["power_kw"],
        }
        table.append(row)
        print(
            f"{kind:5} {name:16} {row['cluster']:18} {row['prefill_share']:5.3f} {row['max_rps']:7.2f} "
            f"{row['usd_per_hour']:5.0f} {row['power_kw']:6.1f} {row['requests_per_usd']:7.0f} "
            f"{row['rps_per_kw']:8.3f} {ratio:7.2f} {iso:8.2f}"
        )
    return {"runs": rows, "best": table}


def _ci(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))


def fabric(args: argparse.Namespace) -> dict[str, Any]:
    book = _book()
    tree = fat_tree(args.ports, levels=3, oversubscription=2.0, pods=args.pods, speed=LinkSpeed[args.speed])
    hosts = sum(1 for n in tree.nodes.values() if n.kind == "ca")
    nodes = nodes_from_spec(f"{hosts}x8xH100")
    training = TrainingSpec(
        gangs=args.training_gangs,
        nodes_per_gang=args.training_nodes,
        gradient_gib=args.gradient_gib,
        compute_s=args.compute_s,
    )
    sides = {
        "fabric-blind": (Placement.BEST_FIT, "jsq"),
        "fabric-aware": (Placement.NETWORK_AWARE, "fabric"),
        "fabric-local": (Placement.NETWORK_AWARE, "fabric-local"),
    }
    if args.sides:
        sides = {s: sides[s] for s in args.sides.split(",")}
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    requests: list[Request] = []
    for seed in args.seeds:
        requests = _trace(args.trace, args.rate_scale, args.limit_s, seed)  # Poisson, seeded
        for side, (placement, router) in sides.items():
            opt = ServeOptions(
                model=args.model,
                mode=Mode.SPLIT_HH,
                placement=placement,
                router=router,
                seed=seed,
                prefill_share=args.prefill_share,
                first_token=args.first_token,
                training=training,
                rails=args.rails,
                routing=args.routing,
            )
            result = run_serving(nodes, tree, requests, book, opt, PRICES)
            runs[side].append(result)
            lat, kv = result["latency"], result["kv_wait"]
            print(
                f"seed {seed} {side:13} TTFT p99 {lat['ttft']['p99_s']:.3f} s"
                f"  TBT p99 {lat['tbt']['p99_s']:.4f} s"
                f"  spine {result['kv_cross_spine_bytes'] / 1e9:8.1f} GB"
                f"  leaf {result['kv_cross_leaf_bytes'] / 1e9:8.1f} GB"
                f"  KV wait p50/p99 {kv['p50_s'] * 1e3:.1f}/{kv['p99_s'] * 1e3:.1f} ms"
                f"  (tail {kv['ttft_tail_kv_s'] * 1e3:.1f} ms of {kv['ttft_tail_s']:.3f} s)"
                f"  SLO {'met' if lat['slo_met'] else 'missed'}  train x{result['training_slowdown']:.3f}"
                f"  ({result['sim_wall_s']:.1f} s)",
                flush=True,
            )
    metrics = {
        "cross_spine_gb": lambda r: r["kv_cross_spine_bytes"] / 1e9,
        "cross_leaf_gb": lambda r: r["kv_cross_leaf_bytes"] / 1e9,
        "ttft_p99_s": lambda r: r["latency"]["ttft"]["p99_s"],
        "tbt_p99_s": lambda r: r["latency"]["tbt"]["p99_s"],
        "e2e_p99_s": lambda r: r["latency"]["e2e"]["p99_s"],
        "uplink_util_max": lambda r: r["links"]["uplink_util_max"],
        "kv_wait_p50_ms": lambda r: r["kv_wait"]["p50_s"] * 1e3,
        "kv_wait_p99_ms": lambda r: r["kv_wait"]["p99_s"] * 1e3,
        "ttft_tail_s": lambda r: r["kv_wait"]["ttft_tail_s"],
        "ttft_tail_kv_ms": lambda r: r["kv_wait"]["ttft_tail_kv_s"] * 1e3,
        "training_slowdown": lambda r: r["training_slowdown"],
    }
    summary: dict[str, Any] = {}
    for aware_side in [s for s in ("fabric-aware", "fabric-local") if s in runs and "fabric-blind" in runs]:
        print(f"\n{'metric':18} {'fabric-blind':>22} {aware_side:>22} {'ratio':>20}")
        for name, get in metrics.items():
            blind = [get(r) for r in runs["fabric-blind"]]
            aware = [get(r) for r in runs[aware_side]]
            ratios = [a / b if b else math.nan for a, b in zip(aware, blind, strict=True)]
            (bm, bh), (am, ah), (rm, rh) = _ci(blind), _ci(aware), _ci(ratios)
            summary.setdefault(aware_side, {})[name] = {
                "blind": [bm, bh],
                "aware": [am, ah],
                "ratio": [rm, rh],
            }
            print(f"{name:18} {bm:12.4g} ± {bh:<7.3g} {am:12.4g} ± {ah:<7.3g} {rm:10.3f} ± {rh:<7.3f}")
    met = {side: sum(r["latency"]["slo_met"] for r in rs) for side, rs in runs.items()}
    print(f"SLOs met: {met} of {len(args.seeds)} seeds; hosts {hosts}, requests {len(requests)}")
    slim = {side: [{k: v for k, v in r.items() if k != "cdf_s"} for r in rs] for side, rs in runs.items()}
    return {
        "config": {k: v for k, v in vars(args).items() if k != "func"},
        "hosts": hosts,
        "slo_met": met,
        "summary": summary,
        "runs": slim,
    }


def speed(args: argparse.Namespace) -> dict[str, Any]:
    book = _book()
    out = {}
    for cluster in ("16x8xH100",):
        t0 = time.perf_counter()
        requests = _trace("conv", 1.0)
        result = run_serving(
            nodes_from_spec(cluster), None, requests, book, ServeOptions(mode=Mode.SPLIT_HH), PRICES
        )
        wall = time.perf_counter() - t0
        out[cluster] = {"requests": len(requests), "wall_s": wall, "sim_wall_s": result["sim_wall_s"]}
        print(
            f"conv trace, one hour, {len(requests)} requests, split-hh on {cluster}: {wall:.1f} s "
            f"(simulation {result['sim_wall_s']:.1f} s)"
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="part", required=True)
    rep = sub.add_parser("reproduce")
    rep.set_defaults(func=reproduce)
    rep.add_argument("--seed", type=int, default=0, help="of the Poisson arrivals")
    rep.add_argument("--limit-s", type=float, default=900.0, help="simulated seconds of arrivals")
    rep.add_argument("--slo-reference", default="a100-80gb", help="hardware of the unloaded reference run")
    rep.add_argument("--designs", default="", help="only these designs (a,b: a name, or its first words)")
    rep.add_argument(
        "--mixed-pool",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="split designs borrow decode machines for prompts under long queues (Splitwise's mixed pool)",
    )
    rep.add_argument(
        "--max-batch",
        type=int,
        default=512,
        help="requests an iteration (Splitwise's instances: 512; the largest measured batch is 64)",
    )
    rep.add_argument("--traces", default="code,conv", help="which of code,conv")
    rep.add_argument(
        "--machines",
        type=int,
        default=40,
        help="DGX-H100 machines the cost is set by (Splitwise: 40, against 86 DGX-A100 at its prices)",
    )
    rep.add_argument("--steps", type=int, default=9, help="bisection steps of the highest rate")
    rep.add_argument("--bracket", default="", help="LO,HI: the rate scales the bisection starts between")
    rep.add_argument(
        "--decode-model",
        default="fit",
        choices=["fit", "splitwise"],
        help="decode step times: the fit of the measured batch sweep, or Splitwise's simulator's lookup",
    )
    rep.add_argument(
        "--shares", default="", help="prefill shares of split-hh/hhcap to sweep (a,b); all when empty"
    )
    rep.add_argument(
        "--prices",
        default="book",
        choices=["book", "splitwise"],
        help="GPU prices: the price book's, or Splitwise's",
    )
    fab = sub.add_parser("fabric")
    fab.set_defaults(func=fabric)
    fab.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3, 4, 5])
    fab.add_argument("--trace", default="conv", choices=["code", "conv"])
    fab.add_argument("--rate-scale", type=float, default=6.0)
    fab.add_argument("--limit-s", type=float, default=900.0)
    fab.add_argument("--ports", type=int, default=12)
    fab.add_argument("--pods", type=int, default=2)
    fab.add_argument("--speed", default="NDR")
    fab.add_argument(
        "--model", default="llama2-70b", help="llama2-70b (320 KiB of KV a token) or bloom-176b (3.8 MiB)"
    )
    fab.add_argument(
        "--rails", type=int, default=1, help="HCAs a host (planes of the tree); a DGX-H100 has 8"
    )
    fab.add_argument(
        "--routing",
        default="static",
        choices=["static", "pooled"],
        help="static: one path a host pair, from the forwarding tables; pooled: a leaf's uplinks as one pool",
    )
    fab.add_argument("--sides", default="", help="only these of fabric-blind,fabric-aware,fabric-local")
    fab.add_argument("--training-gangs", type=int, default=16)
    fab.add_argument("--training-nodes", type=int, default=4)
    fab.add_argument("--gradient-gib", type=float, default=4.0)
    fab.add_argument("--compute-s", type=float, default=1.0)
    fab.add_argument("--prefill-share", type=float, default=0.5)
    fab.add_argument("--first-token", default="decode", choices=["prefill", "decode"])
    sub.add_parser("speed").set_defaults(func=speed)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = args.func(args)
    out = args.json or Path("bench/results") / f"pd_serving_{args.part}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True, default=str))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
