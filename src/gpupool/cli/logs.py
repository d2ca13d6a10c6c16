"""`gpupool logs ID [-f]`: print a pod's output (stdout and stderr), optionally until the workload ends.

As sbatch does without --error, a pod's stdout and stderr go to one file on its node, in the order
they were written (both descriptors share one open file; no copy through the agent, so launching
stays cheap and a pod keeps writing while the server restarts): `logs` prints it as it is. A
workload submitted with --separate-stderr has two files: `logs` then prints both (at each poll with
-f; stdout then stderr for what was already written), and --stdout / --stderr pick one.
"""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from gpupool.cli._common import client, reports_errors
from gpupool.cli._reconnect import DEFAULT_RECONNECT_S, Reconnecting, ReconnectOption
from gpupool.cli._targets import resolve

POLL_S = 0.25


@reports_errors
def logs(
    workload_id: Annotated[str, typer.Argument(help="The workload id, or a unique prefix of it.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until it ends.")] = False,
    rank: Annotated[int, typer.Option("--rank", min=0, help="Which pod of a gang (0 to replicas-1).")] = 0,
    stdout: Annotated[bool, typer.Option("--stdout", help="Only its standard output (a workload "
                                         "submitted with --separate-stderr).")] = False,
    stderr: Annotated[bool, typer.Option("--stderr", help="Only its standard error (likewise).")] = False,
    reconnect: ReconnectOption = DEFAULT_RECONNECT_S,
) -> None:
    """Print the output of one pod: stdout and stderr as written (or, for a workload submitted with
    --separate-stderr, both or one of them).

    Example: gpupool logs w-1a2b -f --rank 1

    Exit codes: 0 ok, 2 bad usage or an ambiguous id prefix, 3 not found, 4 server unreachable
    (with -f, after --reconnect).
    """
    if stdout and stderr:
        print("Error: --stdout and --stderr exclude each other; give neither to see both.", file=sys.stderr)
        raise typer.Exit(2)
    streams = ["stderr"] if stderr else ["stdout"]
    retry = Reconnecting(reconnect if follow else 0)
    offsets = dict.fromkeys(["stdout", "stderr"], 0)
    with client() as pool:
        wid = retry.call(lambda: resolve(pool, workload_id)).id
        first = retry.call(lambda: pool.logs(wid, rank=rank, offset=0, stream="stdout"))
        if first.combined and stdout:
            print(f"Error: workload {wid}'s stderr is in its output with stdout, in the order written; "
                  "give neither --stdout nor --stderr (or submit with --separate-stderr).", file=sys.stderr)
            raise typer.Exit(2)
        if not first.combined and not stdout and not stderr:
            streams = ["stdout", "stderr"]
        while True:
            complete, wrote = True, False
            for stream in streams:
                chunk = retry.call(lambda s=stream: pool.logs(wid, rank=rank, offset=offsets[s],  # type: ignore[misc]
                                                              stream=s))
                if chunk.text:
                    sys.stdout.write(chunk.text)
                    sys.stdout.flush()
                    wrote = True
                offsets[stream] = chunk.offset
                complete = complete and chunk.complete
            if complete or (not follow and not wrote):
                return
            if not wrote:
                time.sleep(POLL_S)
