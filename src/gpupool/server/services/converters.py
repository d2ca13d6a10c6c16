"""The only way ORM rows leave the services: row -> API schema converters."""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.core.units import MILLI
from gpupool.server.orm import EventRow, PodRow, WorkloadRow
from gpupool.server.schemas.workloads import EventOut, PodOut, SliceOut, WorkloadOut, WorkloadSpec


def pod_row_to_out(row: PodRow, simulated_nodes: frozenset[str]) -> PodOut:
    return PodOut(
        id=row.id,
        name=row.name,
        rank=row.rank,
        status=row.status,
        node=row.node,
        slices=[SliceOut(**s) for s in row.slices],
        simulated=row.node in simulated_nodes,
        exit_code=row.exit_code,
        message=row.message,
    )


def workload_row_to_out(
    row: WorkloadRow, pods: Iterable[PodRow], simulated_nodes: frozenset[str]
) -> WorkloadOut:
    pod_outs = [pod_row_to_out(p, simulated_nodes) for p in pods if p.attempt == row.attempt]
    pod_outs.sort(key=lambda p: p.rank)
    return WorkloadOut(
        id=row.id,
        name=row.name,
        tenant=row.tenant,
        queue=row.queue,
        status=row.status,
        priority=row.priority,
        attempt=row.attempt,
        reason=row.reason,
        message=row.message,
        exit_code=row.exit_code,
        submit_s=row.submit_s,
        admitted_s=row.admitted_s,
        started_s=row.started_s,
        finished_s=row.finished_s,
        simulated=any(p.simulated for p in pod_outs),
        array_id=row.array_id,
        array_index=row.array_index,
        array_limit=row.array_limit,
        spec=WorkloadSpec.model_validate(row.spec),
        pods=pod_outs,
    )


def event_row_to_out(row: EventRow) -> EventOut:
    return EventOut(
        id=row.id,
        workload_id=row.workload_id,
        pod_id=row.pod_id,
        from_status=row.from_status,
        to_status=row.to_status,
        reason=row.reason,
        message=row.message,
        at_s=row.at_s,
    )


def milli_to_gpus(milli: int | None) -> float | None:
    return None if milli is None else milli / MILLI
