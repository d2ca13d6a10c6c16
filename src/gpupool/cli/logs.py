"""`gpupool logs ID [-f]`: print a pod's output, optionally following it until the workload ends."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from gpupool.cli._common import client, reports_errors


@reports_errors
def logs(
    workload_id: Annotated[str, typer.Argument(help="The workload id.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until it ends.")] = False,
    rank: Annotated[int, typer.Option("--rank", min=0, help="Which replica's output.")] = 0,
    stderr: Annotated[bool, typer.Option("--stderr", help="Show standard error instead.")] = False,
) -> None:
    """Print the output of one replica. Exit codes: 0 ok, 3 not found, 4 server unreachable."""
    offset = 0
    with client() as pool:
        while True:
            chunk = pool.logs(workload_id, rank=rank, offset=offset, stream="stderr" if stderr else "stdout")
            if chunk.text:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
            offset = chunk.offset
            if not follow or chunk.complete:
                return
            if not chunk.text:
                time.sleep(0.25)
