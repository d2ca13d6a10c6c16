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


def read(rt: Runtime, who: Principal, workload_id: str, *, rank: int, offset: int,
         stream: str = "stdout") -> LogsOut:
    with rt.store.read() as session:
        row = session.get(WorkloadRow, workload_id)
        if row is None or not who.may_see(row.tenant):
            raise NotFound(f"No workload {workload_id!r}; list yours with `gpupool ls`.")
        pod = session.scalars(
            select(PodRow).where(PodRow.workload_id == workload_id, PodRow.rank == rank)
            .order_by(PodRow.attempt.desc())
        ).first()
        final = WorkloadStatus(row.status).is_final
        if pod is None and rank >= max(1, int(row.spec.get("replicas", 1))):
            raise NotFound(f"Workload {workload_id} has no replica {rank}.")
        pod_id = pod.id if pod is not None else ""
        combined = not row.spec.get("separate_stderr", False)
    if stream == "stderr" and combined:
        raise InvalidInput(f"Workload {workload_id}'s stderr is in its output with stdout, in the order "
                           "written; read that (no --stderr), or submit with --separate-stderr to keep "
                           "it apart.")
    if not pod_id:
        return LogsOut(workload_id=workload_id, pod_id="", offset=offset, text="", complete=final,
                       combined=combined)
    text, next_offset, finished = read_provider_log(rt.provider, pod_id, stream, offset)
    complete = final and finished
    return LogsOut(workload_id=workload_id, pod_id=pod_id, offset=next_offset, text=text,
                   complete=complete, combined=combined)


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
