"""`gpupool wait ID...`: block until workloads finish; print how each ended; the exit code says how."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from gpupool.cli._common import client, reports_errors
from gpupool.cli._reconnect import DEFAULT_RECONNECT_S, Reconnecting, ReconnectOption
from gpupool.cli._targets import Target, resolve_targets

FINAL = ("succeeded", "failed", "cancelled")
UNFINISHED = ("pending", "admitted", "running")
REQUEST_TIMEOUT_S = 30.0
"""The client's own bound on one request (gpupool.client.Client's default)."""


def outcome(workload: Any) -> str:
    """'ID STATUS: REASON: MESSAGE', the message of the pod that failed when there is one."""
    message = workload.message
    if workload.status == "failed":
        failed = [p for p in workload.pods if p.status in ("failed", "lost") and p.message]
        if failed:
            message = failed[0].message + (f" (pod {failed[0].name})" if len(workload.pods) > 1 else "")
    return f"{workload.id} {workload.status}: {workload.reason}: {message.rstrip('.')}"


def array_outcome(pool: Any, target: Target) -> tuple[str, bool]:
    """('ID array of N tasks: 98 succeeded, 2 failed (first: ID_3 failed: ...)', all succeeded)."""
    counts = {s: pool.workloads(array_id=target.id, status=[s], limit=1).total for s in FINAL}
    line = f"{target.id} array of {target.tasks} tasks: " + ", ".join(
        f"{n} {s}" for s, n in counts.items() if n)
    bad = pool.workloads(array_id=target.id, status=["failed", "cancelled"], limit=1).items
    if bad:
        line += f" (first: {outcome(bad[0])})"
    return line, not bad and counts["succeeded"] == target.tasks


def _ended(pool: Any, target: Target) -> tuple[str, bool] | None:
    """(the line to print, succeeded) once `target` has ended, else None."""
    if target.is_array:
        if pool.workloads(array_id=target.id, status=UNFINISHED, limit=1).total:
            return None
        return array_outcome(pool, target)
    current = pool.workload(target.id)
    return (outcome(current), current.status == "succeeded") if current.status in FINAL else None


@reports_errors
def wait(
    workload_ids: Annotated[list[str], typer.Argument(
        help="Workload or array ids, or unique prefixes of them (an array ends when all its tasks have).")],
    any_: Annotated[bool, typer.Option("--any", help="Return when the first one ends.")] = False,
    all_: Annotated[
        bool, typer.Option("--all", help="Return when every one has ended (the default).")
    ] = False,
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=0, help="Give up after this many seconds.")
    ] = None,
    reconnect: ReconnectOption = DEFAULT_RECONNECT_S,
) -> None:
    """Wait for workloads to finish; print one line for each: ID STATUS: REASON: MESSAGE (for an
    array: ID array of N tasks: COUNTS (first: the first failed task's line)).

    Example: gpupool wait w-1a2b w-3c4d --any

    Exit codes: 0 it succeeded (with --all, every one did; an array: every task), 1 it failed or was
    cancelled (or the timeout passed), 2 an ambiguous id prefix, 3 not found, 4 server unreachable
    (after --reconnect, or once --timeout passed while retrying).
    """
    if any_ and all_:
        print("Error: --any and --all exclude each other; give one.", file=sys.stderr)
        raise typer.Exit(2)
    retry = Reconnecting(reconnect, timeout_s=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    # with --timeout, no one request may hang past it either (a server that accepts but never answers)
    bounded = {} if timeout is None else {"timeout_s": min(REQUEST_TIMEOUT_S, max(1.0, timeout)),
                                          "retry_unavailable_s": min(REQUEST_TIMEOUT_S, timeout)}
    with client(**bounded) as pool:
        waiting = list(retry.call(lambda: resolve_targets(pool, workload_ids)))
        succeeded: list[bool] = []
        poll_s = min(1.0, 0.2 + 0.02 * len(waiting))
        while waiting:
            for target in list(waiting):
                ended = retry.call(lambda t=target: _ended(pool, t))  # type: ignore[misc]
                if ended is not None:
                    print(ended[0], flush=True)
                    succeeded.append(ended[1])
                    waiting.remove(target)
            if succeeded and any_:
                break
            if waiting and deadline is not None and time.monotonic() >= deadline:
                still = ", ".join(t.id for t in waiting[:5]) + (" ..." if len(waiting) > 5 else "")
                raise TimeoutError(f"Still not finished after {timeout:g} s: {still}.")
            if waiting:
                time.sleep(poll_s)
    if not all(succeeded[:1] if any_ else succeeded):
        raise typer.Exit(1)
