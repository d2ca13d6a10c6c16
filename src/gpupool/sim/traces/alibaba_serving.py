"""Read the Alibaba 2025 disaggregated inference trace (NSDI'25) into service replica lifetimes.

One row is one GPU instance of an app: ``instance_sn,role,app_name,...,gpu_request,...,
creation_time,scheduled_time,deletion_time`` (times in seconds from the trace's start). Each app is
a service; its replica demand at time t is the number of its GPU instances alive at t.

Missing times: an empty ``creation_time`` means the instance existed before the trace began (it is
live from the start, time 0); an empty ``deletion_time`` means it was still live when the trace
ended (it stays live to the end of the replay). Rows with ``gpu_request`` 0 (the CPU-only half of a
disaggregated service) are not replicas of a GPU pool and are skipped. A malformed row raises
`TraceError` naming ``file:line``; a header without the needed columns names the missing ones.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from gpupool.errors import InvalidInput, TraceError

COLUMNS = ("instance_sn", "role", "app_name", "gpu_request", "creation_time", "deletion_time")


@dataclass(frozen=True, slots=True)
class ServiceInstance:
    """One replica of an app: live from `start_s` to `end_s` (inf: still live when the trace ends)."""

    line: int
    name: str
    app: str
    role: str
    gpus: float
    """The trace's gpu_request: a whole device is 1.0; less asks for a share of one device."""
    start_s: float
    end_s: float
    created_in_trace: bool
    """False when creation_time was empty (live before the trace began): not a rise in demand."""


def load_instances(path: str | Path) -> list[ServiceInstance]:
    """Every GPU instance of the file, sorted by (start, line)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"Service trace file {path} does not exist; give the path of "
                           "disaggregated_DLRM_trace.csv (Alibaba cluster-trace-gpu-v2025).")
    out: list[ServiceInstance] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise TraceError(f"{path}:1: the header lacks column(s) {', '.join(missing)}; an Alibaba "
                             "2025 inference trace has " + ", ".join(COLUMNS) + ".")
        at = {c: header.index(c) for c in COLUMNS}
        for values in reader:
            if not values or all(not v.strip() for v in values):
                continue
            instance = _instance(f"{path}:{reader.line_num}", reader.line_num, values, at, len(header))
            if instance is not None:
                out.append(instance)
    if not out:
        raise TraceError(f"{path}:1: the file has no GPU instances (every gpu_request is 0 or no rows).")
    out.sort(key=lambda i: (i.start_s, i.line))
    return out


def _time(where: str, name: str, text: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: {name} must be seconds from the trace's start or empty, "
                         f"got {text!r}.") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}: {name} must be a finite number of seconds >= 0, got {text!r}.")
    return value


def _instance(where: str, line: int, values: list[str], at: dict[str, int],
              width: int) -> ServiceInstance | None:
    if len(values) != width:
        raise TraceError(f"{where}: expected {width} fields as in the header, found {len(values)}.")
    text = values[at["gpu_request"]].strip()
    try:
        gpus = float(text)
    except ValueError:
        raise TraceError(f"{where}: gpu_request must be a number of GPUs, got {text!r}.") from None
    if not math.isfinite(gpus) or gpus < 0:
        raise TraceError(f"{where}: gpu_request must be a finite number >= 0, got {text!r}.")
    if gpus == 0:
        return None
    if gpus > 1 and gpus != int(gpus):
        raise TraceError(f"{where}: gpu_request above 1 must be whole GPUs, got {text!r}.")
    created = _time(where, "creation_time", values[at["creation_time"]])
    deleted = _time(where, "deletion_time", values[at["deletion_time"]])
    start = created if created is not None else 0.0
    end = deleted if deleted is not None else math.inf
    if end < start:
        raise TraceError(f"{where}: deletion_time {deleted:g} is before creation_time {start:g}.")
    app = values[at["app_name"]].strip()
    if not app:
        raise TraceError(f"{where}: app_name is empty; every instance belongs to an app.")
    return ServiceInstance(line=line, name=values[at["instance_sn"]].strip() or f"line{line}", app=app,
                           role=values[at["role"]].strip(), gpus=gpus, start_s=start, end_s=end,
                           created_in_trace=created is not None)
