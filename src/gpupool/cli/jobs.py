"""`gpupool hold | release | update | requeue ID...`: job control of pending and running workloads
(Slurm's scontrol hold/release/update and requeue)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from gpupool.cli._common import client, in_flag_terms, reports_errors
from gpupool.cli._targets import resolve_targets
from gpupool.errors import GpupoolError

IDS_HELP = "Workload ids, or unique prefixes of them (an array's tasks one by one: ID_INDEX)."
UPDATE_FLAGS = {"priority": "--priority", "time_limit_s": "--time-limit", "gpus": "--gpus",
                "replicas": "--replicas"}
"""The option of `update` behind each field the server may refuse."""


def _each(ids: list[str], act: Callable[[Any, str], Any], flags: dict[str, str] | None = None) -> None:
    """Act on every target, one line each ('ID STATUS held'), errors one line each (a field of
    `flags` named as its option); the first error's exit code is the command's."""
    code = 0
    with client() as pool:
        for target in resolve_targets(pool, ids):
            if target.is_array:
                print(f"Error: {target.id} is an array; name its tasks ({target.id}_0, ...) one by one.",
                      file=sys.stderr)
                code = code or 2
                continue
            try:
                workload = act(pool, target.id)
            except GpupoolError as exc:
                print(f"Error: {in_flag_terms(exc.message, flags or {})}", file=sys.stderr)
                code = code or exc.exit_code
                continue
            held = f" held ({workload.held})" if workload.held else ""
            print(f"{workload.id} {workload.status}{held}")
    if code:
        raise typer.Exit(code)


@reports_errors
def hold(workload_ids: Annotated[list[str], typer.Argument(help=IDS_HELP)]) -> None:
    """Keep pending workloads from being placed until `gpupool release` (Slurm's scontrol hold). A
    hold the admin sets only the admin releases.

    Example: gpupool hold w-1a2b

    Exit codes: 0 held, 2 bad usage, an ambiguous prefix or not pending (see `gpupool requeue
    --hold` for running work), 3 not found (or another tenant's), 4 server unreachable.
    """
    _each(workload_ids, lambda pool, wid: pool.hold(wid))


@reports_errors
def release(workload_ids: Annotated[list[str], typer.Argument(help=IDS_HELP)]) -> None:
    """Let held workloads be placed again (Slurm's scontrol release).

    Example: gpupool release w-1a2b

    Exit codes: 0 released, 2 bad usage, an ambiguous prefix or not pending, 3 not found (or
    another tenant's, or held by the admin), 4 server unreachable.
    """
    _each(workload_ids, lambda pool, wid: pool.release(wid))


@reports_errors
def update(
    workload_ids: Annotated[list[str], typer.Argument(help=IDS_HELP)],
    priority: Annotated[int | None, typer.Option(
        "--priority", "-p", help="-1000..1000, within the tenant's max priority.")] = None,
    time_limit: Annotated[str | None, typer.Option(
        "--time-limit", help="90s, 30m, 2h, 1d, 1:30:00 or 2-12:00:00 (a bare number is refused).")] = None,
    gpus: Annotated[float | None, typer.Option(
        "--gpus", "-g", help="Per replica: a fraction of one device (0.25) or whole devices (2).")] = None,
    replicas: Annotated[int | None, typer.Option("--replicas", "-r", help="Pods placed all-or-nothing.")
                        ] = None,
) -> None:
    """Change pending workloads (Slurm's scontrol update): priority, time limit, gpus or replicas.
    Refused, with the reason, once a workload was admitted (`gpupool requeue` sends it back).

    Example: gpupool update w-1a2b --gpus 2 --time-limit 4h

    Exit codes: 0 updated, 2 bad usage, an invalid value or not pending, 3 not found (or another
    tenant's), 4 server unreachable.
    """
    if priority is None and time_limit is None and gpus is None and replicas is None:
        print("Error: say what to change: --priority, --time-limit, --gpus or --replicas.", file=sys.stderr)
        raise typer.Exit(2)
    seconds: float | None = None
    if time_limit is not None:
        from gpupool.durations import duration_s

        try:
            seconds = duration_s(time_limit)
        except ValueError:
            print(f"Error: Option --time-limit takes a duration such as 90s, 30m, 2h, 1d, 1:30:00 or "
                  f"2-12:00:00 (days-hours), got {time_limit!r}.", file=sys.stderr)
            raise typer.Exit(2) from None
    _each(workload_ids, lambda pool, wid: pool.update(wid, priority=priority, time_limit=seconds, gpus=gpus,
                                                      replicas=replicas), flags=UPDATE_FLAGS)


@reports_errors
def requeue(
    workload_ids: Annotated[list[str], typer.Argument(help=IDS_HELP)],
    hold_: Annotated[bool, typer.Option("--hold", help="Hold it once back in pending.")] = False,
) -> None:
    """Stop admitted or running workloads and send them back to pending (Slurm's requeue); they are
    placed again like any pending work, resuming from their checkpoints. A tenant's requeue counts
    against its max_pending, as a submission does.

    Example: gpupool requeue w-1a2b --hold

    Exit codes: 0 requeued, 2 bad usage, an ambiguous prefix, not admitted/running or the tenant at
    its max_pending, 3 not found (or another tenant's), 4 server unreachable.
    """
    _each(workload_ids, lambda pool, wid: pool.requeue(wid, hold=hold_))



