"""Read the OpenB (Alibaba GPU cluster trace 2023) node and pod CSV files into core model objects.

Node files: ``sn,cpu_milli,memory_mib,gpu,model``. Pod files:
``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,
scheduled_time``; the ``multigpu*`` variants carry only the first five columns. A malformed row
raises `TraceError` naming ``file:line`` and what is wrong with it.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.model import MAX_SIMULATED_NODE_DEVICES, UNKNOWN_MEMORY_MIB, Device, Node, PodRequest
from gpupool.core.units import MILLI
from gpupool.errors import InvalidInput, TraceError
from gpupool.textfiles import text_stream

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL_COLUMNS = ("gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")


@dataclass(frozen=True, slots=True)
class OpenbPod:
    """One row of an OpenB pod file: the request plus the trace's bookkeeping (times in seconds)."""

    pod: PodRequest
    qos: str = ""
    phase: str = ""
    creation_time_s: int | None = None
    deletion_time_s: int | None = None
    scheduled_time_s: int | None = None


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) pairs of a CSV file whose header holds every required column."""
    if not path.is_file():
        raise InvalidInput(f"Trace file {path} does not exist; give the path of an OpenB CSV file.")
    with text_stream(path, "the OpenB trace") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise TraceError(f"{path}:1: the file is empty; expected a header with {', '.join(required)}.")
        header = [h.strip() for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(f"{path}:1: the header lacks column(s) {', '.join(missing)}.")
        for values in reader:
            line = reader.line_num
            if not values or all(not v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise TraceError(
                    f"{path}:{line}: expected {len(header)} fields as in the header, found {len(values)}."
                )
            yield line, dict(zip(header, (v.strip() for v in values), strict=True))


def _int(path: Path, line: int, row: dict[str, str], column: str, optional: bool = False) -> int | None:
    text = row.get(column, "")
    if text == "" and optional:
        return None
    try:
        value = int(text)
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column} must be a whole number, got {text!r}.") from None
    if value < 0:
        raise TraceError(f"{path}:{line}: column {column} must not be negative, got {value}.")
    return value


def _req(path: Path, line: int, row: dict[str, str], column: str) -> int:
    value = _int(path, line, row, column)
    assert value is not None
    return value


def load_openb_nodes(path: str | Path) -> list[Node]:
    """The nodes of an OpenB node file, in file order; devices of unknown memory size."""
    path = Path(path)
    nodes: list[Node] = []
    seen: set[str] = set()
    for line, row in _rows(path, NODE_COLUMNS):
        name = row["sn"]
        if not name:
            raise TraceError(f"{path}:{line}: column sn (the node name) is empty.")
        if name in seen:
            raise TraceError(f"{path}:{line}: node {name!r} appears twice.")
        seen.add(name)
        count = _req(path, line, row, "gpu")
        if count > MAX_SIMULATED_NODE_DEVICES:
            raise TraceError(f"{path}:{line}: column gpu is {count}, but a simulated node holds at most "
                             f"{MAX_SIMULATED_NODE_DEVICES} devices (more than any real server).")
        model = row["model"]
        if count and not model:
            raise TraceError(f"{path}:{line}: node {name!r} has {count} GPUs but no model.")
        devices = tuple(
            Device(uuid=f"{name}-gpu{i}", model=model, index=i, memory_mib=UNKNOWN_MEMORY_MIB, simulated=True)
            for i in range(count)
        )
        nodes.append(
            Node(
                name=name,
                cpu_milli=_req(path, line, row, "cpu_milli"),
                memory_mib=_req(path, line, row, "memory_mib"),
                devices=devices,
            )
        )
    if not nodes:
        raise TraceError(f"{path}:1: the file has a header but no nodes.")
    return nodes


def _pod(path: Path, line: int, row: dict[str, str]) -> PodRequest:
    num = _req(path, line, row, "num_gpu")
    milli = _req(path, line, row, "gpu_milli")
    if num == 0 and milli:
        raise TraceError(f"{path}:{line}: gpu_milli is {milli} but num_gpu is 0.")
    if num == 1 and not 1 <= milli <= MILLI:
        raise TraceError(f"{path}:{line}: gpu_milli must be 1..1000 for one GPU, got {milli}.")
    if num > 1 and milli != MILLI:
        raise TraceError(
            f"{path}:{line}: a pod with {num} GPUs must take whole GPUs (gpu_milli 1000), got {milli}."
        )
    spec = row.get("gpu_spec", "")
    models = frozenset(m.strip() for m in spec.split("|") if m.strip()) if spec else frozenset()
    name = row["name"]
    if not name:
        raise TraceError(f"{path}:{line}: column name (the pod name) is empty.")
    return PodRequest(
        name=name,
        cpu_milli=_req(path, line, row, "cpu_milli"),
        memory_mib=_req(path, line, row, "memory_mib"),
        num_devices=num,
        device_milli=milli if num else 0,
        allowed_models=models,
    )


def load_openb_pod_rows(path: str | Path) -> list[OpenbPod]:
    """Every row of an OpenB pod file with its trace fields (times are None when absent)."""
    path = Path(path)
    out: list[OpenbPod] = []
    for line, row in _rows(path, POD_COLUMNS):
        out.append(
            OpenbPod(
                pod=_pod(path, line, row),
                qos=row.get("qos", ""),
                phase=row.get("pod_phase", ""),
                creation_time_s=_int(path, line, row, "creation_time", optional=True),
                deletion_time_s=_int(path, line, row, "deletion_time", optional=True),
                scheduled_time_s=_int(path, line, row, "scheduled_time", optional=True),
            )
        )
    if not out:
        raise TraceError(f"{path}:1: the file has a header but no pods.")
    return out


def load_openb_pods(path: str | Path) -> list[PodRequest]:
    """The pod requests of an OpenB pod file, in file order."""
    return [row.pod for row in load_openb_pod_rows(path)]
