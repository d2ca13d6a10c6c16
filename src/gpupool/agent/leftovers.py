"""Find and kill what is left of a pod outside its process group.

A pod ends with its main process, and the runner kills the pod's process group with it. A process
that called setsid() (a double-forked daemon, say) has left that group; it is still the pod's:
- with a cgroup, every process in it is the pod's, and `cgroup.kill` (Linux >= 5.14) ends them all
  at once (older kernels: SIGKILL each pid in cgroup.procs until it is empty);
- without one, the runner looks for processes of the pod's account whose environment, as it was at
  their exec, holds the pod's marker `GPUPOOL_POD_ID=<pod id>`. Best effort: a process that execs
  itself with a cleared environment escapes the scan; a cgroup is the complete answer.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

MARKER = "GPUPOOL_POD_ID"
_PROC = Path("/proc")


def marker(pod_id: str) -> bytes:
    return f"{MARKER}={pod_id}".encode()


def kill_cgroup(cgroup: Path) -> int:
    """SIGKILL every process in `cgroup`; returns how many were signalled (or 1 for cgroup.kill)."""
    kill_file = cgroup / "cgroup.kill"
    if kill_file.exists():
        with contextlib.suppress(OSError):
            kill_file.write_text("1")
            return 1
    killed = 0
    for _ in range(100):  # processes may fork while being killed: repeat until none are left
        try:
            pids = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return killed
        if not pids:
            return killed
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


def pods_processes(pods: dict[str, int], *, exclude: int | None = None) -> list[int]:
    """Pids of processes carrying the marker of one of `pods` (pod id -> the uid it runs as), owned
    by that uid; one pass over /proc for all of them."""
    wanted: dict[int, set[bytes]] = {}
    for pod_id, uid in pods.items():
        wanted.setdefault(uid, set()).add(marker(pod_id))
    found = []
    try:
        entries = os.listdir(_PROC)
    except OSError:
        return []
    for name in entries:
        if not name.isdigit() or int(name) == exclude:
            continue
        try:
            markers = wanted.get(os.stat(_PROC / name).st_uid)
            if markers is None:
                continue
            with open(_PROC / name / "environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue
        if not markers.isdisjoint(environ.split(b"\0")):
            found.append(int(name))
    return found


def kill_leftovers(pods: dict[str, tuple[int, str | None]]) -> int:
    """SIGKILL what is left of `pods` (pod id -> (uid, cgroup or None); see the module's
    docstring); returns how many processes (or cgroups) were killed."""
    killed = sum(kill_cgroup(Path(cgroup)) for _, cgroup in pods.values() if cgroup)
    uids = {pod_id: uid for pod_id, (uid, _) in pods.items()}
    for _ in range(10):  # a leftover may fork once more before its SIGKILL lands
        pids = pods_processes(uids, exclude=os.getpid())
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed += len(pids)
    return killed
