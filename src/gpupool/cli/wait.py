"""`gpupool wait ID`: block until a workload finishes; the exit code says how it ended."""

from __future__ import annotations

from typing import Annotated

import typer

from gpupool.cli._common import client, reports_errors


@reports_errors
def wait(
    workload_id: Annotated[str, typer.Argument(help="The workload id.")],
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=0, help="Give up after this many seconds.")
    ] = None,
) -> None:
    """Wait for a workload to finish.

    Exit codes: 0 it succeeded, 1 it failed or was cancelled (or the timeout passed), 3 not found,
    4 server unreachable.
    """
    with client() as pool:
        workload = pool.wait(workload_id, timeout_s=timeout)
    print(f"{workload.id} {workload.status}")
    if workload.status != "succeeded":
        raise typer.Exit(1)
