"""Run a pod's command inside an OCI container: crun, rootless, started by the pod's own account.

The shim (shim.py) runs, as the pod's account, inside the pod's network namespace, cgroup and
rlimits as for any pod; its command is `container_argv()`: `unshare --user --map-root-user --mount`
(a user namespace in which only the account itself is mapped, as 0) and a few lines of sh that

1. mount a private tmpfs over the bundle's `state` directory, crun's `--root`: the container's state
   lives and dies with this mount namespace, so nothing is left behind on the host, and no other
   pod can see it;
2. on a host with a hybrid cgroup layout (v1 controllers plus a v2 hierarchy holding one of its
   own), cover /sys/fs/cgroup/unified with an empty tmpfs, so crun sees v1 only: crun 1.x refuses
   to start anything on a hybrid host whose v2 hierarchy has a controller (the exact error is
   "cgroups in hybrid mode not supported, drop all controllers from cgroupv2"), although it is
   told to leave cgroups alone (`--cgroup-manager=disabled`: the shim is already in the pod's);
3. exec `crun run`, which maps the container's uid and gid back to the account's (a nested user
   namespace) and runs the command there, in the image's rootfs, read-only, with a tmpfs /tmp.

So crun never holds a privilege the account does not have: a config.json the account edited could
not give it more. The container joins no network namespace of its own (it is in the pod's) and no
pid namespace: a pid 1 ignores a SIGTERM it has no handler for, which would turn every cancel into a
wait for the grace period; crun forwards the shim's SIGTERM to the command, and what the command
started in its own session carries the pod's marker (GPUPOOL_POD_MARK) and is swept with the pod's
leftovers (leftovers.py). The pod's standard output and error are the container's (no terminal).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpupool.agent.identity import open_owned_dir, write_owned_file
from gpupool.providers.nodespec import CONTAINERS_LABEL

__all__ = ["CONTAINERS_LABEL", "ContainerRuntime", "container_argv", "detect", "oci_config", "write_bundle"]
RUNTIME_ENV = "GPUPOOL_CONTAINER_RUNTIME"
"""The crun binary to use (default: crun on PATH); `off` turns containers off on this node."""
BUNDLE_DIR = ".gpupool-container"
"""In the pod's private directory: config.json and the empty `state` directory."""
HYBRID_V2 = "/sys/fs/cgroup/unified"
GPU_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
"""Device nodes every CUDA process opens besides its GPUs' own /dev/nvidiaN."""
_HOST_PROC_MASKED = ("/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
                     "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware")
_HOST_PROC_READONLY = ("/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
                       "/proc/sysrq-trigger")
POD_MOUNT_POINTS = {"home": "/gpupool/home", "work": "/gpupool/work", "checkpoint": "/gpupool/checkpoint",
                    "mps": "/gpupool/mps", "site": "/gpupool/site"}
"""Where a pod's own directories appear in its container (HOME and TMPDIR, --workdir,
GPUPOOL_CHECKPOINT_DIR, CUDA_MPS_PIPE_DIRECTORY, the pool's Python start-up hook)."""
IMAGE_MOUNT_POINTS = ("proc", "sys", "dev", "tmp", *(p.lstrip("/") for p in POD_MOUNT_POINTS.values()))
"""Directories the image store makes in every image it imports (empty, root's, 0755)."""
_SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

SCRIPT = r"""
state=$1 bundle=$2 name=$3 hide=$4 crun=$5 mount=$6
"$mount" -t tmpfs -o mode=0700,size=4m gpupool-crun "$state" || exit 125
if [ -n "$hide" ]; then "$mount" -t tmpfs -o ro,size=4k gpupool-hide "$hide" || exit 125; fi
exec "$crun" --root "$state" --cgroup-manager=disabled run --bundle "$bundle" "$name"
"""


@dataclass(frozen=True, slots=True)
class ContainerRuntime:
    """What this node runs `--image` pods with, found at agent start (`detect`)."""

    crun: str
    unshare: str
    mount: str
    version: str
    hybrid_cgroups: bool

    @property
    def label(self) -> str:
        return f"crun {self.version}"


def _hybrid_cgroups(mountinfo: str) -> bool:
    """Whether /sys/fs/cgroup is a v1 tree with a v2 hierarchy mounted at its `unified`."""
    kinds = {}
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) > 4 and right:
            kinds[fields[4]] = right.split()[0]
    return kinds.get("/sys/fs/cgroup") != "cgroup2" and kinds.get(HYBRID_V2) == "cgroup2"


def detect(environ: Mapping[str, str] | None = None) -> tuple[ContainerRuntime | None, str]:
    """The container runtime of this machine, or None and the sentence why there is none."""
    env = os.environ if environ is None else environ
    wanted = env.get(RUNTIME_ENV, "").strip()
    if wanted == "off":
        return None, f"containers are turned off on this node ({RUNTIME_ENV}=off)"
    crun = shutil.which(wanted or "crun", path=_SEARCH_PATH if not wanted else None)
    unshare = shutil.which("unshare", path=_SEARCH_PATH)
    mount = shutil.which("mount", path=_SEARCH_PATH)
    if crun is None:
        return None, ("crun is not installed on this node (Debian: apt-get install crun)" if not wanted
                      else f"{RUNTIME_ENV}={wanted!r} is not an executable")
    if unshare is None or mount is None:
        return None, "util-linux's unshare and mount are missing on this node"
    try:
        with open("/proc/sys/user/max_user_namespaces") as handle:
            if int(handle.read().strip() or 0) <= 0:
                return None, "user namespaces are off (sysctl user.max_user_namespaces=0)"
    except (OSError, ValueError):
        return None, "this kernel has no user namespaces (/proc/sys/user/max_user_namespaces)"
    try:
        out = subprocess.run([crun, "--version"], capture_output=True, text=True, timeout=10, check=False)
        match = re.search(r"version\s+(\S+)", out.stdout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{crun} --version failed ({exc})"
    if match is None:
        return None, f"{crun} --version said {out.stdout.strip()[:80]!r}, not crun's version"
    try:
        hybrid = _hybrid_cgroups(Path("/proc/self/mountinfo").read_text())
    except OSError:
        hybrid = False
    return ContainerRuntime(crun, unshare, mount, match.group(1), hybrid), ""


def gpu_device_nodes(device_indexes: Iterable[int], dev: Path = Path("/dev")) -> list[str]:
    """The device nodes a pod with these GPUs (by index) needs, those that exist on this node:
    /dev/nvidiaN of each of its GPUs (and of no other) and the driver's control nodes."""
    indexes = sorted(set(device_indexes))
    if not indexes:
        return []
    wanted = [str(dev / f"nvidia{i}") for i in indexes]
    wanted += [str(dev / Path(p).name) for p in GPU_CONTROL_NODES]
    return [p for p in wanted if os.path.exists(p)]


def _bind(source: str, destination: str, *, read_only: bool = False) -> dict[str, Any]:
    options = ["rbind", "nosuid", "nodev"] + (["ro"] if read_only else [])
    return {"destination": destination, "type": "none", "source": source, "options": options}


def oci_config(*, command: Sequence[str], env: Mapping[str, str], cwd: str, uid: int, gid: int,
               rootfs: str, binds: Mapping[str, str] = MappingProxyType({}),
               read_only_binds: Mapping[str, str] = MappingProxyType({}),
               devices: Sequence[str] = (), hostname: str = "pod") -> dict[str, Any]:
    """The OCI runtime config (config.json) of one pod's container: `command` as uid:gid (mapped
    from the outer namespace's 0, the pod's account), exactly `env`, in `cwd`; the image's rootfs
    read-only with a tmpfs /tmp; `binds` (container path -> host path: the pod's private directory,
    its working directory, its checkpoint directory, the MPS pipe) and `read_only_binds`, at mount
    points the image store made in every image (MOUNT_POINTS), so nothing is ever created in a
    rootfs that pods share; `devices` bound in (only the pod's own); no capabilities, no new
    privileges."""
    mounts: list[dict[str, Any]] = [
        _bind("/proc", "/proc"),  # the node's: a new one needs a pid namespace, which it has not
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        _bind("/sys", "/sys", read_only=True),
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "mode=1777"]},
    ]
    for table, read_only in ((binds, False), (read_only_binds, True)):
        for destination, source in sorted(table.items()):
            if destination not in POD_MOUNT_POINTS.values():
                raise ValueError(f"{destination!r} is not one of the images' mount points")
            if source and os.path.isabs(source):
                mounts.append(_bind(source, destination, read_only=read_only))
    for node in devices:
        mounts.append({"destination": node, "type": "none", "source": node, "options": ["bind", "nosuid"]})
    return {
        "ociVersion": "1.0.0",
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid},
            "args": list(command),
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": cwd or "/",
            "capabilities": {kind: [] for kind in ("bounding", "effective", "inheritable", "permitted",
                                                   "ambient")},
            "noNewPrivileges": True,
        },
        "root": {"path": rootfs, "readonly": True},
        "hostname": hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": "user"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}],
            "uidMappings": [{"containerID": uid, "hostID": 0, "size": 1}],
            "gidMappings": [{"containerID": gid, "hostID": 0, "size": 1}],
            "maskedPaths": list(_HOST_PROC_MASKED),
            "readonlyPaths": list(_HOST_PROC_READONLY),
        },
    }


def write_bundle(private_dir: Path, config: Mapping[str, Any], uid: int, gid: int) -> Path:
    """Write the pod's bundle into its private directory (the account's own, 0700): config.json and
    the empty `state` directory crun's state goes under; returns the bundle's directory. The account
    can write to `private_dir`, so root follows no name there (`open_owned_dir`)."""
    bundle = open_owned_dir(private_dir, BUNDLE_DIR, 0o700, uid, gid)
    try:
        os.close(open_owned_dir(bundle, "state", 0o700, uid, gid))
        write_owned_file(bundle, "config.json", json.dumps(config).encode(), 0o600, uid, gid)
    finally:
        os.close(bundle)
    return private_dir / BUNDLE_DIR


def container_argv(runtime: ContainerRuntime, bundle: Path, name: str) -> list[str]:
    """What the shim runs for a pod in a container (see the module's docstring)."""
    hide = HYBRID_V2 if runtime.hybrid_cgroups else ""
    return [runtime.unshare, "--user", "--map-root-user", "--mount", "--", "/bin/sh", "-c", SCRIPT,
            "gpupool-container", str(bundle / "state"), str(bundle), name, hide, runtime.crun, runtime.mount]
