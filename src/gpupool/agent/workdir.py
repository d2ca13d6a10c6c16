"""Where a pod runs: its --workdir, else the directory `gpupool submit` ran in when its account may
enter it on this node, else its private directory; and the one line that says which, and why.

The check is the kernel's, done ahead: every directory on the way needs search (x) permission for
the pod's uid, or its gid, or others (pods run without supplementary groups, see launcher.py), and
symbolic links are followed. ACLs are not read, so a directory opened to the account only through
an ACL is reported closed and the pod runs in its private directory (the safe direction).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from gpupool.agent.identity import PodIdentity

SUBMIT_DIR_ENV = "GPUPOOL_SUBMIT_DIR"
"""Set by the server in the pods of a workload submitted from the command line (like SLURM_SUBMIT_DIR)."""
_MAX_LINKS = 40


@dataclass(frozen=True, slots=True)
class WorkdirChoice:
    path: str
    """'' when the pod runs in its private directory."""
    note: str
    """One line for `gpupool show` ('' when there is nothing to say)."""


def choose(workdir: str, submit_dir: str, identity: PodIdentity | None) -> WorkdirChoice:
    """The directory a pod runs in ('' = its private one) and why. An explicit workdir is taken as
    given: the shim fails the pod (exit 126) when the account cannot enter it."""
    if workdir:
        return WorkdirChoice(workdir, "")
    if not submit_dir:
        return WorkdirChoice("", "")
    why_not = closed_because(submit_dir, identity)
    if why_not is None:
        return WorkdirChoice(submit_dir, f"workdir: {submit_dir} (where submit ran)")
    return WorkdirChoice("", f"workdir: private directory ({why_not})")


def closed_because(path: str, identity: PodIdentity | None) -> str | None:
    """None when `identity` (None: this process's own user) may enter `path`, else why not."""
    account = identity.user if identity is not None else "the pool's user"
    if not os.path.isabs(path):
        return f"{path} is not an absolute path"
    if identity is None:
        if not os.path.isdir(path):
            return f"{path} does not exist on this node"
        return None if os.access(path, os.X_OK) else f"{path} is not open to account {account}"
    blocked = _first_closed(Path(path), identity)
    if blocked is None:
        return None
    if blocked == "":
        return f"{path} does not exist on this node"
    where = "" if blocked == path else f": {blocked} is closed to it"
    return f"{path} is not open to account {account}{where}"


def _first_closed(path: Path, identity: PodIdentity) -> str | None:
    """The first directory on the way to `path` the account may not search; '' when the path does
    not lead to a directory; None when it may enter it."""
    todo = list(path.parts[1:])
    current = Path("/")
    links = 0
    while True:
        try:
            info = os.stat(current)
        except OSError:
            return ""
        if not stat.S_ISDIR(info.st_mode):
            return ""
        if not _may_search(info, identity):
            return str(current)
        if not todo:
            return None
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent
            continue
        step = current / part
        try:
            target = os.readlink(step)
        except OSError:  # not a link (or missing: the stat above says which)
            current = step
            continue
        links += 1
        if links > _MAX_LINKS:
            return ""
        todo = list(Path(target).parts[1:] if os.path.isabs(target) else Path(target).parts) + todo
        if os.path.isabs(target):
            current = Path("/")


def _may_search(info: os.stat_result, identity: PodIdentity) -> bool:
    if info.st_uid == identity.uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == identity.gid:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)
