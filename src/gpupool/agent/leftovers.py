"""Find and kill what is left of a pod outside its process group.

A pod ends with its main process, and the runner kills the pod's process group with it. A process
that called setsid() (a double-forked daemon, say) has left that group; it is still the pod's:
- with a cgroup, every process in it is the pod's, and `cgroup.kill` (Linux >= 5.14) ends them all
  at once (older kernels: SIGKILL each pid in cgroup.procs until it is empty);
- without one, the runner looks for processes of the pod's account whose environment, as it was at
  their exec, holds the pod's marker `GPUPOOL_POD_MARK=<agent mark>/<pod id>`. The agent's mark (a
  random token kept in its state directory, `agent_mark`) keeps two agents on one machine (two pools,
  or simulated nodes) apart: pods of the same id under the same account in both are different pods,
  and one's end must not sweep the other's processes. A process that execs itself with a
  cleared environment (`setsid env -i ...`) carries no marker, so for the pool's own accounts there
  is a second sweep, by uid (AccountLocks.sweep): a pool account belongs to one tenant and
  to the pool, and when no pod of that account is live on this machine, in this agent or any other
  (each holds a shared lock on the account's file while it has one; the sweep takes it exclusively,
  so no pod of the account can start meanwhile; each also notes its pods' main processes, so the
  pods of an agent killed with -9, which run on until the next agent adopts them, stop the sweep
  too), every process of the account is a leftover (the launchers' account helpers run as root,
  launcher.py, so none of them is the account's).
  While another pod of the account is live, a leftover without a marker
  cannot be told from that pod's own processes and lives until the account's last pod here ends.
  Accounts mapped with --unix-user (possibly a person's) are never swept by uid.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from gpupool.agent.podstate import process_alive

MARKER = "GPUPOOL_POD_MARK"
MARK_FILE = "sweep-mark"
"""The file in an agent's state directory that holds its mark (`agent_mark`)."""
_PROC = Path("/proc")
ACCOUNT_LOCK_DIR = Path("/run/gpupool/accounts")
"""Root's directory of per-account lock files (0700: no tenant can open one to hold it)."""


def agent_mark(state_dir: Path) -> str:
    """The mark of the agent whose state directory is `state_dir`: made (random) by the first agent
    there and kept, so the agent that re-adopts its pods after a restart sweeps them too."""
    path = Path(state_dir) / MARK_FILE
    with contextlib.suppress(OSError, UnicodeDecodeError):
        mark = path.read_text().strip()
        if mark.isalnum():
            return mark
    draft = path.with_name(f"{MARK_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    draft.write_text(secrets.token_hex(8) + "\n")
    try:
        os.link(draft, path)  # atomic, and never over another agent's mark made meanwhile
    except FileExistsError:
        pass
    finally:
        draft.unlink()
    return path.read_text().strip()


def pod_mark(agent: str, pod_id: str) -> dict[str, str]:
    """The environment entries of pod `pod_id`'s processes under the agent marked `agent`: the id,
    for the pod to read, and the marker its end's sweep looks for."""
    return {"GPUPOOL_POD_ID": pod_id, MARKER: f"{agent}/{pod_id}"}


def marker(agent: str, pod_id: str) -> bytes:
    return f"{MARKER}={agent}/{pod_id}".encode()


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


def pods_processes(pods: dict[str, int], agent: str, *, exclude: int | None = None) -> list[int]:
    """Pids of processes carrying the marker of one of `pods` (pod id -> the uid it runs as) of the
    agent marked `agent`, owned by that uid; one pass over /proc for all of them."""
    wanted: dict[int, set[bytes]] = {}
    for pod_id, uid in pods.items():
        wanted.setdefault(uid, set()).add(marker(agent, pod_id))
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


def kill_leftovers(pods: dict[str, tuple[int, str | None]], agent: str) -> int:
    """SIGKILL what is left of `pods` (pod id -> (uid, cgroup or None)) of the agent marked `agent`
    (see the module's docstring); returns how many processes (or cgroups) were killed."""
    killed = sum(kill_cgroup(Path(cgroup)) for _, cgroup in pods.values() if cgroup)
    uids = {pod_id: uid for pod_id, (uid, _) in pods.items()}
    for _ in range(10):  # a leftover may fork once more before its SIGKILL lands
        pids = pods_processes(uids, agent, exclude=os.getpid())
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed += len(pids)
    return killed


def account_processes(uid: int, *, exclude: int | None = None) -> list[int]:
    """Pids of the processes of `uid`."""
    found = []
    with contextlib.suppress(OSError):
        for name in os.listdir(_PROC):
            if not name.isdigit() or int(name) == exclude:
                continue
            try:
                if os.stat(_PROC / name).st_uid != uid:
                    continue
            except OSError:
                continue
            found.append(int(name))
    return found


def _kill_if_owned(pid: int, uid: int) -> bool:
    """SIGKILL `pid` if it is still a process of `uid`: through a pidfd, so a pid reused meanwhile
    by someone else's process is never signalled (the pidfd then names the dead one)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if os.stat(_PROC / str(pid)).st_uid != uid:
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


class AccountLocks:
    """Which pool accounts have a live pod on this machine, across agents: an agent holds a shared
    flock on ACCOUNT_LOCK_DIR/<uid> while it has a pod of that account, and a sweep by uid takes it
    exclusively (without waiting), so it runs only when no agent has one and no pod of the account
    starts while it runs."""

    def __init__(self, directory: Path = ACCOUNT_LOCK_DIR) -> None:
        self._dir = directory
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}

    def _make_dir(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self._dir, 0o700)

    def _open(self, uid: int) -> int:
        self._make_dir()
        return os.open(self._dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)

    def hold(self, uid: int) -> None:
        """Mark `uid` in use by this agent (waits while a sweep of it runs). Idempotent."""
        with self._lock:
            if uid in self._held:
                return
        fd = self._open(uid)
        fcntl.flock(fd, fcntl.LOCK_SH)  # not under self._lock: a wait here holds up nothing else
        with self._lock:
            if uid in self._held:
                os.close(fd)  # another thread marked it meanwhile
            else:
                self._held[uid] = fd

    def release(self, uid: int) -> None:
        with self._lock:
            fd = self._held.pop(uid, None)
        if fd is not None:
            os.close(fd)

    def release_all(self) -> None:
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for fd in held:
            os.close(fd)

    def _live_dir(self, uid: int) -> Path:
        return self._dir / f"{uid}.live"

    def register(self, uid: int, key: str, pid: int, start_ticks: int | None) -> None:
        """Note a started pod's main process. The flock goes with the agent that holds it, but an
        agent killed with -9 leaves its pods running for the next agent to adopt: until then these
        notes keep every other agent's sweep off the account."""
        live = self._live_dir(uid)
        with contextlib.suppress(OSError):
            self._make_dir()  # root's only
            live.mkdir(exist_ok=True, mode=0o700)
            (live / key).write_text(f"{pid} {start_ticks if start_ticks is not None else ''}\n")

    def unregister(self, uid: int, key: str) -> None:
        with contextlib.suppress(OSError):
            (self._live_dir(uid) / key).unlink()

    def _pod_still_runs(self, uid: int) -> bool:
        """Whether a noted pod of `uid` still runs; notes of pods that have ended are removed."""
        try:
            notes = list(self._live_dir(uid).iterdir())
        except OSError:
            return False
        running = False
        for note in notes:
            try:
                pid_text, _, ticks_text = note.read_text().strip().partition(" ")
                pid, ticks = int(pid_text), int(ticks_text) if ticks_text else None
            except (OSError, ValueError):
                pid, ticks = 0, None
            if pid > 0 and process_alive(pid, ticks):
                running = True
            else:
                with contextlib.suppress(OSError):
                    note.unlink()
        return running

    def sweep(self, uid: int) -> int:
        """SIGKILL every process of `uid` (see the module's docstring) when no agent has a pod of it;
        returns how many were signalled (0 also when a pod of it is live somewhere)."""
        killed: list[int] = []
        self.when_idle(uid, lambda: None, killed)
        return sum(killed)

    def when_idle(self, uid: int, action: Callable[[], object], killed: list[int] | None = None) -> bool:
        """Run `action` while no agent has a pod of `uid` and none starts (the sweep's exclusive
        lock), after every process of it is killed (a leftover); False, running nothing, while a
        pod of it is live here or in another agent, or one of its processes outlives the kills.
        `killed`, when given, gets how many were signalled."""
        try:
            fd = self._open(uid)
        except OSError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False  # a pod of the account is live here or in another agent
            if self._pod_still_runs(uid):
                return False  # an agent that held it was killed, and its pods wait for the next one
            count, pids = 0, []
            for _ in range(20):  # a leftover may fork once more before its SIGKILL lands
                pids = account_processes(uid, exclude=os.getpid())
                if not pids:
                    break
                count += sum(_kill_if_owned(pid, uid) for pid in pids)
            if killed is not None:
                killed.append(count)
            if pids:
                return False
            action()
            return True
        finally:
            os.close(fd)
