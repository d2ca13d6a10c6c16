"""`gpupool run [submit options] -- COMMAND`: submit, wait for the placement, stream the pods' stdout
and stderr to this terminal's, forward SIGINT/SIGTERM, and exit with the workload's code (like srun).

A signal cancels the workload: its pods get SIGTERM (then SIGKILL after the grace), and `run` keeps
streaming what they write until they ended, then exits 128 + the signal's number unless the workload
ended with a code of its own. The submit options are `gpupool submit`'s (cli/submit_fast.py); the
output is kept per stream (--separate-stderr is implied) so stderr reaches stderr.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from types import FrameType
from typing import Any

from gpupool.cli.submit_fast import UsageError, parse

POLL_S = 0.2
FINAL = ("succeeded", "failed", "cancelled")


class _Signals:
    """The first SIGINT or SIGTERM received (the workload is cancelled once, at the next poll)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.forwarded = False

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum


def exit_code(workload: Any, signum: int | None) -> int:
    """The workload's code: 0 when it succeeded, its pods' code when it has one, 128 + the signal
    that cancelled it, else 1."""
    if workload.status == "succeeded":
        return 0
    if workload.exit_code is not None and workload.exit_code > 0:
        return int(workload.exit_code)
    if signum is not None:
        return 128 + signum
    return 1


def stream(pool: Any, workload_id: str, replicas: int,
           offsets: dict[tuple[int, str], tuple[str, int]]) -> bool:
    """Write what each pod wrote since the last call (stdout to stdout, stderr to stderr); True once
    the workload ended and all of it was written. A new attempt (a requeue) starts its logs afresh."""
    complete = True
    for rank in range(replicas):
        for name, out in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            pod_id, offset = offsets.get((rank, name), ("", 0))
            chunk = pool.logs(workload_id, rank=rank, offset=offset, stream=name)
            if chunk.pod_id != pod_id and offset:
                chunk = pool.logs(workload_id, rank=rank, offset=0, stream=name)
            if chunk.text:
                out.write(chunk.text)
                out.flush()
            offsets[(rank, name)] = (chunk.pod_id, chunk.offset)
            complete = complete and chunk.complete
    return complete


def run(args: list[str]) -> int:
    """Submit, follow, and return the exit code (2 bad usage, 3 not found, 4 unreachable)."""
    try:
        spec = parse(args)
    except UsageError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    if spec.get("array") is not None:
        print("Error: gpupool run follows one workload; submit arrays with `gpupool submit --array`.",
              file=sys.stderr)
        return 2
    spec["separate_stderr"] = True
    from gpupool.client import Client
    from gpupool.errors import GpupoolError

    signals = _Signals()
    previous = {s: signal.signal(s, signals) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with Client() as pool:
            workload_id = pool.submit(spec)
            print(f"gpupool: {workload_id} submitted", file=sys.stderr)
            replicas = int(spec.get("replicas", 1))  # type: ignore[call-overload]
            offsets: dict[tuple[int, str], tuple[str, int]] = {}
            said = ""
            while True:
                if signals.received is not None and not signals.forwarded:
                    signals.forwarded = True
                    with contextlib.suppress(GpupoolError):  # it ended meanwhile
                        pool.cancel(workload_id)
                    print(f"gpupool: {workload_id} cancelled ({signal.Signals(signals.received).name})",
                          file=sys.stderr)
                done = stream(pool, workload_id, replicas, offsets)
                workload = pool.workload(workload_id)
                if workload.status == "pending" and workload.reason != said:
                    said = workload.reason  # as srun says "queued and waiting for resources"
                    if said not in ("submitted", "released", "dependency_met"):
                        print(f"gpupool: {workload_id} pending: {said}: {workload.message}", file=sys.stderr)
                if workload.status in FINAL and done:
                    if workload.status != "succeeded":
                        print(f"gpupool: {workload_id} {workload.status}: {workload.message}",
                              file=sys.stderr)
                    return exit_code(workload, signals.received)
                time.sleep(POLL_S)
    except GpupoolError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
