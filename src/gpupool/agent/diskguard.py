"""The node's disk guard: a tenant's pod must not fill the filesystem the agent (and the store) writes.

A pod may write wherever its account may: its private directory under the pods' scratch root, its
workload's checkpoint directory, and the host's shared writable places (identity.SHARED_WRITABLE).
These usually share one filesystem with the agent's state directory, its pods' logs and, for the
local provider, the pool's store: once a pod has filled it, the store can save nothing, so no
other tenant's work is placed and not even the admin can cancel the pod.

At its regular poll (at most every CHECK_INTERVAL_S) the agent asks each filesystem it watches (its
state directory's, the scratch root's, and those its provider names, such as the store's
directory) how much is free (statvfs: what an unprivileged account may still use). Below the
reserve (GPUPOOL_DISK_RESERVE; by default the smaller of 5 % of the filesystem and 2 GiB), and only
then, it counts what each of the pool's pod accounts owns there, in the scratch root and in the
shared writable places on that filesystem (`find -xdev`, by the files' owner, each inode once), and
what the processes of those accounts hold open though deleted. The account that owns the most, if
it owns at least the reserve itself (one that wrote less is not what filled the disk), is blamed:
its pods on this node fail with a sentence saying so (Runner.fail), and once none of its processes
is left, what the account owns on that filesystem is removed: only for the pool's own accounts,
never for an account mapped with --unix-user (a person's, whose files are the admin's to judge).
A file is counted for its owner only: an unprivileged account cannot give a file away (chown), and
a hard link to another account's file counts for that file's owner, so no tenant can make another
look guilty. The work runs in a thread of its own, one pass at a time; the next check looks again.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.agent.identity import BASE_PATH, POD_GROUP, SHARED_WRITABLE, is_own_account, remove_left_behind
from gpupool.core.units import size_bytes
from gpupool.errors import InvalidInput

log = logging.getLogger("gpupool.agent")

DISK_RESERVE_ENV = "GPUPOOL_DISK_RESERVE"
DEFAULT_RESERVE_SHARE = 0.05
DEFAULT_RESERVE_CAP = 2 * 2**30
"""The default reserve: the smaller of 5 % of the filesystem and 2 GiB."""
CHECK_INTERVAL_S = 1.0
"""How often (at most) the poll looks at the free space: one statvfs per watched filesystem."""
QUIET_REPEAT_S = 60.0
"""How often (at most) the guard repeats that a filesystem is below its reserve with no one to blame."""
IDLE_PASS_S = 10.0
"""After a pass that found no one to blame, how long until the next (the free space is still looked at
every CHECK_INTERVAL_S, but counting the files costs a walk of the scratch root and the shared places)."""
STOP_WAIT_S = 10.0
"""How long the guard waits for a blamed account's processes to end before it removes its files
(the next pass tries again)."""


@dataclass(frozen=True, slots=True)
class Reserve:
    """What must stay free on a guarded filesystem: `size` bytes, or `share` of it (capped at `cap`)."""

    size: int | None = None
    share: float = DEFAULT_RESERVE_SHARE
    cap: int | None = DEFAULT_RESERVE_CAP

    @property
    def off(self) -> bool:
        return self.size == 0

    def bytes_for(self, total: int) -> int:
        """The reserve on a filesystem of `total` bytes."""
        if self.size is not None:
            return self.size
        share = int(total * self.share)
        return share if self.cap is None else min(share, self.cap)


def parse_reserve(text: str | None = None) -> Reserve:
    """GPUPOOL_DISK_RESERVE (or `text`): a size ('2GiB', '512MiB', a bare number of bytes), a share
    of each filesystem ('5%'), or 'off' / '0' (no guard); unset, the default Reserve. InvalidInput
    with the sentence for anything else."""
    raw = os.environ.get(DISK_RESERVE_ENV, "") if text is None else text
    value = raw.strip().lower()
    if not value:
        return Reserve()
    if value in ("off", "0"):
        return Reserve(size=0)
    try:
        if value.endswith("%"):
            share = float(value[:-1])
            if 0 < share < 100:
                return Reserve(share=share / 100, cap=None)
        else:
            size = size_bytes(value)
            if size is not None:
                return Reserve(size=size)
    except ValueError:
        pass
    raise InvalidInput(f"{DISK_RESERVE_ENV}={raw!r} is not a size (2GiB, 512MiB), a share of the disk (5%) "
                       "or 'off'; leave it unset for the smaller of 5 % of each filesystem and 2 GiB.")


def size_text(count: int) -> str:
    """A byte count for a person: '1.5 GiB', '63 MiB', '512 KiB', '100 bytes'."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count} bytes"


def owned_bytes(roots: Iterable[Path], uids: Collection[int], device: int) -> dict[int, int]:
    """What each of `uids` owns on the filesystem `device` under `roots` (at any depth, not crossing
    into another filesystem): the space its files take (allocated blocks, so a sparse file counts what
    it holds), each inode once (a hard link counts for its file's owner, whoever made the link)."""
    if not uids:
        return {}
    owned: dict[int, int] = {}
    seen: set[int] = set()
    owned_by = [arg for uid in sorted(uids) for arg in ("-o", "-uid", str(uid))][1:]
    for root in roots:
        try:
            if os.stat(root).st_dev != device:
                continue
            found = subprocess.run(["find", str(root), "-xdev", "(", *owned_by, ")",
                                    "-printf", r"%U %i %b\n"], capture_output=True, check=False,
                                   env={"PATH": BASE_PATH})
        except OSError as exc:
            log.warning("could not count the pod accounts' files under %s: %s", root, exc)
            continue
        for line in found.stdout.splitlines():
            try:
                uid_text, inode_text, blocks_text = line.split()
                uid, inode, blocks = int(uid_text), int(inode_text), int(blocks_text)
            except ValueError:
                continue
            if inode in seen or uid not in uids:
                continue
            seen.add(inode)
            owned[uid] = owned.get(uid, 0) + blocks * 512
    return owned


def open_deleted_bytes(uids: Collection[int], device: int, proc: Path = Path("/proc")) -> dict[int, int]:
    """What the processes of `uids` hold open on the filesystem `device` though it was deleted (no
    name left for `find`), counted for each file's owner, each inode once."""
    held: dict[int, int] = {}
    seen: set[int] = set()
    try:
        entries = [e for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return held
    for entry in entries:
        try:
            if entry.stat(follow_symlinks=False).st_uid not in uids:
                continue
            fds = os.listdir(f"{entry.path}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                info = os.stat(f"{entry.path}/fd/{fd}")
            except OSError:
                continue
            if (info.st_nlink == 0 and stat.S_ISREG(info.st_mode) and info.st_dev == device
                    and info.st_uid in uids and info.st_ino not in seen):
                seen.add(info.st_ino)
                held[info.st_uid] = held.get(info.st_uid, 0) + info.st_blocks * 512
    return held


def blame(usage: Mapping[int, int], threshold: int) -> tuple[int, int] | None:
    """The account that owns the most (uid, bytes), when it owns at least `threshold` bytes (at
    least one); ties go to the lowest uid, so every agent of the machine blames the same one."""
    if not usage:
        return None
    uid, most = min(usage.items(), key=lambda item: (-item[1], item[0]))
    return (uid, most) if most >= max(1, threshold) else None


def pool_uids(pool_id: str) -> dict[int, str]:
    """The pool's own accounts on this machine (uid -> name): named gpupool-<pool id>-..., in the pods'
    group, never root."""
    try:
        group = grp.getgrnam(POD_GROUP).gr_gid
    except KeyError:
        return {}
    return {entry.pw_uid: entry.pw_name for entry in pwd.getpwall() if is_own_account(entry, group, pool_id)}


@dataclass(frozen=True, slots=True)
class Pressure:
    """A watched filesystem below its reserve."""

    device: int
    path: Path
    free: int
    reserve: int


class DiskGuard:
    """Watches the filesystems of `watched` for a NodeAgent (see the module's docstring).

    `live_pods()`: the running pods here, (pod id, uid or None); `fail(pod_id, reason)`: end one
    with that reason; `drive()`: let the agent reap what ended (its poll); `when_idle(uid, action)`:
    run `action` once no pod or process of the account is left anywhere on the machine (False
    when one is, and nothing ran)."""

    def __init__(self, watched: Sequence[Path], *, scratch_root: Path, pool_id: str, reserve: Reserve,
                 live_pods: Callable[[], Iterable[tuple[str, int | None]]],
                 fail: Callable[[str, str], object], drive: Callable[[], object],
                 when_idle: Callable[[int, Callable[[], object]], bool],
                 shared: Sequence[Path] = SHARED_WRITABLE, node: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.watched = tuple(watched)
        self.scratch_root = scratch_root
        self.pool_id = pool_id
        self.reserve = reserve
        self.shared = tuple(shared)
        self.node = node
        self._live_pods, self._fail, self._drive, self._when_idle = live_pods, fail, drive, when_idle
        self._clock = clock
        self._next_check = float("-inf")
        self._quiet_until: dict[int, float] = {}
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self.blamed: list[tuple[int, int]] = []
        """(uid, bytes) of each account blamed so far, in order (for tests and logs)."""

    def pressure(self) -> list[Pressure]:
        """The watched filesystems below their reserve now (each once)."""
        found: dict[int, Pressure] = {}
        for path in self.watched:
            try:
                device = os.stat(path).st_dev
                if device in found:
                    continue
                fs = os.statvfs(path)
            except OSError:
                continue
            free, total = fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize
            reserve = self.reserve.bytes_for(total)
            if free < reserve:
                found[device] = Pressure(device, path, free, reserve)
        return list(found.values())

    def tick(self) -> None:
        """The poll's check: cheap (a statvfs per filesystem, at most every CHECK_INTERVAL_S); below a
        reserve, a pass in a thread of its own, unless one runs."""
        if self.reserve.off:
            return
        now = self._clock()
        with self._lock:
            if now < self._next_check or (self._worker is not None and self._worker.is_alive()):
                return
            self._next_check = now + CHECK_INTERVAL_S
            low = self.pressure()
            if not low:
                return
            self._worker = threading.Thread(target=self._relieve_all, args=(low,), daemon=True,
                                            name="gpupool-disk-guard")
            self._worker.start()

    def check(self) -> list[tuple[int, int]]:
        """One pass now, in this thread (tests): the accounts blamed (uid, bytes)."""
        return [b for p in self.pressure() for b in [self.relieve(p)] if b is not None]

    def wait(self, timeout_s: float = 30.0) -> None:
        worker = self._worker
        if worker is not None:
            worker.join(timeout_s)

    def _relieve_all(self, low: Sequence[Pressure]) -> None:
        for pressure in low:
            try:
                self.relieve(pressure)
            except Exception:  # the guard never takes the agent's poll down with it
                log.exception("node %s: the disk guard failed on %s", self.node, pressure.path)

    def _roots(self, device: int) -> list[Path]:
        roots = []
        for root in (self.scratch_root, *self.shared):
            with contextlib.suppress(OSError):
                if os.stat(root).st_dev == device and root.is_dir():
                    roots.append(root)
        return roots

    def relieve(self, pressure: Pressure) -> tuple[int, int] | None:
        """Blame the account that owns the most on this filesystem, end its pods here, and (the pool's
        own accounts only) remove what it owns there once its processes are gone; None when no
        account owns as much as the reserve there."""
        roots = self._roots(pressure.device)
        live: dict[int, list[str]] = {}
        for pod_id, uid in self._live_pods():
            if uid is not None and uid != 0 and uid != os.geteuid():
                live.setdefault(uid, []).append(pod_id)
        own = pool_uids(self.pool_id)
        if not self.pool_id:  # accounts named without a pool id: another pool's look the same, so
            own = {uid: name for uid, name in own.items() if uid in live}  # only those with pods here
        candidates = set(live) | set(own)
        usage = owned_bytes(roots, candidates, pressure.device) if roots else {}
        for uid, held in open_deleted_bytes(candidates, pressure.device).items():
            usage[uid] = usage.get(uid, 0) + held
        chosen = blame(usage, pressure.reserve)
        where = f"{pressure.path} ({size_text(pressure.free)} free, below its reserve of " \
                f"{size_text(pressure.reserve)})"
        if chosen is None:
            now = self._clock()
            with self._lock:  # the next count of that filesystem waits: statvfs alone until then
                self._next_check = max(self._next_check, now + IDLE_PASS_S)
            if now >= self._quiet_until.get(pressure.device, float("-inf")):
                self._quiet_until[pressure.device] = now + QUIET_REPEAT_S
                log.warning("node %s: the filesystem of %s is nearly full, and no pod account of this node "
                            "owns as much as the reserve there; free space on it (%s)", self.node, where,
                            DISK_RESERVE_ENV)
            return None
        uid, used = chosen
        self.blamed.append(chosen)
        removable = uid in own
        then = ("its files there are removed" if removable else
                "its files there are kept (an account mapped with --unix-user: the admin's to judge)")
        reason = (f"the node's disk is nearly full: this pod's account wrote {size_text(used)} on the "
                  f"filesystem of {pressure.path}, the most of any pod account there, leaving "
                  f"{size_text(pressure.free)} free, below the reserve of {size_text(pressure.reserve)} "
                  f"({DISK_RESERVE_ENV}); the node stopped the account's pods and {then}")
        pods = live.get(uid, [])
        name = own.get(uid) or _user(uid)
        log.warning("node %s: the filesystem of %s is nearly full; account %s owns %s there: ending its %d "
                    "pod(s) here%s", self.node, where, name, size_text(used), len(pods),
                    " and removing its files there" if removable else "")
        for pod_id in pods:
            self._fail(pod_id, reason)
        if removable:
            self._remove(uid, name, roots)
        return chosen

    def _remove(self, uid: int, name: str, roots: Sequence[Path]) -> None:
        """Remove what `uid` owns under `roots` once none of its pods or processes is left."""
        deadline = self._clock() + STOP_WAIT_S
        while True:
            self._drive()
            if any(u == uid for _, u in self._live_pods()):
                pass  # still ending (or started again here meanwhile: the next pass judges it)
            elif self._when_idle(uid, lambda: remove_left_behind({uid}, roots, sysvipc=None)):
                log.warning("node %s: removed what account %s owned on the nearly full filesystem",
                            self.node, name)
                return
            if self._clock() >= deadline:
                log.warning("node %s: account %s still has pods or processes; its files are removed at a "
                            "later pass", self.node, name)
                return
            time.sleep(0.05)


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
