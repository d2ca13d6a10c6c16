"""Turn trace rows (Philly, OpenB) into timed workloads for the replay protocol."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gpupool.core.model import PodRequest, Workload
from gpupool.core.units import MILLI
from gpupool.errors import InvalidInput, TraceError
from gpupool.sim.traces.philly import load_philly, parse_time_s

PHILLY_PRIORITY_MIX = (("high", 0.1), ("normal", 0.7), ("best-effort", 0.2))
"""Philly carries no priorities: jobs draw a class with these weights (seeded), the same in every run."""

PHILLY_CHECKPOINT_S = 1800.0
"""Philly carries no checkpoint policy: every job is assumed to checkpoint every 30 minutes."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """A workload, when it arrives and how long it runs at full speed (seconds)."""

    workload: Workload
    submit_s: float
    duration_s: float


def parse_window(text: str) -> tuple[float, float]:
    """'2017-10-01:2017-10-15' (ISO dates, UTC) or '0:86400' (trace seconds) -> (start_s, end_s)."""
    parts = text.split(":") if text.count(":") == 1 else []
    if len(parts) != 2:
        raise InvalidInput(
            f"Cannot read window {text!r}; write START:END as ISO dates (2017-10-01:2017-10-15) "
            "or as trace seconds (0:86400)."
        )
    try:
        bounds = [float(p) for p in parts]
    except ValueError:
        try:
            bounds = [parse_time_s(p) for p in parts]
        except ValueError:
            raise InvalidInput(
                f"Cannot read window {text!r}; dates must look like 2017-10-01 (or give seconds)."
            ) from None
    if bounds[1] <= bounds[0]:
        raise InvalidInput(f"Window {text!r} ends before it starts; give START:END with START < END.")
    return bounds[0], bounds[1]


def in_window(jobs: Sequence[TraceJob], window: tuple[float, float] | None) -> list[TraceJob]:
    if window is None:
        return list(jobs)
    return [j for j in jobs if window[0] <= j.submit_s < window[1]]


CRITICAL_CLASS = "critical"


def philly_jobs(
    path: str | Path, devices_per_node: int, seed: int, model: str | None = None, critical_share: float = 0.0
) -> list[TraceJob]:
    """Philly jobs as gangs of whole-device pods (at most `devices_per_node` each), in submit order.

    `critical_share`: each job is of class `critical` with this probability, drawn from an rng of its
    own (seeded from `seed`), so every other job keeps the class it draws without it.
    """
    if devices_per_node < 1:
        raise InvalidInput("The cluster has no devices; a Philly replay needs GPU nodes.")
    check_critical_share(critical_share)
    rng = random.Random(seed)
    critical = random.Random(f"critical:{seed}")
    names = [n for n, _ in PHILLY_PRIORITY_MIX]
    weights = [w for _, w in PHILLY_PRIORITY_MIX]
    allowed = frozenset({model}) if model else frozenset()
    out: list[TraceJob] = []
    for job in sorted(load_philly(path), key=lambda j: (j.submit_s, j.line)):
        sizes = [devices_per_node] * (job.num_gpus // devices_per_node)
        if job.num_gpus % devices_per_node:
            sizes.append(job.num_gpus % devices_per_node)
        pods = tuple(
            PodRequest(name=f"p{i}", num_devices=n, device_milli=MILLI, allowed_models=allowed)
            for i, n in enumerate(sizes)
        )
        klass = rng.choices(names, weights)[0]
        if critical_share and critical.random() < critical_share:
            klass = CRITICAL_CLASS
        workload = Workload(
            id=f"philly-{job.line}",
            pods=pods,
            tenant=job.tenant,
            queue="default",
            priority_class=klass,
            submit_time_s=job.submit_s,
            name=f"{job.num_gpus}gpu",
            checkpoint_interval_s=PHILLY_CHECKPOINT_S,
        )
        out.append(TraceJob(workload, job.submit_s, job.duration_s))
    return out


def check_critical_share(share: float) -> None:
    if not 0.0 <= share <= 1.0:
        raise InvalidInput(f"--critical-share must be a fraction from 0 to 1 (0.05 marks 5 % of jobs "
                           f"critical), not {share:g}.")


def openb_jobs(path: str | Path) -> list[TraceJob]:
    """OpenB pods as one-pod workloads arriving at creation_time and running until deletion_time."""
    from gpupool.sim.traces.openb import load_openb_pod_rows

    out: list[TraceJob] = []
    for row in load_openb_pod_rows(path):
        if row.creation_time_s is None or row.deletion_time_s is None:
            raise TraceError(
                f"{path}: pod {row.pod.name!r} has no creation_time/deletion_time; replay needs a pod "
                "file with both (the multigpu* variants have none)."
            )
        pod = row.pod
        workload = Workload(
            id=pod.name,
            pods=(pod,),
            tenant="openb",
            priority_class="best-effort" if row.qos == "BE" else "normal",
            submit_time_s=float(row.creation_time_s),
            name=pod.name,
        )
        duration = max(0.0, float(row.deletion_time_s - row.creation_time_s))
        out.append(TraceJob(workload, float(row.creation_time_s), duration))
    out.sort(key=lambda j: (j.submit_s, j.workload.id))
    return out


def exclusive_jobs(jobs: Sequence[TraceJob]) -> list[TraceJob]:
    """Every fractional pod rounded up to a whole device: the "one job owns a card" world."""
    out = []
    for job in jobs:
        pods = tuple(replace(p, device_milli=MILLI) if p.is_fractional else p for p in job.workload.pods)
        out.append(replace(job, workload=replace(job.workload, pods=pods)))
    return out


TRACE_FORMATS = ("openb", "philly")


def load_trace(spec: str, devices_per_node: int, seed: int, critical_share: float = 0.0) -> list[TraceJob]:
    """Jobs from 'FORMAT:FILE' (openb or philly), sorted by submit time; `critical_share` (Philly only):
    see `philly_jobs`."""
    fmt, sep, path = spec.partition(":")
    if not sep or not path:
        raise InvalidInput(f"Cannot read trace {spec!r}; write FORMAT:FILE, e.g. philly:philly-sia.csv.")
    fmt = fmt.strip().lower()
    if fmt == "philly":
        return philly_jobs(path, devices_per_node, seed, critical_share=critical_share)
    if critical_share:
        raise InvalidInput("--critical-share applies to Philly traces (OpenB's pods carry their own "
                           "classes).")
    if fmt == "openb":
        return openb_jobs(path)
    raise InvalidInput(f"Unknown trace format {fmt!r}; choose one of {', '.join(TRACE_FORMATS)}.")
