"""`gpupool sim`: replay cluster traces through the same scheduling code the server runs."""

from __future__ import annotations

import importlib
import importlib.util

import typer

app = typer.Typer(
    help="Replay cluster traces through the scheduler: `fill` (the FGD paper's packing protocol), "
    "`replay` (arrivals and departures over time), `federate` (a replay over a federation of pools, "
    "placement policies side by side), `serve` (LLM inference, co-located or split into prefill "
    "and decode pools) and `colocate` (inference services and batch on one pool against a static "
    "split). `fill` and `replay` take --policy (default: `gpupool up`'s) and --seed."
    "\n\nExample: gpupool sim fill --nodes nodes.csv --pods pods.csv --seed 42",
    no_args_is_help=True,
)


@app.callback()
def _group() -> None:
    """Keep `sim` a group even while only one protocol module is present."""


# Each protocol lives in its own module exposing a function named like the command.
for _name in ("fill", "replay", "federate", "serve", "colocate"):
    _module = f"gpupool.cli.sim_{_name}"
    if importlib.util.find_spec(_module) is not None:
        app.command(_name)(getattr(importlib.import_module(_module), _name))
