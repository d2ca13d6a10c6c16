"""`gpupool sim colocate`: services and batch on one pool against a static split (sim/colocation.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

from gpupool.cli._common import reports_run_errors
from gpupool.errors import InvalidInput, did_you_mean

DEFAULT_CLUSTER = "64x8xA100-80GB"
DEFAULT_BATCH_START = "2017-10-01"
SERVICES_FILE = ("alibaba-dlrm-2025", "disaggregated_DLRM_trace.csv")
PHILLY_FILE = ("philly", "philly-sia.csv")
AZURE_SERVICES = ("code", "conv")


def _data_file(given: Path | None, parts: tuple[str, str], flag: str) -> Path:
    if given is not None:
        return given
    from gpupool.sim.datadir import ENV_VAR, data_dir

    root = data_dir()
    if root is None:
        raise InvalidInput(f"No {flag} file given and the shared data directory was not found; give "
                           f"{flag} FILE or set {ENV_VAR} to the folder holding {parts[0]}/.")
    return root.joinpath(*parts)


def build_setup(services: Path | None, batch: Path | None, cluster: str, batch_scale: float,
                batch_start: str, seed: int, headroom: int, cold_start_s: float, grace_s: float,
                assume_share: float | None = None, days: float | None = None, thin: int = 1,
                batch_nodes: int | None = None, placement: str | None = None,
                azure: str | None = None, azure_file: Path | None = None, azure_target: float = 4.0,
                pack: bool = True) -> Any:
    """The ColocationSetup of the command's options (also used by bench/colocation.py).

    `batch_nodes`: the pool is the static split's inference pool (the fewest nodes of `cluster`'s
    kind that hold the services' peak) plus this many nodes, so the static batch cluster is the same
    size whatever the seed's sample of the services; None: `cluster` as given.

    `azure` ('code' or 'conv'): one more service whose replicas are the Azure LLM 2023 hour of that
    service's requests through the autoscaler (core/autoscale.py, `azure_target` requests in flight a
    replica, min 0, max 64, `cold_start_s`), the hour repeated back to back over the window (an
    assumption: a sensitivity, not the trace).

    `pack`: `serving.pack_replicas` (replicas onto nodes in use first, the emptiest node's replica
    removed first); False replays the pool without it."""
    from gpupool.config import PoolConfig
    from gpupool.prices import PricesConfig
    from gpupool.providers.nodespec import nodes_from_spec
    from gpupool.sim.colocation import (
        ColocationSetup,
        scale_batch,
        static_inference_nodes,
        thin_instances,
        widest_fitting,
    )
    from gpupool.sim.jobs import in_window, philly_jobs
    from gpupool.sim.traces.alibaba_serving import load_instances
    from gpupool.sim.traces.philly import parse_time_s

    if not 0 <= headroom <= 1000:
        raise InvalidInput(f"--headroom is serving.headroom_replicas, a number of replicas from 0 to 1000, "
                           f"not {headroom}.")
    for flag, seconds in (("--cold-start", cold_start_s), ("--grace", grace_s)):
        if not (math.isfinite(seconds) and seconds >= 0):  # (also refuses nan)
            raise InvalidInput(f"{flag} takes a finite number of seconds >= 0, got {seconds:g}.")
    if assume_share is not None and not 0.05 <= assume_share <= 1.0:
        raise InvalidInput(f"--assume-share is the share of a device each whole-device replica is given "
                           f"under `fractional` (0.25 or 0.5, from 0.05 to 1), not {assume_share:g}.")
    if days is not None and not (math.isfinite(days) and days > 0):
        raise InvalidInput(f"--days must be a finite number above 0, not {days:g}.")
    if not (math.isfinite(azure_target) and azure_target > 0):
        raise InvalidInput(f"--azure-target is requests in flight a replica, finite and above 0, not "
                           f"{azure_target:g}.")
    nodes = tuple(nodes_from_spec(cluster))
    per_node = max((len(n.devices) for n in nodes), default=0)
    instances = load_instances(_data_file(services, SERVICES_FILE, "--services"))
    end_s = max(max(i.start_s for i in instances),
                max((i.end_s for i in instances if i.end_s != float("inf")), default=0.0))
    if days is not None:
        end_s = min(end_s, days * 86400.0)
        instances = [i for i in instances if i.start_s < end_s]
    instances = thin_instances(instances, thin, seed)
    if azure is not None:
        extra = _azure_instances(azure, azure_file, azure_target, cold_start_s, end_s)
        instances = sorted([*instances, *extra], key=lambda i: (i.start_s, i.line))
    if batch_nodes is not None:
        if batch_nodes < 1:
            raise InvalidInput(f"--batch-nodes must be a number of nodes >= 1, not {batch_nodes}.")
        kind = cluster.split(",")[0].partition("x")[2]
        if not kind:
            raise InvalidInput(f"--batch-nodes needs --cluster NODESxDEVICESxMODEL to take the node kind "
                               f"from, not {cluster!r}.")
        nodes = tuple(nodes_from_spec(f"{static_inference_nodes(instances, nodes) + batch_nodes}x{kind}"))
    batch_devices = sum(len(n.devices) for n in nodes[static_inference_nodes(instances, nodes):])
    try:
        start = parse_time_s(batch_start)
    except ValueError:
        raise InvalidInput(f"--batch-start must be a date like 2017-10-01, not {batch_start!r}.") from None
    jobs = in_window(philly_jobs(_data_file(batch, PHILLY_FILE, "--batch"), per_node, seed),
                     (start, start + end_s))
    if not jobs:
        raise InvalidInput(f"No batch job falls in {batch_start} plus the services' {end_s / 86400:.1f} "
                           "days; choose another --batch-start.")
    if batch_devices < 1:
        raise InvalidInput(f"The services' peak fills all of --cluster {cluster}: no batch cluster is left "
                           "for the static split; give more nodes (or a larger --service-thin).")
    # a job wider than the static split's batch cluster could never run there: left out of every variant
    jobs, wide = widest_fitting(jobs, batch_devices)
    settings: dict[str, Any] = {"serving": {"headroom_replicas": headroom, "pack_replicas": pack}}
    if placement is not None:
        from gpupool.core.scheduling.policies.base import policy_names

        if placement not in policy_names():
            names = policy_names()
            raise InvalidInput(f"Unknown --placement {placement!r}; choose from {', '.join(names)}."
                               + did_you_mean(placement, names))
        settings["scheduling"] = {"placement": placement}
    config = PoolConfig.model_validate(settings)
    return ColocationSetup(nodes=nodes, instances=tuple(instances), wide_jobs_left_out=wide,
                           batch=tuple(scale_batch(jobs, batch_scale, seed, start)),
                           end_s=end_s, seed=seed, cold_start_s=cold_start_s, **serving_setup(config),
                           grace_s=grace_s, assume_share=assume_share,
                           prices=PricesConfig.model_validate({}).price_book())


def _azure_instances(name: str, given: Path | None, target: float, cold_start_s: float,
                     until_s: float) -> list[Any]:
    from gpupool.core.autoscale import AutoscalePolicy
    from gpupool.sim.request_demand import load_requests, repeated_instances, replica_demand

    if name not in AZURE_SERVICES:
        raise InvalidInput(f"--azure-service is one of {', '.join(AZURE_SERVICES)} (the Azure LLM 2023 "
                           f"trace's two services), not {name!r}." + did_you_mean(name, list(AZURE_SERVICES)))
    path = _data_file(given, ("azure-llm-2023", f"AzureLLMInferenceTrace_{name}.csv"), "--azure-file")
    policy = AutoscalePolicy(target_per_replica=target, min_replicas=0, max_replicas=64)
    demand = replica_demand(load_requests(path), policy, cold_start_s=cold_start_s)
    return repeated_instances(demand["steps"], float(demand["span_s"]), until_s, f"azure-{name}")


def serving_setup(config: Any) -> dict[str, Any]:
    """What the replay takes from a pool configuration, as `gpupool up` takes it: the policies (with
    preemption on: replicas take room from batch), the replicas' class, the classes the headroom is
    kept for, `serving.headroom_replicas` and `serving.pack_replicas`."""
    serving = config.serving
    return {"policies": config.policies(preemption=True), "service_class": serving.priority_class,
            "exempt_classes": frozenset({serving.priority_class, *(c.name for c in serving.classes)}),
            "headroom_replicas": serving.headroom_replicas, "consolidate": serving.pack_replicas}


def colocate(
    variants: str = typer.Option(
        "static,colocated,headroom,fractional", "--variants",
        help="Comma-separated: static (an inference pool sized for the services' peak + a batch cluster "
        "of the rest), colocated (one pool, replicas preempt batch), headroom (colocated, N replicas' "
        "worth kept free from new batch), fractional (headroom, replicas asking less than a device get a "
        "slice)."),
    services: Path | None = typer.Option(
        None, "--services", help="The Alibaba 2025 inference trace (disaggregated_DLRM_trace.csv); "
        "default: alibaba-dlrm-2025/ in the shared data directory (GPUPOOL_DATA_DIR)."),
    batch: Path | None = typer.Option(
        None, "--batch", help="The Philly trace (philly-sia.csv); default: philly/ in the shared data "
        "directory."),
    cluster: str = typer.Option(DEFAULT_CLUSTER, "--cluster", help="The whole pool, NODESxDEVICESxMODEL."),
    batch_scale: float = typer.Option(
        0.2, "--batch-scale", help="Each Philly job taken this many times on average (seeded; 0.2 keeps one "
        "in five)."),
    service_thin: int = typer.Option(
        8, "--service-thin", help="A 1/N scale model of the services: every Nth instance of each app (the "
        "seed picks which); 1 replays them all (then give a cluster about 8x larger)."),
    batch_start: str = typer.Option(
        DEFAULT_BATCH_START, "--batch-start", help="The Philly day the services' trace start is laid on."),
    days: float | None = typer.Option(None, "--days", help="Only the first DAYS of the services' trace."),
    batch_nodes: int | None = typer.Option(
        None, "--batch-nodes", help="The pool is the static split's inference pool (the fewest nodes of "
        "--cluster's kind that hold the services' peak) plus this many nodes; default: --cluster as given."),
    placement: str | None = typer.Option(
        None, "--placement", help="scheduling.placement for every variant (replicas and batch alike); "
        "default: the pool's (fgd-strand). best-fit packs replicas onto the nodes already busiest."),
    azure_service: str | None = typer.Option(
        None, "--azure-service", help="Sensitivity: add one service (code or conv) whose replicas are the "
        "Azure LLM 2023 hour of its requests through the autoscaler, the hour repeated over the window "
        "(an assumption)."),
    azure_file: Path | None = typer.Option(
        None, "--azure-file", help="That service's CSV; default: azure-llm-2023/ in the shared data "
        "directory."),
    azure_target: float = typer.Option(4.0, "--azure-target", help="Requests in flight a replica."),
    headroom: int = typer.Option(8, "--headroom", help="serving.headroom_replicas under headroom and "
                                 "fractional: room for this many more replicas of the largest one kept "
                                 "free from new batch (the core's admission rule, as in the pool)."),
    cold_start: float = typer.Option(30.0, "--cold-start", help="Seconds from placement to a ready replica."),
    grace: float = typer.Option(30.0, "--grace", help="A replica placed within this many seconds of its "
                                "rise in demand is on time."),
    assume_share: float | None = typer.Option(
        None, "--assume-share", help="Sensitivity: under fractional, every whole-device replica gets this "
        "share of a device (the trace's own requests are whole devices)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the batch clones, classes and every random choice."),
    pack: bool = typer.Option(
        True, "--pack/--no-pack", help="serving.pack_replicas: replicas onto nodes already in use first, "
        "and at each end of an app's instance the replica on the emptiest node removed (--no-pack: the "
        "trace's own instance)."),
    json_out: Path = typer.Option(..., "--json", help="Where to write the metrics (JSON)."),
) -> None:
    """Replay inference services (their replica demand from the Alibaba 2025 trace) and Philly batch on
    one pool, side by side with a static split.

    Example: gpupool sim colocate --variants static,colocated --seed 1 --json colocate.json
    """
    from gpupool.sim.colocation import parse_variants, run_all

    with reports_run_errors():
        chosen = parse_variants(variants)
        setup = build_setup(services, batch, cluster, batch_scale, batch_start, seed, headroom,
                            cold_start, grace, assume_share, days, service_thin, batch_nodes, placement,
                            azure_service, azure_file, azure_target, pack)
        result = run_all(setup, chosen)
        result["config"] = {"cluster": cluster, "batch_scale": batch_scale, "batch_start": batch_start,
                            "days": days, "service_thin": service_thin, "batch_nodes": batch_nodes,
                            "placement": placement, "headroom": headroom, "cold_start_s": cold_start,
                            "grace_s": grace, "azure_service": azure_service, "azure_target": azure_target,
                            "assume_share": assume_share, "seed": seed, "pack": pack}
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=2, sort_keys=True))
    print_table(result)


def print_table(result: dict[str, Any]) -> None:
    from rich.table import Table

    from gpupool.cli.output import console

    table = Table(title="colocation")
    for col in ("variant", "on time %", "ready p99 s", "batch GPU-h", "JCT mean h", "JCT p95 h",
                "preempt", "lost GPU-h"):
        table.add_column(col, justify="right")
    for name, r in result["variants"].items():
        table.add_row(name, f"{r['service_on_time_pct']:.3f}", f"{r['time_to_ready_s']['p99']:.0f}",
                      f"{r['batch_gpu_hours_window']:.0f}", f"{r['batch_jct_s']['mean'] / 3600:.2f}",
                      f"{r['batch_jct_s']['p95'] / 3600:.2f}", str(r["preemptions"]),
                      f"{r['lost_batch_gpu_hours']:.1f}")
    console().print(table)
