"""`gpupool cancel ID`: cancel a workload (its pods are stopped)."""

from __future__ import annotations

from typing import Annotated

import typer

from gpupool.cli._common import client, reports_errors


@reports_errors
def cancel(workload_id: Annotated[str, typer.Argument(help="The workload id.")]) -> None:
    """Cancel a workload. Exit codes: 0 cancelled, 2 already finished, 3 not found, 4 unreachable."""
    with client() as pool:
        workload = pool.cancel(workload_id)
    print(f"{workload.id} {workload.status}")
