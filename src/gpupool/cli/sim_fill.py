"""`gpupool sim fill`: the FGD paper's fill protocol over an OpenB node and pod file, per policy and seed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpupool.cli._common import check_plot_path, config_default_text, policy_names_text, reports_run_errors
from gpupool.cli.output import console as sized_console
from gpupool.errors import InvalidInput


def fill(
    nodes: Path = typer.Option(..., "--nodes", help="OpenB node CSV (sn,cpu_milli,memory_mib,gpu,model)."),
    pods: Path = typer.Option(..., "--pods", help="OpenB pod CSV (name,cpu_milli,memory_mib,num_gpu,...)."),
    # None (not given): the configuration's placement, as `gpupool up` (no literal default here;
    # tests/cli/test_one_set_of_defaults.py checks)
    policy: list[str] | None = typer.Option(
        None,
        "--policy",
        help=f"Placement policy, repeat to compare several: {policy_names_text()} "
        f"({config_default_text('placement')}, with its placement_options).",
    ),
    seeds: str = typer.Option(
        "42-51", "--seeds", "--seed",
        help="One seed, a range or a list: 42, 42-51, 42,43,50-51; at most 1,000 seeds (each a run of "
        "every policy)."
    ),
    jobs: int = typer.Option(1, "--jobs", min=1, help="Worker processes running fills in parallel."),
    fabric: Path | None = typer.Option(
        None, "--fabric", help="An ibnetdiscover file (or one from `gpupool fabric generate`): the nodes "
        "are mapped onto its hosts in natural name order and the policy is bound to it."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the summary and all runs as JSON."),
    plot_out: Path | None = typer.Option(
        None, "--plot", help="Write a plot of allocation vs arrived demand: PNG, or SVG, PDF, EPS or JPEG by "
        "the name's suffix."),
    config_file: Path | None = typer.Option(
        None, "--config", help="The pool's configuration (YAML, as `gpupool up` reads): its placement and "
        "placement_options are the policy run when no --policy is given."),
) -> None:
    """Fill an empty cluster with a seeded, inflated, shuffled pod trace; report device allocation.

    Each pod is placed at once or fails and pods never leave; the table shows the mean device
    allocation % over the seeds at 90, 100 and 130 % arrived demand. Without --policy the
    configuration's placement runs (--config, else its defaults, as `gpupool up`).

    Example: gpupool sim fill --nodes nodes.csv --pods pods.csv --policy best-fit --policy fgd --seeds 42-51
    """
    console = sized_console()
    with reports_run_errors():
        check_plot_path(plot_out, "--plot")
        from gpupool.config import load_config

        config = load_config(config_file)  # PoolConfig() without --config, as `gpupool up`
        chosen: dict[str, Mapping[str, Any]] = {}
        for name in dict.fromkeys(policy) if policy else [None]:
            # each as `gpupool up --policy NAME` would run it (None: the configuration's placement)
            placement = config.policies(placement=name)
            chosen[placement.placement] = placement.placement_options
        results = _run(nodes, pods, chosen, seeds, jobs, console, fabric)
        if json_out is not None:
            from gpupool.sim.report import write_json

            write_json(results, json_out)
        if plot_out is not None:
            from gpupool.sim.report import plot

            plot(results, plot_out, title=f"fill: {pods.name} on {nodes.name}")
    _print_table(results, console)
    # the names as given, never read as rich markup ("[b]") nor wrapped
    if json_out is not None:
        console.out(f"JSON written to {json_out}", highlight=False)
    if plot_out is not None:
        console.out(f"Plot written to {plot_out}", highlight=False)


def _run(
    nodes: Path, pods: Path, policies: Mapping[str, Mapping[str, Any]], seeds_text: str, jobs: int,
    console: Console, fabric: Path | None = None,
) -> list:
    """Fill with each policy of `policies` (name -> its options) and each seed."""
    from gpupool.core.scheduling.policies.base import policy_class
    from gpupool.core.scheduling.topology import map_hosts
    from gpupool.sim.fill import FillJob, load_fabric_file, parse_seeds, run_jobs
    from gpupool.sim.traces.openb import load_openb_nodes, load_openb_pods

    for path, what in ((nodes, "--nodes"), (pods, "--pods")):
        if not path.is_file():
            raise InvalidInput(f"{what} file {path} does not exist; give the path of an OpenB CSV file.")
    seed_list = parse_seeds(seeds_text)
    for name in policies:
        policy_class(name)  # raises UnknownName with a did-you-mean
    cluster = load_openb_nodes(nodes)  # fail fast, with file:line, before any worker starts
    load_openb_pods(pods)
    if fabric is not None:
        if not fabric.is_file():
            raise InvalidInput(f"--fabric file {fabric} does not exist; give an ibnetdiscover file.")
        map_hosts(load_fabric_file(str(fabric)), cluster)  # refuses a fabric with too few hosts
    fabric_path = str(fabric) if fabric is not None else None
    work = [FillJob(str(nodes), str(pods), name, seed, options=dict(options), fabric_path=fabric_path)
            for name, options in policies.items() for seed in seed_list]
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("fill runs", total=len(work))
        return run_jobs(work, jobs, on_done=lambda _r: progress.advance(task))


def _print_table(results: list, console: Console) -> None:
    from gpupool.sim.report import REPORT_POINTS, summary

    table = Table(title="Mean device allocation % at arrived demand (over seeds)")
    table.add_column("policy")
    table.add_column("seeds", justify="right")
    for point in REPORT_POINTS:
        table.add_column(f"{point} %", justify="right")
    table.add_column("wall s/run", justify="right")
    for policy, row in summary(results).items():
        runs = [r for r in results if r.policy == policy]
        wall = sum(r.wall_s for r in runs) / len(runs)
        table.add_row(policy, str(len(runs)), *(f"{row[str(p)]:.2f}" for p in REPORT_POINTS), f"{wall:.1f}")
    console.print(table)
