"""`gpupool sim serve`: LLM inference (co-located or prefill/decode split) on the pool and its fabric."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

from gpupool.cli._common import check_plot_path, reports_run_errors
from gpupool.errors import InvalidInput


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidInput(f"{what} takes numbers separated by commas (e.g. 1,2,4), got {text!r}.") from None
    if not values:
        raise InvalidInput(f"{what} needs at least one number.")
    return values


def _rate_scales(text: str) -> list[float]:
    """--rate-scale's multipliers: finite and above 0 (nan would run with no request at all)."""
    values = _floats(text, "--rate-scale")
    for value in values:
        if not (math.isfinite(value) and value > 0):
            raise InvalidInput(f"--rate-scale takes finite multipliers above 0 (1: the trace's own rate), "
                               f"got {value:g}.")
    return values


def _seeds(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidInput(f"--seeds takes whole numbers separated by commas (e.g. 0,1,2), got "
                           f"{text!r}.") from None
    if not values:
        raise InvalidInput("--seeds needs at least one number.")
    return values


def _choice(value: str, options: list[str], what: str) -> str:
    if value not in options:
        raise InvalidInput(f"{what} {value!r} is not one of {', '.join(options)}.")
    return value


def serve_runs(
    trace: str,
    model: str,
    cluster: str,
    fabric: Path | None,
    mode: str,
    placement: str,
    router: str,
    rate_scales: list[float],
    seeds: list[int],
    perf: Path | None,
    tp: int,
    prefill_share: float,
    overlap: bool,
    first_token: str,
    training_gangs: int,
    training_nodes: int,
    limit_s: float | None,
    arrivals: str = "trace",
    prices_file: Path | None = None,
    mixed_pool: bool = False,
    rails: int = 1,
    routing: str = "static",
) -> list[dict[str, Any]]:
    """Every (rate scale, seed) run of one configuration (also used by bench/pd_serving.py)."""
    from gpupool.prices import PricesConfig, load_prices
    from gpupool.providers.nodespec import nodes_from_spec
    from gpupool.sim.datadir import data_dir
    from gpupool.sim.fill import load_fabric_file
    from gpupool.sim.serving.network import TrainingSpec
    from gpupool.sim.serving.placement import Placement
    from gpupool.sim.serving.profiles import ProfileBook
    from gpupool.sim.serving.run import Mode, ServeOptions, run_serving
    from gpupool.sim.serving.trace import azure_start_s, load_azure, parse_trace_arg

    _, trace_path = parse_trace_arg(trace)
    _choice(mode, [m.value for m in Mode], "--mode")
    _choice(placement, [p.value for p in Placement], "--placement")
    _choice(router, ["jsq", "fabric", "fabric-local"], "--router")
    _choice(first_token, ["prefill", "decode"], "--first-token")
    _choice(arrivals, ["trace", "poisson"], "--arrivals")
    if perf is None:
        root = data_dir()
        perf = root / "splitwise-perf" / "perf_model.csv" if root is not None else None
        if perf is None or not perf.is_file():
            raise InvalidInput(
                "Give --profiles FILE (Splitwise's perf_model.csv columns); none was found "
                "in the shared data directory (GPUPOOL_DATA_DIR)."
            )
    book = ProfileBook.from_csv(perf)
    nodes = nodes_from_spec(cluster)
    fab = None
    if fabric is not None:
        if not fabric.is_file():
            raise InvalidInput(
                f"--fabric file {fabric} does not exist; give an ibnetdiscover file "
                "(e.g. from `gpupool fabric generate`)."
            )
        fab = load_fabric_file(str(fabric))
    config = load_prices(prices_file) if prices_file is not None else PricesConfig.model_validate({})
    price_book = config.price_book()
    trace_start_s = azure_start_s(trace_path)
    runs = []
    for scale in rate_scales:
        for seed in seeds:
            requests = load_azure(trace_path, scale, limit_s, seed if arrivals == "poisson" else None)
            # a run stands for the trace's own hours (on its clock, as `sim replay` bills a trace):
            # each device priced over them by the versions in force then, never one not yet in force
            start_s = trace_start_s + min((r.arrival_s for r in requests), default=0.0)
            end_s = trace_start_s + max((r.arrival_s for r in requests), default=0.0)
            prices = {device: price_book.hourly_price(device, start_s, end_s)
                      for device in ("H100-SXM-80GB", "A100-80GB")}
            opt = ServeOptions(
                model=model,
                mode=Mode(mode),
                placement=Placement(placement),
                router=router,
                tp=tp,
                prefill_share=prefill_share,
                overlap=overlap,
                first_token=first_token,
                seed=seed,
                training=TrainingSpec(gangs=training_gangs, nodes_per_gang=training_nodes),
                mixed_pool=mixed_pool,
                rails=rails,
                routing=routing,
            )
            result = run_serving(nodes, fab, requests, book, opt, prices)
            result["rate_scale"] = scale
            runs.append(result)
    return runs


def _row(r: dict[str, Any]) -> str:
    lat = r["latency"]
    return (
        f"{r['rate_scale']:>6.2f} {r['seed']:>4d} {r['rate_rps']:>7.2f} {lat['ttft']['p50_s']:>7.3f} "
        f"{lat['ttft']['p99_s']:>7.3f} {lat['tbt']['p50_s']:>7.3f} {lat['tbt']['p99_s']:>7.3f} "
        f"{lat['e2e']['p99_s']:>8.2f} {100 * lat['slo_attainment']:>5.0f}% {r['requests_per_usd']:>8.0f} "
        f"{r['kv_cross_spine_bytes'] / 1e9:>9.1f}"
    )


def serve(
    trace: str = typer.Option(
        ..., "--trace", help="azure-code:FILE or azure-conv:FILE (Azure LLM trace 2023)."
    ),
    model: str = typer.Option("llama2-70b", "--model", help="The model (one the profile file measures)."),
    cluster: str = typer.Option(
        ..., "--cluster", help="Nodes as NODESxDEVICESxMODEL[,...], e.g. 8x8xH100,8x8xA100."
    ),
    fabric: Path | None = typer.Option(
        None,
        "--fabric",
        help="An ibnetdiscover file the KV caches cross "
        "(default: one 400 Gb/s link per node, nothing else shared).",
    ),
    mode: str = typer.Option("split-hh", "--mode", help="colocated, split-hh, split-ha or split-hhcap."),
    placement: str = typer.Option(
        "best-fit", "--placement", help="best-fit (fabric-blind), leaf-paired or network-aware."
    ),
    router: str = typer.Option(
        "jsq",
        "--router",
        help="jsq (decode by free KV memory), fabric (by KV transfer cost, the flows it slows and the "
        "decode steps it waits) or fabric-local (the same, one step: locality first).",
    ),
    rate_scale: str = typer.Option("1", "--rate-scale", help="Request rate multipliers, comma-separated."),
    seeds: str = typer.Option(
        "0", "--seeds", help="Seeds, comma-separated (training gangs' placement; Poisson arrivals)."
    ),
    perf: Path | None = typer.Option(
        None,
        "--profiles",
        help="Measured step times (Splitwise's perf_model.csv "
        "columns); default: the shared data directory's.",
    ),
    tp: int = typer.Option(8, "--tp", help="Devices per instance (tensor parallel), 1 to 8."),
    prefill_share: float = typer.Option(
        0.5, "--prefill-share", help="Share of H100 instances that prefill (split-hh, split-hhcap)."
    ),
    overlap: bool = typer.Option(
        False, "--overlap", help="Send the KV cache layer by layer during the prefill."
    ),
    first_token: str = typer.Option(
        "prefill",
        "--first-token",
        help="Where a split request's first token reaches the user: prefill (Splitwise) or decode "
        "(once the KV cache has arrived, as disaggregated vLLM and Dynamo stream it).",
    ),
    training_gangs: int = typer.Option(0, "--training-gangs", help="Training gangs beside the service."),
    training_nodes: int = typer.Option(4, "--training-nodes", help="Whole nodes per training gang."),
    arrivals: str = typer.Option(
        "trace",
        "--arrivals",
        help="trace (the trace's own times) or poisson (its requests at its mean rate, Poisson, per seed).",
    ),
    limit_s: float | None = typer.Option(None, "--limit-s", help="Only the first seconds of the trace."),
    prices_file: Path | None = typer.Option(
        None,
        "--prices",
        help="A price book (the `prices:` section of a pool configuration, or a file of it alone) for "
        "requests per dollar, priced with the version in force over the trace's own hours (as `sim "
        "replay` bills); default: the devices' reference prices.",
    ),
    mixed_pool: bool = typer.Option(
        False,
        "--mixed-pool",
        help="Split modes: decode instances run prompts while every prefill queue holds over 8,192 "
        "tokens (Splitwise's mixed pool).",
    ),
    rails: int = typer.Option(
        1, "--rails", help="HCAs a host, each on its own plane of the fabric (a DGX-H100: 8), 1 to 16."
    ),
    routing: str = typer.Option(
        "static",
        "--routing",
        help="static: each host pair's flows on the one path the up*/down* forwarding tables give, "
        "cables shared per direction (what an InfiniBand subnet manager programs); pooled: a leaf's "
        "uplinks as one pool (perfect multipath).",
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Write every run's metrics here (JSON)."),
    plot: Path | None = typer.Option(
        None, "--plot", help="Latency CDFs and throughput-latency: PNG, or SVG, PDF, EPS or JPEG by the "
        "name's suffix."),
) -> None:
    """Simulate LLM serving: instances placed by the scheduler, KV caches as flows on the fabric.

    Example: gpupool sim serve --trace azure-conv:AzureLLMInferenceTrace_conv.csv --cluster 16x8xH100
    --mode split-hh --rate-scale 1,2 --json out.json
    """
    with reports_run_errors():
        check_plot_path(plot, "--plot")
        if not 1 <= tp <= 8:
            raise InvalidInput(f"--tp must be 1 to 8 (devices of one node), got {tp}.")
        if not 0 < prefill_share < 1:
            raise InvalidInput(f"--prefill-share must be between 0 and 1, got {prefill_share:g}.")
        if not 1 <= rails <= 16:
            raise InvalidInput(f"--rails must be 1 to 16 (HCAs a host), got {rails}.")
        if routing not in ("static", "pooled"):
            raise InvalidInput(f"--routing must be static or pooled, got {routing!r}.")
        seed_list = _seeds(seeds)
        scales = _rate_scales(rate_scale)
        if limit_s is not None and not (math.isfinite(limit_s) and limit_s > 0):
            raise InvalidInput(f"--limit-s takes a finite number of seconds above 0, got {limit_s:g}.")
        runs = serve_runs(
            trace,
            model,
            cluster,
            fabric,
            mode,
            placement,
            router,
            scales,
            seed_list,
            perf,
            tp,
            prefill_share,
            overlap,
            first_token,
            training_gangs,
            training_nodes,
            limit_s,
            arrivals,
            prices_file,
            mixed_pool,
            rails,
            routing,
        )
        print(
            f"{'scale':>6} {'seed':>4} {'req/s':>7} {'TTFT50':>7} {'TTFT99':>7} {'TBT50':>7} {'TBT99':>7} "
            f"{'E2E99':>8} {'SLO':>6} {'req/$':>8} {'spineGB':>9}"
        )
        for r in runs:
            print(_row(r))
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(_clean(runs), indent=2, sort_keys=True))
        if plot is not None:
            plot_serving(runs, plot)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def plot_serving(runs: list[dict[str, Any]], path: Path) -> Path:
    """Left: CDFs of TTFT, TBT and E2E of the first run at each rate; right: p99 TTFT against rate. In the
    format `path`'s suffix names (PNG without one, at `path` itself)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.5))
    for ax, metric in zip(axes[:3], ("ttft", "tbt", "e2e"), strict=True):
        for r in runs:
            if r["seed"] == runs[0]["seed"]:
                ax.plot(r["cdf_s"][metric], range(101), label=f"x{r['rate_scale']:g}")
        ax.set_xlabel(f"{metric.upper()} (s)")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("percentile")
    axes[0].legend()
    rates = sorted({r["rate_rps"] for r in runs})
    p99 = [max(r["latency"]["ttft"]["p99_s"] for r in runs if r["rate_rps"] == x) for x in rates]
    axes[3].plot(rates, p99, marker="o")
    axes[3].set_xlabel("requests / s")
    axes[3].set_ylabel("p99 TTFT (s)")
    axes[3].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90, format=path.suffix.removeprefix(".").lower() or "png")
    plt.close(fig)
    return path
