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
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpupool.cli._common import client, flags_for_fields, reports_errors
from gpupool.cli._reconnect import DEFAULT_RECONNECT_S, Reconnecting, ReconnectOption
from gpupool.cli._targets import resolve

if TYPE_CHECKING:
    from gpupool.client import Client

POLL_S = 0.25


@reports_errors
@flags_for_fields(rank="--rank", attempt="--attempt")
def logs(
    workload_id: Annotated[str, typer.Argument(help="The workload id, or a unique prefix of it.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until it ends.")] = False,
    rank: Annotated[int, typer.Option("--rank", min=0, help="Which pod of a gang (0 to replicas-1).")] = 0,
    stdout: Annotated[bool, typer.Option("--stdout", help="Only its standard output (a workload "
                                         "submitted with --separate-stderr).")] = False,
    stderr: Annotated[bool, typer.Option("--stderr", help="Only its standard error (likewise).")] = False,
    attempt: Annotated[int | None, typer.Option("--attempt", min=1, help="Which attempt (1 = the first "
                                                "run; a requeue, retry or preemption starts the next); "
                                                "default: the newest.")] = None,
    all_attempts: Annotated[bool, typer.Option("--all-attempts", help="Every attempt's output, oldest "
                                               "first, each under a '==> attempt N (POD) <==' line; -f "
                                               "follows the newest.")] = False,
    reconnect: ReconnectOption = DEFAULT_RECONNECT_S,
) -> None:
    """Print the output of one pod: stdout and stderr as written (or, for a workload submitted with
    --separate-stderr, both or one of them), of its newest attempt unless --attempt or --all-attempts.

    Example: gpupool logs w-1a2b -f --rank 1

    Example: gpupool logs w-1a2b --all-attempts

    Exit codes: 0 ok, 2 bad usage or an ambiguous id prefix, 3 not found (the workload, replica or
    attempt), 4 server unreachable (with -f, after --reconnect).
    """
    if stdout and stderr:
        print("Error: --stdout and --stderr exclude each other; give neither to see both.", file=sys.stderr)
        raise typer.Exit(2)
    if attempt is not None and all_attempts:
        print("Error: --attempt and --all-attempts exclude each other; give one.", file=sys.stderr)
        raise typer.Exit(2)
    streams = ["stderr"] if stderr else ["stdout"]
    retry = Reconnecting(reconnect if follow else 0)
    with client() as pool:
        workload = retry.call(lambda: resolve(pool, workload_id))
        wid = workload.id
        first = retry.call(lambda: pool.logs(wid, rank=rank, offset=0, stream="stdout", attempt=attempt))
        if not first.attempts and not first.text:  # no pod of it has started: say why there is nothing
            print(not_started_note(workload, follow), file=sys.stderr)
        if first.combined and stdout:
            print(f"Error: workload {wid}'s stderr is in its output with stdout, in the order written; "
                  "give neither --stdout nor --stderr (or submit with --separate-stderr).", file=sys.stderr)
            raise typer.Exit(2)
        if not first.combined and not stdout and not stderr:
            streams = ["stdout", "stderr"]
        if not all_attempts or not first.attempts:
            _print_attempt(pool, retry, wid, rank, streams, attempt, follow)
            return
        for number in first.attempts:
            _print_attempt(pool, retry, wid, rank, streams, number, follow and number == first.attempts[-1],
                           header=True)


def not_started_note(workload: Any, follow: bool) -> str:
    """One line for a workload none of whose pods has started (`workload`: its summary or itself)."""
    why = ": ".join(part for part in (workload.reason, workload.message.rstrip(".")) if part)
    state = f"{workload.status}: {why}" if why else workload.status
    if workload.status in ("succeeded", "failed", "cancelled"):
        return f"gpupool: {workload.id} ended before any pod of it started ({state}); it has no output."
    then = ("waiting for its output" if follow
            else f"its output shows once it runs (`gpupool logs {workload.id} -f`)")
    return f"gpupool: {workload.id} has not started yet ({state}); {then}."


def _print_attempt(pool: Client, retry: Reconnecting, wid: str, rank: int, streams: list[str],
                   attempt: int | None, follow: bool, *, header: bool = False) -> None:
    """Print one attempt's streams from their start (the newest attempt's for None), after a
    '==> attempt N (POD) <==' line with `header`; with `follow`, until it is complete."""
    offsets = dict.fromkeys(["stdout", "stderr"], 0)
    while True:
        complete, wrote = True, False
        for stream in streams:
            chunk = retry.call(lambda s=stream: pool.logs(wid, rank=rank, offset=offsets[s],  # type: ignore[misc]
                                                          stream=s, attempt=attempt))
            if header:
                sys.stdout.write(f"==> attempt {chunk.attempt} ({chunk.pod_id}) <==\n")
                header = False
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
