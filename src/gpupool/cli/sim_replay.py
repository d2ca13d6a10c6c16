"""`gpupool sim replay`: replay a trace over time through admission and placement, report metrics."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from gpupool.cli._common import check_plot_path, config_default_text, policy_names_text, reports_run_errors
from gpupool.errors import InvalidInput


def _ordering_names_text() -> str:
    from gpupool.core.scheduling.ordering.base import ordering_names

    return ", ".join(ordering_names())


def _nodes(nodes_csv: Path | None, cluster: str | None) -> list[Any]:
    if (nodes_csv is None) == (cluster is None):
        raise InvalidInput("Give exactly one of --nodes NODES.csv or --cluster SPEC (e.g. 64x8xV100M32).")
    if nodes_csv is not None:
        from gpupool.sim.traces.openb import load_openb_nodes

        return load_openb_nodes(nodes_csv)
    from gpupool.providers.fake import nodes_from_spec

    assert cluster is not None
    return nodes_from_spec(cluster)


def run_replay(
    nodes_csv: Path | None,
    cluster: str | None,
    trace: str,
    window: str | None,
    ordering: str | None,
    policy: str | None,
    preemption: bool | None,
    backfill: bool | None,
    exclusive: bool,
    seed: int,
    tune_gc: bool = False,
    config: Any = None,
    prices: Any = None,
    budgets: Any = None,
    fabric: Path | None = None,
    comm_model: str | None = None,
    critical_share: float = 0.0,
) -> dict[str, Any]:
    """Build the replay from CLI-style options and run it (also used by the benchmarks).

    The Policies are `config.policies(...)` (a gpupool.config.PoolConfig, the file `gpupool up`
    reads; without it `PoolConfig()`, the defaults `gpupool up` runs), with each of ordering,
    policy, preemption and backfill that is not None (given on the command line) replacing the
    configuration's value: one set of defaults for the server and the simulator.

    `tune_gc` applies the long-running process settings of gpupool/gc_tuning.py once the trace is
    loaded; the `gpupool sim replay` command sets it (it changes the whole process's collector).

    With `prices` (a gpupool.prices.PricesConfig), the result also has `cost`: per tenant, pooled
    (slices at their share) and exclusive (whole devices), under that price book. With `budgets` too
    (tenant -> core.budgets.Budget), a tenant's new work waits once its spend reaches its budget, and
    the result has `budgets`: the waits per tenant.

    With `fabric` (an ibnetdiscover file, or one from `gpupool fabric generate`), the scheduler
    places by it: the nodes are mapped onto its hosts (core.scheduling.topology.map_hosts). With
    `comm_model` too ('default' or a YAML file, sim/comm.py), multi-node gangs run at the rate their
    communication allows on that fabric.

    `critical_share`: that fraction of Philly's jobs (seeded) is of the priority class `critical`.

    With the configuration's fabric.migrate_on_congestion and a communication model, link load is
    sampled from the truth every minute and the cycle moves gangs off congested links by the
    configuration's congestion_threshold and congestion_for, as `gpupool up` does.
    """
    from gpupool.config import PoolConfig
    from gpupool.core.scheduling.ordering.base import make_ordering
    from gpupool.core.scheduling.policies.base import policy_class
    from gpupool.sim.jobs import (
        CRITICAL_CLASS,
        check_critical_share,
        exclusive_jobs,
        in_window,
        load_trace,
        parse_window,
    )
    from gpupool.sim.replay import ReplayConfig, replay

    policies = (config if config is not None else PoolConfig()).policies(
        placement=policy, ordering=ordering, preemption=preemption, backfill=backfill)
    ordering, policy = policies.ordering, policies.placement
    preemption, backfill = policies.preemption, policies.backfill
    policy_class(policy)  # unknown names fail before any file is read
    make_ordering(ordering)
    span = parse_window(window) if window else None
    nodes = _nodes(nodes_csv, cluster)
    per_node = max((len(n.devices) for n in nodes), default=0)
    check_critical_share(critical_share)
    jobs = in_window(load_trace(trace, per_node, seed, critical_share), span)
    if exclusive:
        jobs = exclusive_jobs(jobs)
    if not jobs:
        raise InvalidInput("No jobs in the trace fall inside the window; widen --window.")
    if critical_share and policies.priority_classes.get(CRITICAL_CLASS) is None:
        raise InvalidInput(f"--critical-share marks jobs of class {CRITICAL_CLASS!r}, which the "
                           "configuration's priority_classes do not have; add it (the default classes "
                           "have it).")
    if tune_gc:
        from gpupool import gc_tuning

        gc_tuning.tune()  # the trace is loaded: freeze it
    book = prices.price_book() if prices is not None else None
    fabric_model = None
    if fabric is not None:
        from gpupool.core.scheduling.topology import map_hosts
        from gpupool.sim.fill import load_fabric_file

        if not fabric.is_file():
            raise InvalidInput(f"--fabric file {fabric} does not exist; give an ibnetdiscover file.")
        fabric_model = load_fabric_file(str(fabric))
        map_hosts(fabric_model, nodes)  # refuses a fabric with fewer hosts than nodes
    comm = None
    if comm_model is not None:
        from gpupool.sim.comm import load_comm_model
        from gpupool.sim.comm_net import comm_setup

        if fabric_model is None:
            raise InvalidInput("--comm-model needs the fabric the gangs talk over: give --fabric FILE too.")
        comm = comm_setup(fabric_model, jobs, load_comm_model(comm_model), seed, per_node)
    congestion = None
    if policies.migrate is not None and comm is not None:
        from gpupool.sim.congestion import CongestionRule

        congestion = CongestionRule()  # telemetry from the truth, judged by the configuration's rule
    result = replay(ReplayConfig(tuple(nodes), tuple(jobs), policies, seed=seed, prices=book,
                                 budgets=budgets or {}, fabric=fabric_model, comm=comm,
                                 congestion=congestion))
    result["config"] = {
        "trace": trace,
        "nodes": str(nodes_csv) if nodes_csv else cluster,
        "devices": sum(len(n.devices) for n in nodes),
        "window": window,
        "ordering": ordering,
        "policy": policy,
        "preemption": preemption,
        "backfill": backfill,
        "exclusive": exclusive,
        "seed": seed,
        "fabric": str(fabric) if fabric is not None else None,
        "comm_model": comm_model,
        "critical_share": critical_share,
        "prices": prices.model_dump(mode="json") if prices is not None else None,
        "budgets": {t: {"amount": b.amount, "period": b.period.value, "warn": b.warn_fraction,
                        "overdraft": b.overdraft} for t, b in (budgets or {}).items()} or None,
    }
    return result


def replay(
    trace: str = typer.Option(..., "--trace", help="FORMAT:FILE, FORMAT is openb or philly."),
    nodes: Path | None = typer.Option(None, "--nodes", help="OpenB node CSV file (NODES.csv)."),
    cluster: str | None = typer.Option(
        None, "--cluster", help="NODESxDEVICESxMODEL[,...], e.g. 64x8xV100M32."
    ),
    window: str | None = typer.Option(
        None, "--window", help="START:END as ISO dates (2017-10-01:2017-10-15) or trace seconds."
    ),
    # The scheduling settings default to None, "not given": they come from the configuration (the
    # --config file, else PoolConfig(), what `gpupool up` runs); tests/cli/test_one_set_of_defaults.py
    # fails if a literal default comes back here.
    ordering: str | None = typer.Option(
        None, "--ordering", help=f"{_ordering_names_text()} ({config_default_text('ordering')})."
    ),
    policy: str | None = typer.Option(
        None, "--policy",
        help=f"Placement policy: {policy_names_text()} ({config_default_text('placement')})."
    ),
    preemption: bool | None = typer.Option(
        None, "--preemption/--no-preemption",
        help=f"Preempt lower priorities ({config_default_text('preemption')})."
    ),
    backfill: bool | None = typer.Option(
        None, "--backfill/--no-backfill",
        help=f"Backfill around a blocked head ({config_default_text('backfill')})."
    ),
    exclusive: bool = typer.Option(
        False, "--exclusive/--no-exclusive", help="Round every pod up to whole devices."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of every random choice."),
    json_out: Path = typer.Option(..., "--json", help="Where to write the metrics (JSON)."),
    plot: Path | None = typer.Option(
        None, "--plot", help="Also draw allocation over time: PNG, or SVG, PDF, EPS or JPEG by the name's "
        "suffix."),
    config_file: Path | None = typer.Option(
        None, "--config", help="The pool's configuration (YAML, as `gpupool up` reads; see `gpupool config "
        "show`): placement, ordering, preemption, backfill, priority classes, queues, and with --comm-model "
        "moving gangs off congestion (fabric.migrate_on_congestion); flags given here win."),
    prices_file: Path | None = typer.Option(
        None, "--prices", help="A price book (the `prices:` section of a pool configuration, or a file of "
        "it alone): adds the cost per tenant, pooled and exclusive, to the JSON."),
    budgets_file: Path | None = typer.Option(
        None, "--budgets", help="Tenants' budgets (YAML: period, warn, tenants: {NAME: AMOUNT}; needs a "
        "price book): a tenant's work waits once its spend reaches its budget; the JSON counts the waits."),
    fabric_file: Path | None = typer.Option(
        None, "--fabric", help="An ibnetdiscover file (or one from `gpupool fabric generate`) the scheduler "
        "places by: nodes are mapped onto its hosts in natural name order, one host each."),
    comm_model: str | None = typer.Option(
        None, "--comm-model", help="'default' or a YAML file (needs --fabric): multi-node gangs run at the "
        "rate their all-reduce allows on the fabric (seeded model classes); the JSON adds their traffic."),
    critical_share: float = typer.Option(
        0.0, "--critical-share", help="Philly: this fraction of jobs (seeded) is of class critical, the "
        "rest keep their draw; the JSON's by_priority_class shows each class's delays and preemptions."),
) -> None:
    """Replay a trace over time: arrivals, completions, full admission + placement per event.

    Placement, ordering, preemption and backfill are the configuration's (--config, else its
    defaults, as `gpupool up`; `gpupool config show` prints them) unless given here.

    Example: gpupool sim replay --cluster 64x8xV100M32 --trace philly:jobs.csv --preemption --json out.json
    """
    with reports_run_errors():
        check_plot_path(plot, "--plot")
        config = None
        if config_file is not None:
            from gpupool.config import load_config

            config = load_config(config_file)
            for note in config.notes():  # as `gpupool up` and `config check` say it
                print(f"Note: {note}", file=sys.stderr)
        prices = None
        if prices_file is not None:
            from gpupool.prices import load_prices

            prices = load_prices(prices_file)
        elif config is not None and "prices" in config.model_fields_set:
            prices = config.prices
        budgets = None
        if budgets_file is not None:
            from gpupool.sim.budgets import load_budgets

            if prices is None:
                raise InvalidInput("--budgets needs a price book to meter spend: give --prices FILE too.")
            budgets = load_budgets(budgets_file)
        result = run_replay(
            nodes,
            cluster,
            trace,
            window,
            ordering,
            policy,
            preemption,
            backfill,
            exclusive,
            seed,
            tune_gc=True,
            config=config,
            prices=prices,
            budgets=budgets,
            fabric=fabric_file,
            comm_model=comm_model,
            critical_share=critical_share,
        )
        result["config"]["config_file"] = str(config_file) if config_file is not None else None
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=2, sort_keys=True))
        if plot is not None:
            from gpupool.sim.replay_plot import plot_replay

            plot_replay(result, plot)
    _print_summary(result)


def _print_summary(result: dict[str, Any]) -> None:
    from rich.table import Table

    from gpupool.cli.output import console

    table = Table(title="replay")
    table.add_column("metric")
    table.add_column("value", justify="right")
    delay = result["queue_delay_s"]
    rows = [
        ("jobs (finished / rejected)", f"{result['jobs']} ({result['finished']} / {result['rejected']})"),
        ("devices allocated, mean %", f"{result['gpu_alloc_pct_mean']:.1f}"),
        (
            "queue delay mean / p99 (s)",
            f"{delay['mean']:.0f} / {delay['p99']:.0f}",
        ),
        ("JCT mean / p99 (s)", f"{result['jct_s']['mean']:.0f} / {result['jct_s']['p99']:.0f}"),
        ("makespan (s)", f"{result['makespan_s']:.0f}"),
        ("preemptions / evictions", f"{result['preemptions']} / {result['evictions']}"),
        ("lost device-hours", f"{result['lost_gpu_hours']:.1f}"),
        ("fairness (Jain)", f"{result['fairness_jain']:.3f}"),
        ("wall (s)", f"{result['wall_s']:.1f}"),
    ]
    if "cost" in result:
        from gpupool.money import money

        total, currency = result["cost"]["total"], result["cost"]["currency"]
        pooled, exclusive = money(total["pooled_cost"], currency), money(total["exclusive_cost"], currency)
        rows.insert(-1, (f"cost pooled / exclusive ({currency})", f"{pooled} / {exclusive}"))
    for name, value in rows:
        table.add_row(name, value)
    console().print(table)
