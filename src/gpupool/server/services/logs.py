"""Workload logs: the output of one pod, read from the provider by byte offset.

Streams: `stdout`, `stderr`, and `notes`, what the node's agent says about the pod (where it runs,
and why). stdout and stderr are kept in two files, written by the pod directly (no copy through the
agent), so `gpupool logs` shows both but cannot order one's lines against the other's exactly.
"""

from __future__ import annotations

from sqlalchemy import select

from gpupool.api.workloads import LogsOut
from gpupool.core.model import WorkloadStatus
from gpupool.errors import InvalidInput, NotFound, ProviderError
from gpupool.providers.base import Provider
from gpupool.server.auth import Principal
from gpupool.server.orm import PodRow, WorkloadRow
from gpupool.server.runtime import Runtime

MAX_ATTEMPT_PARTS = 16
"""How many attempts' logs one all_attempts answer carries (the newest): each part is up to a
provider read (1 MiB), so the answer stays bounded however often the workload was requeued."""


def read(rt: Runtime, who: Principal, workload_id: str, *, rank: int, offset: int,
         stream: str = "stdout", attempt: int | None = None, all_attempts: bool = False) -> LogsOut:
    """One pod's log from `offset`: the newest attempt's, or `attempt`'s; with `all_attempts`,
    each attempt's from its start in `parts`. Raises NotFound (an unknown or another tenant's
    workload, replica or attempt) and InvalidInput (stderr of a combined log, offset with
    all_attempts)."""
    if all_attempts and (attempt is not None or offset):
        raise InvalidInput("all_attempts reads every attempt from its start; give attempt=N (with its "
                           "offset) to read more of one.")
    with rt.store.read() as session:
        row = session.get(WorkloadRow, workload_id)
        if row is None or not who.may_see(row.tenant):
            raise NotFound(f"No workload {workload_id!r}; list yours with `gpupool ls`.")
        pods = session.execute(
            select(PodRow.id, PodRow.attempt).where(PodRow.workload_id == workload_id, PodRow.rank == rank)
            .order_by(PodRow.attempt)
        ).all()
        final = WorkloadStatus(row.status).is_final
        if not pods and rank >= max(1, int(row.spec.get("replicas", 1))):
            raise NotFound(f"Workload {workload_id} has no replica {rank}.")
        combined = not row.spec.get("separate_stderr", False)
    if stream == "stderr" and combined:
        raise InvalidInput(f"Workload {workload_id}'s stderr is in its output with stdout, in the order "
                           "written; read that (no --stderr), or submit with --separate-stderr to keep "
                           "it apart.")
    by_attempt = {int(p.attempt): str(p.id) for p in pods}
    attempts = sorted(by_attempt)
    newest = attempts[-1] if attempts else 0
    if attempt is not None and attempt not in by_attempt:
        have = f"its attempts so far: {', '.join(map(str, attempts))}" if attempts else "none has started yet"
        raise NotFound(f"Workload {workload_id} has no attempt {attempt} of replica {rank}; {have}.")

    def part(number: int, start: int) -> LogsOut:
        text, next_offset, finished = read_provider_log(rt.provider, by_attempt[number], stream, start)
        over = final or number < newest  # an earlier attempt's pods have all ended
        return LogsOut(workload_id=workload_id, pod_id=by_attempt[number], offset=next_offset, text=text,
                       complete=over and finished, combined=combined, attempt=number, attempts=attempts)

    if all_attempts:
        parts = [part(number, 0) for number in attempts[-MAX_ATTEMPT_PARTS:]]
        return LogsOut(workload_id=workload_id, pod_id=by_attempt.get(newest, ""), offset=0, text="",
                       complete=all(p.complete for p in parts) if parts else final, combined=combined,
                       attempt=newest, attempts=attempts, parts=parts)
    if not attempts:
        return LogsOut(workload_id=workload_id, pod_id="", offset=offset, text="", complete=final,
                       combined=combined, attempt=0)
    return part(newest if attempt is None else attempt, offset)


def read_provider_log(provider: Provider, pod_id: str, stream: str, offset: int) -> tuple[str, int, bool]:
    """Text from byte `offset`, the next offset, and whether the pod ended and all was read.

    A provider that keeps no output answers empty and finished.
    """
    try:
        chunk = provider.read_log(pod_id, stream, offset)
    except (NotFound, ProviderError):
        return "", offset, True
    except InvalidInput:
        if stream != "notes":
            raise
        return "", offset, True  # a provider that keeps no notes: nothing to say
    return str(chunk.text), int(chunk.next_offset), bool(chunk.finished)
