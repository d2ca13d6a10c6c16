"""Read the Microsoft Philly trace (as cut for the Sia paper) into timed jobs.

Columns: ``timestamp,duration,num_gpus,gpu_time,cluster``: submit time (``YYYY-MM-DD HH:MM:SS``,
taken as UTC), run time in seconds, whole GPUs (1-128), GPU-seconds, and the virtual cluster,
which gpupool treats as the tenant. A malformed row raises `TraceError` naming ``file:line``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpupool.errors import InvalidInput, TraceError
from gpupool.textfiles import text_stream

COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")


@dataclass(frozen=True, slots=True)
class PhillyJob:
    """One job of the trace: when it arrived (epoch seconds), how long it ran, on how many GPUs."""

    line: int
    submit_s: float
    duration_s: float
    num_gpus: int
    tenant: str


def parse_time_s(text: str) -> float:
    """'2017-10-01 07:00:00' or '2017-10-01' (UTC) -> epoch seconds; ValueError when malformed."""
    return datetime.fromisoformat(text.strip()).replace(tzinfo=UTC).timestamp()


def load_philly(path: str | Path) -> list[PhillyJob]:
    """Every job of a Philly CSV file in file order (the file is not sorted by time)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"Trace file {path} does not exist; give the path of a Philly CSV file.")
    jobs: list[PhillyJob] = []
    with text_stream(path, "the Philly trace") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise TraceError(f"{path}:1: the header lacks column(s) {', '.join(missing)}.")
        at = {c: header.index(c) for c in COLUMNS}
        for values in reader:
            if not values or all(not v.strip() for v in values):
                continue
            jobs.append(_job(path, reader.line_num, values, at, len(header)))
    if not jobs:
        raise TraceError(f"{path}:1: the file has a header but no jobs.")
    return jobs


def _job(path: Path, line: int, values: list[str], at: dict[str, int], width: int) -> PhillyJob:
    where = f"{path}:{line}"
    if len(values) != width:
        raise TraceError(f"{where}: expected {width} fields as in the header, found {len(values)}.")
    stamp = values[at["timestamp"]]
    try:
        submit = parse_time_s(stamp)
    except ValueError:
        raise TraceError(f"{where}: timestamp must look like 2017-10-09 07:01:55, got {stamp!r}.") from None
    text = values[at["duration"]]
    try:
        duration = float(text)
    except ValueError:
        raise TraceError(f"{where}: duration must be a number of seconds, got {text!r}.") from None
    if not duration >= 0 or duration == float("inf"):
        raise TraceError(f"{where}: duration must be a finite number >= 0, got {text!r}.")
    text = values[at["num_gpus"]]
    try:
        gpus = int(float(text))
    except ValueError:
        raise TraceError(f"{where}: num_gpus must be a whole number, got {text!r}.") from None
    if gpus < 1 or gpus != float(text):
        raise TraceError(f"{where}: num_gpus must be a whole number >= 1, got {text!r}.")
    tenant = values[at["cluster"]].strip()
    if not tenant:
        raise TraceError(f"{where}: column cluster (the tenant) is empty.")
    return PhillyJob(line=line, submit_s=submit, duration_s=duration, num_gpus=gpus, tenant=tenant)
