"""Build simulated nodes from a compact spec ("2x8xH100,4x8xV100M32") or an OpenB node CSV."""

from __future__ import annotations

import csv
import re
import uuid
from pathlib import Path

from gpupool.core.model import MAX_SIMULATED_NODE_DEVICES, Device, DeviceKind, Node
from gpupool.errors import InvalidInput, TraceError
from gpupool.profiles import DeviceProfile, ProfileSet, default_profiles
from gpupool.textfiles import text_stream

SPEC_SYNTAX = (
    "write NODESxDEVICESxMODEL[,...], for example '2x8xH100,4x8xV100M32', "
    "or give the path of an OpenB node CSV (columns sn,cpu_milli,memory_mib,gpu,model)"
)
SIMULATED_LABEL = "gpupool.io/simulated"
CONTAINERS_LABEL = "gpupool.io/containers"
"""A node label: the runtime that runs `--image` pods there ("crun 1.8.1"); absent: none can."""
_GROUP = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*$")
_UUID_NAMESPACE = uuid.UUID("6f1c2d4e-2b7a-4e0c-9a51-7d3e8b9f0a11")

CPU_CORES_PER_DEVICE = 12
MIN_CPU_CORES = 8
MIN_NODE_MEMORY_MIB = 64 * 1024
UNKNOWN_DEVICE_MEMORY_GUESS_MIB = 16 * 1024
MAX_SIMULATED_NODES = 50_000
"""The most nodes a node spec builds: far above the simulator's benchmarks (1,000 nodes), and
what stops a typo from building nodes until memory runs out."""
MAX_SIMULATED_DEVICES = 400_000
"""The most devices a node spec builds in all (MAX_SIMULATED_NODES nodes of 8)."""


def simulated_uuid(node: str, index: int) -> str:
    """A stable UUID for device `index` of `node`, shaped like NVML's ('GPU-...')."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}"


def simulated_devices(node: str, profile: DeviceProfile, count: int) -> tuple[Device, ...]:
    """`count` simulated devices of one profile, with deterministic UUIDs."""
    return tuple(
        Device(
            uuid=simulated_uuid(node, i),
            model=profile.model,
            index=i,
            memory_mib=profile.memory_mib,
            kind=DeviceKind(profile.kind.value),
            simulated=True,
        )
        for i in range(count)
    )


def host_shape(profile: DeviceProfile, devices: int) -> tuple[int, int]:
    """A plausible (cpu_milli, memory_mib) for a node holding `devices` of `profile`."""
    cpu_milli = max(MIN_CPU_CORES, CPU_CORES_PER_DEVICE * devices) * 1000
    per_device = profile.memory_mib or UNKNOWN_DEVICE_MEMORY_GUESS_MIB
    return cpu_milli, max(MIN_NODE_MEMORY_MIB, 2 * per_device * devices)


def _looks_like_path(spec: str) -> bool:
    return spec.endswith((".csv", ".CSV")) or "/" in spec or "\\" in spec or Path(spec).is_file()


def spec_groups(spec: str) -> list[tuple[int, int, str]]:
    """(nodes, devices a node, model) of each group of "NODESxDEVICESxMODEL[,...]", read and bounded
    before anything is built: InvalidInput for bad syntax, a group of no nodes, or a pool past
    MAX_SIMULATED_NODES nodes, MAX_SIMULATED_DEVICES devices or MAX_SIMULATED_NODE_DEVICES devices a
    node. Models are not looked up here."""
    groups: list[tuple[int, int, str]] = []
    for group in spec.split(","):
        match = _GROUP.match(group)
        if match is None:
            raise InvalidInput(f"Cannot read node spec {group.strip()!r}; {SPEC_SYNTAX}.", spec=spec)
        count, devices = int(match.group(1)), int(match.group(2))
        if count < 1:
            raise InvalidInput(f"Node spec {group.strip()!r} asks for no nodes; {SPEC_SYNTAX}.")
        if devices > MAX_SIMULATED_NODE_DEVICES:
            raise InvalidInput(
                f"Node spec {group.strip()!r} gives each node {devices} devices, but a simulated node holds "
                f"at most {MAX_SIMULATED_NODE_DEVICES} (more than any real server); give "
                f"{MAX_SIMULATED_NODE_DEVICES} or fewer.")
        groups.append((count, devices, match.group(3)))
    nodes = sum(count for count, _, _ in groups)
    if nodes > MAX_SIMULATED_NODES:
        raise InvalidInput(
            f"The node spec asks for {nodes:,} nodes, but a simulated pool holds at most "
            f"{MAX_SIMULATED_NODES:,} (each node costs memory and time in every scheduling cycle); give "
            "fewer.")
    devices = sum(count * per_node for count, per_node, _ in groups)
    if devices > MAX_SIMULATED_DEVICES:
        raise InvalidInput(
            f"The node spec asks for {devices:,} devices, but a simulated pool holds at most "
            f"{MAX_SIMULATED_DEVICES:,} (each costs memory and time in every scheduling cycle); give fewer "
            "nodes or fewer devices a node.")
    return groups


def check_spec(spec: str) -> None:
    """Refuse a node spec that cannot be read or is too large (spec_groups), before anything starts;
    a node file's path is read later, by nodes_from_spec."""
    text = spec.strip()
    if text and not _looks_like_path(text):
        spec_groups(text)


def nodes_from_spec(spec: str, profiles: ProfileSet | None = None) -> list[Node]:
    """Simulated nodes from "NODESxDEVICESxMODEL[,...]" or from an OpenB node CSV path.

    Models are looked up by name or alias, case-insensitive; every device is marked simulated and
    its memory comes from the profile. Raises InvalidInput (bad syntax, or a pool too large:
    spec_groups), UnknownName (unknown model) or TraceError (a malformed CSV row, with file:line).
    """
    profiles = profiles or default_profiles()
    text = spec.strip()
    if not text:
        raise InvalidInput(f"The node spec is empty; {SPEC_SYNTAX}.")
    if _looks_like_path(text):
        return nodes_from_openb_csv(Path(text), profiles)
    nodes: list[Node] = []
    per_model: dict[str, int] = {}
    for count, devices, model in spec_groups(text):
        profile = profiles.get_profile(model)
        cpu_milli, memory_mib = host_shape(profile, devices)
        for _ in range(count):
            seq = per_model.get(profile.model, 0)
            per_model[profile.model] = seq + 1
            name = f"{profile.model.lower()}-{seq:03d}"
            nodes.append(
                Node(
                    name=name,
                    cpu_milli=cpu_milli,
                    memory_mib=memory_mib,
                    devices=simulated_devices(name, profile, devices),
                    labels={SIMULATED_LABEL: "true"},
                )
            )
    return nodes


def _int_field(row: dict[str, str | None], column: str, where: str) -> int:
    raw = (row.get(column) or "").strip()
    try:
        value = int(raw)
    except ValueError:
        raise TraceError(f"{where}: column {column!r} must be a whole number, got {raw!r}.") from None
    if value < 0:
        raise TraceError(f"{where}: column {column!r} must not be negative, got {value}.")
    return value


def nodes_from_openb_csv(path: Path, profiles: ProfileSet | None = None) -> list[Node]:
    """Simulated nodes from an OpenB node list (sn,cpu_milli,memory_mib,gpu,model), in file order."""
    profiles = profiles or default_profiles()
    try:
        handle = text_stream(path, "the node file")
    except OSError as exc:
        raise InvalidInput(f"Cannot open node file {str(path)!r} ({exc.strerror}); {SPEC_SYNTAX}.") from None
    nodes: list[Node] = []
    with handle:
        reader = csv.DictReader(handle)
        missing = {"sn", "cpu_milli", "memory_mib", "gpu", "model"} - set(reader.fieldnames or ())
        if missing:
            raise TraceError(f"{path}:1: the header lacks column(s) {sorted(missing)}; {SPEC_SYNTAX}.")
        for row in reader:
            where = f"{path}:{reader.line_num}"
            name = (row.get("sn") or "").strip()
            if not name:
                raise TraceError(f"{where}: column 'sn' (the node name) is empty.")
            gpus = _int_field(row, "gpu", where)
            if gpus > MAX_SIMULATED_NODE_DEVICES:
                raise TraceError(f"{where}: column 'gpu' is {gpus}, but a simulated node holds at most "
                                 f"{MAX_SIMULATED_NODE_DEVICES} devices (more than any real server).")
            devices: tuple[Device, ...] = ()
            if gpus:
                model = (row.get("model") or "").strip()
                profile = profiles.find(model)
                if profile is None:
                    raise TraceError(
                        f"{where}: unknown device model {model!r}; add a profile file for it "
                        "(see `gpupool profiles`)."
                    )
                devices = simulated_devices(name, profile, gpus)
            nodes.append(
                Node(
                    name=name,
                    cpu_milli=_int_field(row, "cpu_milli", where),
                    memory_mib=_int_field(row, "memory_mib", where),
                    devices=devices,
                    labels={SIMULATED_LABEL: "true"},
                )
            )
    if not nodes:
        raise TraceError(f"{path}: the node file has no rows.")
    return nodes
