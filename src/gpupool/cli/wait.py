"""`gpupool wait ID...`: block until workloads finish; print how each ended; the exit code says how."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from gpupool.cli._common import client, reports_errors
from gpupool.cli._reconnect import DEFAULT_RECONNECT_S, Reconnecting, ReconnectOption
from gpupool.cli._targets import resolve_all

FINAL = ("succeeded", "failed", "cancelled")


def outcome(workload: Any) -> str:
    """'ID STATUS: REASON: MESSAGE', the message of the pod that failed when there is one."""
    message = workload.message
    if workload.status == "failed":
        failed = [p for p in workload.pods if p.status in ("failed", "lost") and p.message]
        if failed:
            message = failed[0].message + (f" (pod {failed[0].name})" if len(workload.pods) > 1 else "")
    return f"{workload.id} {workload.status}: {workload.reason}: {message.rstrip('.')}"


@reports_errors
def wait(
    workload_ids: Annotated[list[str], typer.Argument(help="Workload ids, or unique prefixes of them.")],
    any_: Annotated[bool, typer.Option("--any", help="Return when the first one ends.")] = False,
    all_: Annotated[
        bool, typer.Option("--all", help="Return when every one has ended (the default).")
    ] = False,
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=0, help="Give up after this many seconds.")
    ] = None,
    reconnect: ReconnectOption = DEFAULT_RECONNECT_S,
) -> None:
    """Wait for workloads to finish; print one line for each: ID STATUS: REASON: MESSAGE.

    Example: gpupool wait w-1a2b w-3c4d --any

    Exit codes: 0 it succeeded (with --all, every one did), 1 it failed or was cancelled (or the
    timeout passed), 2 an ambiguous id prefix, 3 not found, 4 server unreachable (after --reconnect).
    """
    if any_ and all_:
        print("Error: --any and --all exclude each other; give one.", file=sys.stderr)
        raise typer.Exit(2)
    retry = Reconnecting(reconnect)
    deadline = None if timeout is None else time.monotonic() + timeout
    with client() as pool:
        waiting = [w.id for w in retry.call(lambda: resolve_all(pool, workload_ids))]
        ended: list[Any] = []
        poll_s = min(1.0, 0.2 + 0.02 * len(waiting))
        while waiting:
            for workload_id in list(waiting):
                current = retry.call(lambda wid=workload_id: pool.workload(wid))  # type: ignore[misc]
                if current.status in FINAL:
                    print(outcome(current), flush=True)
                    ended.append(current)
                    waiting.remove(workload_id)
            if ended and any_:
                break
            if waiting and deadline is not None and time.monotonic() >= deadline:
                still = ", ".join(waiting[:5]) + (" ..." if len(waiting) > 5 else "")
                raise TimeoutError(f"Still not finished after {timeout:g} s: {still}.")
            if waiting:
                time.sleep(poll_s)
    if any(w.status != "succeeded" for w in (ended[:1] if any_ else ended)):
        raise typer.Exit(1)
