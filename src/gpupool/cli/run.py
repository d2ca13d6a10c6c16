"""`gpupool run`: the typer form (its --help); the command itself is served by cli/run_fast.py."""

from __future__ import annotations

import typer


def run(ctx: typer.Context) -> None:
    """Submit a workload, wait for its placement, stream its stdout and stderr here, and exit with
    its code (like srun). Takes every option of `gpupool submit` (--gpus, --time-limit, --dependency,
    ...) before `--` and the command after it. SIGINT (Ctrl-C) or SIGTERM cancels the workload: its
    pods get SIGTERM, what they still write is shown, and run exits 128 + the signal's number.

    Example: gpupool run --gpus 0.5 -- python -c "import torch; print(torch.cuda.is_available())"

    Exit codes: the workload's own (0 when it succeeded), 128+N after signal N, 1 when it failed
    without a code (lost, time limit), 2 bad usage or refused, 3 not found, 4 server unreachable.
    """
    from gpupool.cli.run_fast import run as run_fast

    raise typer.Exit(run_fast(list(ctx.args)))
