"""`gpupool sim federate`: replay a trace over a federation of pools, placement policies side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from gpupool.cli._common import reports_run_errors
from gpupool.errors import InvalidInput

DEFAULT_VARIANTS = "home,cheapest,fastest,balanced,data-local,balanced+failure"


def parse_variants(text: str) -> list[Any]:
    """'home,balanced+failure' -> Variants; a misspelt policy gets a did-you-mean (InvalidInput)."""
    from gpupool.core.federation import parse_policy
    from gpupool.sim.federation import Variant

    out = []
    for raw in (p.strip() for p in text.split(",")):
        if not raw:
            continue
        name, plus, extra = raw.partition("+")
        if plus and extra != "failure":
            raise InvalidInput(f"Cannot read variant {raw!r}; write POLICY or POLICY+failure.")
        try:
            policy = parse_policy(name)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        out.append(Variant(raw, policy, failure=bool(plus)))
    if not out:
        raise InvalidInput("--variants names no policy; give e.g. home,balanced.")
    return out


def build_setup(fed_file: Path, trace: str, window: str | None, seed: int,
                config_file: Path | None = None, variants: list[Any] | None = None) -> Any:
    """The federated replay's inputs: the members' nodes, the trace's jobs (in the window), the data
    sets; InvalidInput when a `+failure` variant meets a file without a failure."""
    from gpupool.config import PoolConfig, load_config
    from gpupool.providers.nodespec import nodes_from_spec
    from gpupool.sim.federation import FedSetup, draw_datasets
    from gpupool.sim.federation_config import load_fed_spec
    from gpupool.sim.jobs import in_window, load_trace, parse_window

    spec = load_fed_spec(fed_file)
    failing = [v.name for v in variants or () if v.failure]
    if failing and spec.failure is None:
        raise InvalidInput(f"Variant {failing[0]!r} needs a member that fails: add `failure: {{member: NAME, "
                           f"at_h: H, for_h: 24}}` to {fed_file}, or drop '+failure'.")
    nodes = {m.name: tuple(nodes_from_spec(m.cluster)) for m in spec.members}
    per_node = max(len(n.devices) for ns in nodes.values() for n in ns)
    span = parse_window(window) if window else None
    jobs = in_window(load_trace(trace, per_node, seed), span)
    if not jobs:
        raise InvalidInput("No jobs in the trace fall inside the window; widen --window.")
    policies = (load_config(config_file) if config_file is not None else PoolConfig()).policies()
    sizes, holders, per_job = draw_datasets(spec, jobs, seed)
    return FedSetup(spec, nodes, tuple(jobs), policies, seed, sizes, holders, per_job)


def federate(
    federation: Path = typer.Option(
        ..., "--federation", help="The hub's fed.yaml (members, prices, regions, data sets, tenants' "
        "homes) with a `simulation` section (members' nodes, drawn data sets, a failure, the re-offer); see "
        "docs/experiments/federation.md."),
    trace: str = typer.Option(..., "--trace", help="FORMAT:FILE, e.g. philly:philly-sia.csv."),
    window: str | None = typer.Option(
        None, "--window", help="START:END as ISO dates (2017-10-01:2017-10-15) or trace seconds."),
    variants: str = typer.Option(
        DEFAULT_VARIANTS, "--variants", help="Comma-separated policies (home, cheapest, fastest, balanced, "
        "data-local), each optionally +failure (the file's member fails for a while)."),
    seed: int = typer.Option(0, "--seed", help="Seed of every random choice (priorities, data sets)."),
    config_file: Path | None = typer.Option(
        None, "--config", help="The members' pool configuration (as `gpupool up` reads); default: its "
        "defaults."),
    json_out: Path = typer.Option(..., "--json", help="Where to write the metrics (JSON)."),
) -> None:
    """Replay a trace over a federation of pools, each placement policy in its own run of the same jobs.

    Every member runs the same scheduler as `gpupool sim replay`; the hub ranks the members at each
    arrival by the policy (docs/federation.md, Placement policies) and offers the job down that
    list, the first member that starts it keeping it.

    Example: gpupool sim federate --federation fed.yaml --trace philly:philly-sia.csv
    --window 2017-10-01:2017-10-08 --json out.json
    """
    with reports_run_errors():
        chosen = parse_variants(variants)
        setup = build_setup(federation, trace, window, seed, config_file, chosen)
        from gpupool.sim.federation import run_variants

        rows = run_variants(setup, chosen)
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({"seed": seed, "window": window, "trace": trace, "variants": rows},
                                       indent=2, sort_keys=True))
    print_rows(rows)


def print_rows(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="federated replay")
    for col in ("variant", "cost", "egress", "data GB", "JCT mean h", "JCT p95 h", "queue h", "remote",
                "moved by failure"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["variant"], f"{r['total_cost']:.0f}", f"{r['egress_cost']:.0f}",
                      f"{r['data_moved_gb']:.0f}",
                      f"{r['jct_mean_s'] / 3600:.2f}", f"{r['jct_p95_s'] / 3600:.2f}",
                      f"{r['queue_mean_s'] / 3600:.2f}", f"{100 * r['remote_share']:.0f} %",
                      str(r["moved_by_failure"]))
    Console().print(table)
