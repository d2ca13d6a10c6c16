"""The only way ORM rows leave the services: row -> API schema converters."""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.api.reasons import describe
from gpupool.api.workloads import (
    STORED,
    EventOut,
    PodOut,
    ResourcesSpec,
    SliceOut,
    SpecSummary,
    WorkloadOut,
    WorkloadSpec,
    WorkloadSummary,
)
from gpupool.core.units import MILLI
from gpupool.server.orm import EventRow, PodRow, WorkloadRow


def pod_row_to_out(row: PodRow, simulated_nodes: frozenset[str]) -> PodOut:
    return PodOut(
        id=row.id,
        name=row.name,
        rank=row.rank,
        status=row.status,
        node=row.node,
        slices=[SliceOut(**s) for s in row.slices],
        cpu_milli=row.cpu_milli or 0,
        memory_mib=row.memory_mib or 0,
        simulated=row.node in simulated_nodes,
        exit_code=row.exit_code,
        message=row.message,
    )


def workload_row_to_out(
    row: WorkloadRow, pods: Iterable[PodRow], simulated_nodes: frozenset[str], *, default_max_retries: int
) -> WorkloadOut:
    """`default_max_retries`: the pool's failure.max_retries, for a spec that names none. The reason's
    sentence and hint come from the catalogue here, when answering, not when the loop writes."""
    summary = workload_row_to_summary(row, pods, simulated_nodes, default_max_retries=default_max_retries)
    return WorkloadOut(**dict(summary), spec=WorkloadSpec.model_validate(row.spec, context=STORED))


def workload_row_to_summary(
    row: WorkloadRow, pods: Iterable[PodRow], simulated_nodes: frozenset[str], *, default_max_retries: int
) -> WorkloadSummary:
    """The workload as a list page shows it: without its full spec (command, environment)."""
    pod_outs = [pod_row_to_out(p, simulated_nodes) for p in pods if p.attempt == row.attempt]
    pod_outs.sort(key=lambda p: p.rank)
    reason = describe(row.reason)
    max_retries = row.spec.get("max_retries")
    spec = row.spec
    return WorkloadSummary(
        id=row.id,
        name=row.name,
        tenant=row.tenant,
        queue=row.queue,
        status=row.status,
        priority=row.priority,
        attempt=row.attempt,
        reason=row.reason,
        reason_text=reason.text,
        reason_hint=reason.hint,
        reason_final=reason.final,
        message=row.message,
        exit_code=row.exit_code,
        retries=row.retries or 0,
        max_retries=default_max_retries if max_retries is None else int(max_retries),
        time_limit_s=row.time_limit_s,
        reserved_start_s=row.reserved_start_s,
        not_before_s=row.not_before_s,
        progress_s=row.progress_s or 0.0,
        lost_device_s=row.lost_device_s or 0.0,
        run_s=row.run_s or 0.0,
        submit_s=row.submit_s,
        admitted_s=row.admitted_s,
        started_s=row.started_s,
        finished_s=row.finished_s,
        simulated=any(p.simulated for p in pod_outs),
        array_id=row.array_id,
        array_index=row.array_index,
        array_limit=row.array_limit,
        request=SpecSummary(replicas=int(spec.get("replicas", 1)),
                            resources=ResourcesSpec.model_validate(spec.get("resources") or {}),
                            priority_class=spec.get("priority_class"), time_limit_s=spec.get("time_limit_s"),
                            topology=spec.get("topology")),
        held=row.held or "",
        waiting_on=row.waiting_on or "",
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
        reason_text=describe(row.reason).text,
        message=row.message,
        at_s=row.at_s,
    )


def milli_to_gpus(milli: int | None) -> float | None:
    return None if milli is None else milli / MILLI
