"""`gpupool alloc` and `gpupool exec`: the typer forms (their --help); cli/alloc_fast.py serves them."""

from __future__ import annotations

import typer


def alloc(ctx: typer.Context) -> None:
    """Hold a slice (like salloc): submit an allocation, wait for its placement, then run CMD inside
    it and release it when CMD exits, exiting with CMD's code. Takes every option of `gpupool submit`
    (--gpus, --gpu-memory, --time-limit, --priority-class, ...) before `--`. On a terminal without a
    command it opens an interactive shell inside the allocation instead, released when the shell
    exits; otherwise (in a script) it prints the allocation's id and leaves it held for
    `gpupool exec ID -- CMD`, until `gpupool cancel ID` or its time limit. Ctrl-C while it waits
    cancels it.

    Examples: gpupool alloc --gpus 1 --time-limit 2h          (a shell inside one GPU)
              gpupool alloc --gpus 0.5 -- python train.py     (run, then release)
              ID=$(gpupool alloc --gpus 1) && gpupool exec $ID -- nvidia-smi

    Exit codes: CMD's own, 2 bad usage or refused, 3 not found, 4 server unreachable.
    """
    from gpupool.cli.alloc_fast import run

    raise typer.Exit(run(list(ctx.args)))


def exec_(ctx: typer.Context) -> None:
    """Run a command inside a running workload (srun inside salloc, kubectl exec): the same tenant
    account, network namespace, environment (CUDA_VISIBLE_DEVICES, GPUPOOL_*) and limits as its pod;
    stdin, stdout and stderr streamed; exits with the command's code; Ctrl-C is forwarded.
    --pty (-t) gives it a pseudo-terminal of this window's size, for interactive programs.
    --rank N picks the pod of a multi-pod workload (default 0).

    Examples: gpupool exec w-1a2b -- nvidia-smi
              gpupool exec --pty w-1a2b -- bash
              echo data | gpupool exec w-1a2b -- sh -c 'cat > input.txt'

    Exit codes: the command's own, 2 bad usage, 3 not found (another tenant's, or it ended), 4 server
    unreachable.
    """
    from gpupool.cli.alloc_fast import exec_run

    raise typer.Exit(exec_run(list(ctx.args)))
