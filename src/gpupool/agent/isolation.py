"""Turn a placed pod into the environment and limits that enforce its slice, layer by layer.

Layers (docs/isolation.md says what each enforces and what it cannot):
  1. device selection - the vendor's visible-devices variable, by UUID or index per the profile;
  2. CUDA MPS         - thread percentage and pinned memory limit per client, via the MPS daemon;
  3. framework caps   - torch memory fraction (injected sitecustomize), XLA and CuPy variables;
  4. host limits      - cgroup v2 cpu.max/memory.max/pids.max where a delegated tree is writable, else
                         RLIMIT_DATA; a memory bound for every pod (its request, else a default
                         share), and a per-account process limit (RLIMIT_NPROC, see process_limit);
  5. gang environment - MASTER_ADDR/PORT, NNODES, NODE_RANK, NPROC_PER_NODE (each pod is one torch
                         "node"), torch's per-process WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE
                         where one process per pod makes them true, and NCCL's IB variables
                         (NCCL_IB_HCA, NCCL_IB_SL, NCCL_IB_PKEY), as the server planned them;
  6. network          - a network namespace per pod with nftables rules (netns.py; the agent adds
                         this layer at launch).
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from gpupool.agent.runner import HostLimits
from gpupool.core.model import Device, Node, Slice
from gpupool.core.units import MILLI
from gpupool.errors import InvalidInput
from gpupool.pods import PodLaunch, nproc_per_node
from gpupool.profiles import DeviceProfile, ProfileSet, VisibleBy, default_profiles

SITECUSTOMIZE_DIR = Path(__file__).with_name("sitecustomize")
CGROUP_ROOT_ENV = "GPUPOOL_CGROUP_ROOT"
POD_PROCESSES_ENV = "GPUPOOL_POD_PROCESSES"
PROCESS_SHARE_DIVISOR = 4
"""An account may hold at most 1/PROCESS_SHARE_DIVISOR of the node's process and thread slots."""
MIN_POD_PROCESSES = 256
TORCH_FRACTION_ENV = "GPUPOOL_TORCH_MEMORY_FRACTION"
CPU_PERIOD_US = 100_000

VISIBLE_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                       "ASCEND_RT_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
CONTROLLED_PREFIXES = ("CUDA_MPS_", "GPUPOOL_")
CONTROLLED_VARS = frozenset({
    *VISIBLE_DEVICE_VARS, "XLA_PYTHON_CLIENT_MEM_FRACTION", "CUPY_GPU_MEMORY_LIMIT", "MASTER_ADDR",
    "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NCCL_IB_HCA", "NCCL_IB_SL",
    "NCCL_IB_PKEY", "NNODES", "NODE_RANK", "NPROC_PER_NODE",
})


class Layer(StrEnum):
    DEVICE_SELECTION = "device_selection"
    MPS = "mps"
    FRAMEWORK_CAPS = "framework_caps"
    HOST_LIMITS = "host_limits"
    GANG = "gang"
    NETWORK = "network"


@dataclass(frozen=True, slots=True)
class LayerState:
    """Whether a layer is in force for this pod, and why (or why not)."""

    layer: Layer
    active: bool
    detail: str


@dataclass(frozen=True, slots=True)
class IsolationPlan:
    """The variables and host limits that enforce one pod's slice."""

    env: Mapping[str, str]
    host_limits: HostLimits
    cgroup_files: Mapping[str, str] = field(default_factory=dict)
    layers: tuple[LayerState, ...] = ()

    def process_env(self, base: Mapping[str, str], user: Mapping[str, str]) -> dict[str, str]:
        """The pod's full environment: `base` without anything isolation controls, then the
        user's variables, then the isolation variables (which the user cannot override)."""
        env = {k: v for k, v in base.items()
               if k not in CONTROLLED_VARS and not k.startswith(CONTROLLED_PREFIXES)}
        env.update(user)
        env.update(self.env)
        return env


def _devices_of(pod: PodLaunch, node: Node) -> list[tuple[Slice, Device]]:
    by_index = {d.index: d for d in node.devices}
    pairs = []
    for piece in pod.slices:
        device = by_index.get(piece.device_index)
        if device is None:
            raise InvalidInput(
                f"Pod {pod.pod_id!r} names device index {piece.device_index}, which node {node.name!r} "
                f"does not have (it has {sorted(by_index)})."
            )
        pairs.append((piece, device))
    return pairs


def _profile(profiles: ProfileSet, device: Device) -> DeviceProfile | None:
    return profiles.find(device.model)


def device_selection_env(pairs: list[tuple[Slice, Device]], node: Node,
                         profiles: ProfileSet) -> tuple[dict[str, str], LayerState]:
    """Layer 1: the vendor's visible-devices variable naming exactly the pod's devices."""
    if not pairs:
        hidden = {"CUDA_VISIBLE_DEVICES": ""}
        for device in node.devices:
            profile = _profile(profiles, device)
            if profile is not None:
                hidden[profile.visible_devices_env] = ""
        return hidden, LayerState(Layer.DEVICE_SELECTION, True, "no devices: every device hidden")
    names: dict[str, list[str]] = {}
    for _, device in pairs:
        profile = _profile(profiles, device)
        var = profile.visible_devices_env if profile else "CUDA_VISIBLE_DEVICES"
        by_index = profile is not None and profile.visible_devices_by is VisibleBy.INDEX
        names.setdefault(var, []).append(str(device.index) if by_index else device.uuid)
    env = {var: ",".join(values) for var, values in names.items()}
    detail = "; ".join(f"{var}={value}" for var, value in env.items())
    return env, LayerState(Layer.DEVICE_SELECTION, True, detail)


def _memory_cap_mib(piece: Slice, device: Device) -> int:
    """The slice's memory when it is a real cap (known and smaller than the device), else 0."""
    if piece.memory_mib <= 0:
        return 0
    if device.memory_mib and piece.memory_mib >= device.memory_mib:
        return 0
    return piece.memory_mib


def mps_env(pairs: list[tuple[Slice, Device]], profiles: ProfileSet,
            client_env: Mapping[str, str] | None) -> tuple[dict[str, str], LayerState]:
    """Layer 2: MPS client limits for a fractional slice (thread share and pinned memory)."""
    shared = [(p, d) for p, d in pairs if p.compute_milli < MILLI or _memory_cap_mib(p, d)]
    if not shared:
        return {}, LayerState(Layer.MPS, False, "whole devices: no MPS needed")
    unable = [d.model for _, d in shared
              if not ((prof := _profile(profiles, d)) and prof.sharing.mps and prof.sharing.mps_limits)]
    if unable:
        return {}, LayerState(Layer.MPS, False, f"{unable[0]} cannot cap MPS clients")
    percent = max(1, math.ceil(max(p.compute_milli for p, _ in shared) * 100 / MILLI))
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percent)}
    limits = [f"{ordinal}={cap}M" for ordinal, (p, d) in enumerate(pairs) if (cap := _memory_cap_mib(p, d))]
    if limits:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
    if client_env is None:
        return env, LayerState(Layer.MPS, False, "limits set, but no MPS daemon runs here: not enforced")
    env.update(client_env)
    return env, LayerState(Layer.MPS, True, f"{percent}% of threads, memory {limits or 'uncapped'}")


def _fraction_text(fraction: float) -> str:
    return f"{fraction:.4f}".rstrip("0").rstrip(".")


def framework_env(pairs: list[tuple[Slice, Device]],
                  base_pythonpath: str) -> tuple[dict[str, str], LayerState]:
    """Layer 3: framework allocator caps (torch via sitecustomize, JAX/XLA, CuPy)."""
    capped = [(p, d, cap) for p, d in pairs if (cap := _memory_cap_mib(p, d))]
    if not capped:
        return {}, LayerState(Layer.FRAMEWORK_CAPS, False, "no memory cap asked (or device memory unknown)")
    piece, device, cap = capped[0]
    env = {"CUPY_GPU_MEMORY_LIMIT": str(cap * 2**20)}
    if device.memory_mib:
        fraction = _fraction_text(cap / device.memory_mib)
        env |= {TORCH_FRACTION_ENV: fraction, "XLA_PYTHON_CLIENT_MEM_FRACTION": fraction}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITECUSTOMIZE_DIR), base_pythonpath) if p)
    return env, LayerState(Layer.FRAMEWORK_CAPS, True, f"{cap} MiB of device {piece.device_index}")


def gang_env(pod: PodLaunch) -> tuple[dict[str, str], LayerState]:
    """Layer 5: what torch.distributed and NCCL need to form the gang. The server reserves the
    gang's MASTER_PORT on the rank-0 node (no two gangs share one); a launch without a port (a
    caller other than the server) gets no MASTER_PORT rather than a guessed one.

    Each pod is one torch "node": NNODES pods, this one NODE_RANK, NPROC_PER_NODE its whole devices
    (torchrun's --nnodes/--node-rank/--nproc-per-node). torch's per-process names (WORLD_SIZE, RANK,
    LOCAL_RANK, LOCAL_WORLD_SIZE) count processes, so they are set only where the pod runs one
    process (NPROC_PER_NODE 1): there they are what torchrun would set. A pod of several devices
    gets them from torchrun (`submit --launcher torchrun`) or from whatever starts its processes.
    LOCAL_RANK is 0, not the pod's place among the gang's pods on its node: each pod sees only its
    own devices, numbered from 0."""
    if pod.world_size <= 1 and not pod.ib_hcas:
        return {}, LayerState(Layer.GANG, False, "single pod")
    nproc = nproc_per_node(pod.slices)
    env = {"MASTER_ADDR": pod.master_addr, "NNODES": str(pod.world_size), "NODE_RANK": str(pod.rank),
           "NPROC_PER_NODE": str(nproc)}
    if nproc == 1:
        env |= {"WORLD_SIZE": str(pod.world_size), "RANK": str(pod.rank), "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1"}
    if pod.master_port:
        env["MASTER_PORT"] = str(pod.master_port)
    if pod.ib_hcas:
        env["NCCL_IB_HCA"] = "=" + ",".join(pod.ib_hcas)  # '=' makes NCCL match names exactly
    if pod.ib_sl is not None:
        env["NCCL_IB_SL"] = str(pod.ib_sl)
    if pod.ib_pkey_index is not None:
        env["NCCL_IB_PKEY"] = str(pod.ib_pkey_index)
    return env, LayerState(Layer.GANG, True, f"rank {pod.rank} of {pod.world_size}")


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def process_limit(explicit: str | int | None = None) -> int:
    """The most processes (threads included) one pod account may have on this node: RLIMIT_NPROC,
    which the kernel counts per real uid, so all pods of a tenant on the node share it.

    `explicit`, else GPUPOOL_POD_PROCESSES (a positive count), else
    max(MIN_POD_PROCESSES, min(pid_max, threads-max) // PROCESS_SHARE_DIVISOR): one tenant takes at
    most a quarter of the slots, so it alone cannot exhaust the node's pids, and the rest stay for
    the other tenants and the system. Never above this process's own hard RLIMIT_NPROC (a pod's
    account can only lower what it inherits). Raises InvalidInput for a value that is not a
    positive integer."""
    raw = explicit if explicit is not None else os.environ.get(POD_PROCESSES_ENV, "")
    if raw not in ("", None):
        try:
            count = int(raw)
        except ValueError:
            count = 0
        if count <= 0:
            raise InvalidInput(f"{POD_PROCESSES_ENV}={raw!r} is not a positive whole number of processes "
                               "per pod account; leave it unset for a quarter of the node's pids.")
    else:
        slots = [v for v in (_read_int("/proc/sys/kernel/pid_max"),
                             _read_int("/proc/sys/kernel/threads-max")) if v]
        count = max(MIN_POD_PROCESSES, min(slots, default=32768) // PROCESS_SHARE_DIVISOR)
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    return count if hard == resource.RLIM_INFINITY else max(1, min(count, hard))


def default_memory_mib(node: Node, devices: int) -> int:
    """The host memory bound of a pod that asks for none: its devices' share of the node's memory
    (memory / devices per device, one share for a pod without devices; all of it on a node without
    devices). 0 when the node's memory is unknown."""
    return node.memory_mib * max(1, devices) // max(1, len(node.devices), devices)


def find_cgroup_root(explicit: Path | str | None = None) -> Path | None:
    """The delegated cgroup v2 directory pods are created under, when usable.

    Taken from `explicit` or GPUPOOL_CGROUP_ROOT; usable when it is a cgroup v2 directory
    (has cgroup.controllers), writable, and offers the cpu and memory controllers.
    """
    raw = explicit or os.environ.get(CGROUP_ROOT_ENV)
    if not raw:
        return None
    root = Path(raw)
    try:
        controllers = (root / "cgroup.controllers").read_text().split()
    except OSError:
        return None
    if not os.access(root, os.W_OK) or not {"cpu", "memory"} <= set(controllers):
        return None
    return root


def host_limits(pod: PodLaunch, cgroup_root: Path | None, has_devices: bool, *, default_memory_mib: int = 0,
                nproc: int | None = None,
                agent_mark: str = "") -> tuple[HostLimits, dict[str, str], LayerState]:
    """Layer 4: cgroup v2 files for a pod cgroup, or an RLIMIT_DATA fallback; the memory bound is
    the pod's request, else `default_memory_mib`; `nproc` is the account's RLIMIT_NPROC (None: not
    set, as for pods that run as the agent's own user). The cgroup's name carries `agent_mark` (the
    agent's, leftovers.agent_mark): two agents under one root never share a pod's cgroup, whose end
    kills every process in it."""
    memory_mib = pod.memory_mib or default_memory_mib
    bound = "" if pod.memory_mib or not memory_mib else " (a default share: no memory asked)"
    procs = f"; RLIMIT_NPROC={nproc} per account" if nproc else "; processes not limited"
    if cgroup_root is not None:
        cpu = f"{pod.cpu_milli * CPU_PERIOD_US // MILLI} {CPU_PERIOD_US}" if pod.cpu_milli else "max"
        memory = str(memory_mib * 2**20) if memory_mib else "max"
        files = {"cpu.max": cpu, "memory.max": memory}
        if nproc:
            files["pids.max"] = str(nproc)  # written only where the pids controller is delegated
        directory = cgroup_root / (f"pod-{agent_mark}-{pod.pod_id}" if agent_mark else f"pod-{pod.pod_id}")
        return HostLimits(cgroup_dir=directory, rlimit_nproc=nproc), files, LayerState(
            Layer.HOST_LIMITS, True, f"cgroup {directory}: cpu.max={cpu}, memory.max={memory}{bound}{procs}")
    if memory_mib and not has_devices:
        limit = memory_mib * 2**20
        return HostLimits(rlimit_data_bytes=limit, rlimit_nproc=nproc), {}, LayerState(
            Layer.HOST_LIMITS, True, f"no cgroup v2 tree: RLIMIT_DATA={limit}{bound}; CPU not capped{procs}")
    reason = " Device pods get no memory RLIMIT (GPU drivers map large regions)." if has_devices else ""
    return HostLimits(rlimit_nproc=nproc), {}, LayerState(
        Layer.HOST_LIMITS, False,
        f"no writable cgroup v2 tree: CPU and memory not capped{procs}.{reason}")


def prepare_cgroup(limits: HostLimits, files: Mapping[str, str]) -> HostLimits:
    """Create the pod's cgroup and write its limits; on failure fall back to no cgroup."""
    if limits.cgroup_dir is None:
        return limits
    directory = limits.cgroup_dir
    for controllers in ("+cpu +memory", "+pids"):  # pids is optional: not every tree delegates it
        with contextlib.suppress(OSError):
            (directory.parent / "cgroup.subtree_control").write_text(controllers)
    try:
        directory.mkdir(exist_ok=True)
        for name, value in files.items():
            if name == "pids.max" and not (directory / name).exists():
                continue  # no pids controller here: RLIMIT_NPROC alone limits the account
            (directory / name).write_text(value)
    except OSError:
        return HostLimits(rlimit_nproc=limits.rlimit_nproc)
    return limits


def plan_isolation(pod: PodLaunch, node: Node, *, profiles: ProfileSet | None = None,
                   mps_client_env: Mapping[str, str] | None = None, cgroup_root: Path | None = None,
                   base_pythonpath: str = "", nproc: int | None = None,
                   agent_mark: str = "") -> IsolationPlan:
    """Every layer's variables and limits for `pod` on `node`. Pure apart from reading nothing:
    the caller passes the MPS daemon's client variables (None when no daemon runs), the cgroup
    root and the account's process limit (None: none). Raises InvalidInput when the pod names a
    device the node lacks."""
    profiles = profiles or default_profiles()
    pairs = _devices_of(pod, node)
    env: dict[str, str] = {"GPUPOOL_POD_ID": pod.pod_id, "GPUPOOL_WORKLOAD_ID": pod.workload_id,
                           "GPUPOOL_NODE": node.name}
    if pairs:
        env["GPUPOOL_DEVICE_MILLI"] = ",".join(str(p.compute_milli) for p, _ in pairs)
        env["GPUPOOL_DEVICE_MEMORY_MIB"] = ",".join(str(p.memory_mib) for p, _ in pairs)
    layers = []
    for part, state in (device_selection_env(pairs, node, profiles),
                        mps_env(pairs, profiles, mps_client_env),
                        framework_env(pairs, base_pythonpath), gang_env(pod)):
        env.update(part)
        layers.append(state)
    devices = len({p.device_index for p, _ in pairs})
    limits, files, host_state = host_limits(pod, cgroup_root, bool(pairs), nproc=nproc, agent_mark=agent_mark,
                                            default_memory_mib=default_memory_mib(node, devices))
    layers.insert(3, host_state)
    return IsolationPlan(env=env, host_limits=limits, cgroup_files=files, layers=tuple(layers))
