"""`gpupool profiles`: list the device profiles gpupool knows, as a table or JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.table import Table

from gpupool.cli._common import hand_down
from gpupool.errors import GpupoolError
from gpupool.profiles import DeviceProfile, load_profiles

app = typer.Typer(help="Device profiles gpupool knows: ls.\n\nExample: gpupool profile ls --json",
                  add_completion=False)


def _num(value: float | int | None, unit: str = "") -> str:
    if value is None:
        return "-"
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return f"{text}{unit}"


def _memory(profile: DeviceProfile) -> str:
    return f"{profile.memory_mib / 1024:g} GiB" if profile.memory_known else "unknown"


def _sharing(profile: DeviceProfile) -> str:
    parts = []
    if profile.sharing.mps:
        parts.append("mps" if profile.sharing.mps_limits else "mps (uncapped)")
    if profile.sharing.mig:
        parts.append(f"mig x{len(profile.sharing.mig)}")
    if profile.sharing.time_slice:
        parts.append("time-slice")
    return ", ".join(parts) or "-"


def _aliases(profile: DeviceProfile) -> str:
    """The aliases one types on a command line (the drivers' spaced names are left to --json)."""
    return ", ".join(a for a in profile.aliases if " " not in a) or "-"


def _table(profiles: list[DeviceProfile]) -> Table:
    table = Table(title="Device profiles")
    right = ("memory", "bf16 TF", "fp16 TF", "$/h")
    for column in ("model", "aliases", "vendor", "kind", "memory", "units", "bf16 TF", "fp16 TF",
                   "interconnect", "sharing", "$/h"):
        table.add_column(column, justify="right" if column in right else "left", no_wrap=column == "model")
    for p in profiles:
        link = f"{p.interconnect.kind} {p.interconnect.bandwidth_gb_s:g} GB/s" if p.interconnect else "-"
        units = f"{p.compute_units} {p.compute_unit_name}" if p.compute_units else "-"
        table.add_row(p.model, _aliases(p), str(p.vendor), str(p.kind), _memory(p), units,
                      _num(p.bf16_tflops), _num(p.fp16_tflops), link, _sharing(p),
                      _num(p.price_usd_per_hour))
    return table


AS_JSON = typer.Option(False, "--json", help="Print the profiles as JSON.")
DIRECTORY = typer.Option([], "--dir", help="Also read profile files from this directory (repeatable).")


@app.callback(invoke_without_command=True)
def _group(ctx: typer.Context, as_json: bool = AS_JSON, directory: list[Path] = DIRECTORY) -> None:
    """Device profiles: `gpupool profile ls` (or just `gpupool profile`) lists them.

    Example: gpupool profile ls --json
    """
    if ctx.invoked_subcommand is None:
        _list(as_json, directory)
    hand_down(ctx, as_json=as_json, directory=directory)  # `profile --json ls` is `profile ls --json`


@app.command("ls")
def list_profiles(as_json: bool = AS_JSON, directory: list[Path] = DIRECTORY) -> None:
    """List the device profiles (built-in, GPUPOOL_PROFILES_DIR and --dir) with their aliases.

    Example: gpupool profile ls --dir ./my-profiles
    """
    _list(as_json, directory)


def _list(as_json: bool, directory: list[Path]) -> None:
    try:
        profiles = load_profiles(extra_dirs=directory)
    except GpupoolError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    ordered = [profiles[m] for m in profiles]
    if as_json:
        typer.echo(json.dumps([p.model_dump(mode="json") for p in ordered], indent=2))
        return
    from gpupool.cli.output import console

    console().print(_table(ordered))
