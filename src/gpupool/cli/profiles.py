"""`gpupool profiles`: list the device profiles gpupool knows, as a table or JSON."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from gpupool.errors import GpupoolError
from gpupool.profiles import DeviceProfile, load_profiles

app = typer.Typer(help="List the device profiles gpupool knows.", add_completion=False)


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


def _table(profiles: list[DeviceProfile]) -> Table:
    table = Table(title="Device profiles")
    right = ("memory", "bf16 TF", "fp16 TF", "$/h")
    for column in ("model", "vendor", "kind", "memory", "units", "bf16 TF", "fp16 TF", "interconnect",
                   "sharing", "$/h"):
        table.add_column(column, justify="right" if column in right else "left", no_wrap=column == "model")
    for p in profiles:
        link = f"{p.interconnect.kind} {p.interconnect.bandwidth_gb_s:g} GB/s" if p.interconnect else "-"
        units = f"{p.compute_units} {p.compute_unit_name}" if p.compute_units else "-"
        table.add_row(p.model, str(p.vendor), str(p.kind), _memory(p), units,
                      _num(p.bf16_tflops), _num(p.fp16_tflops), link, _sharing(p),
                      _num(p.price_usd_per_hour))
    return table


@app.callback(invoke_without_command=True)
def list_profiles(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print the profiles as JSON."),
    directory: list[Path] = typer.Option(
        [], "--dir", help="Also read profile files from this directory (repeatable)."
    ),
) -> None:
    """List the device profiles (built-in, GPUPOOL_PROFILES_DIR and --dir)."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        profiles = load_profiles(extra_dirs=directory)
    except GpupoolError as exc:
        Console(stderr=True).print(f"[red]Error:[/red] {exc.message}", highlight=False)
        raise typer.Exit(exc.exit_code) from None
    ordered = [profiles[m] for m in profiles]
    if as_json:
        typer.echo(json.dumps([p.model_dump(mode="json") for p in ordered], indent=2))
        return
    Console().print(_table(ordered))
