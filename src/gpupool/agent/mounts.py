"""A pod's own mount namespace: the node paths it mounts (`submit --mount`) and its secret files.

The server allowed each mount's source by its path against the tenant's roots; here, at the launch,
the node resolves it (symlinks followed) and refuses what leads outside the root, then opens it
component by component from the root with O_PATH|O_NOFOLLOW, so a symlink swapped in after the
check is refused rather than followed. The root launcher helper binds that descriptor (never the
path again) in the pod's namespace (launcher.py). A mount grants no more than the file system does
below the root: the pod's account must be able to enter every directory from the root down to the
source (owner, group and other bits against the account's uid and its one group; ACLs are not
consulted), and the source keeps its own owner and mode. The root itself is the operator's grant:
the directories above it need not be open to the account.
"""

from __future__ import annotations

import base64
import contextlib
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpupool.agent.identity import PodIdentity
from gpupool.errors import InvalidInput
from gpupool.pods import SECRETS_DIR, PodMount

RESERVED = ("/proc", "/sys", "/dev", SECRETS_DIR)
"""What no mount may cover (as api/mounts.py's RESERVED_TARGETS)."""


@dataclass
class PodNamespace:
    """What the launcher helper sets up in the pod's mount namespace: (descriptor, target, read-only)
    per mount, and the secret files (path under /run/secrets -> bytes). Owns the descriptors."""

    mounts: list[tuple[int, str, bool]] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    """Each mount's source with symlinks resolved (the helper opens it again, and compares)."""
    files: Mapping[str, bytes] = field(default_factory=dict)

    def request(self) -> dict[str, object]:
        """The launcher request's "ns" (the descriptors travel beside it, in order)."""
        return {"mounts": [{"source": src, "target": t, "ro": ro}
                           for src, (_, t, ro) in zip(self.sources, self.mounts, strict=True)],
                "files": {p: base64.b64encode(v).decode() for p, v in self.files.items()}}

    def close(self) -> None:
        for fd, _, _ in self.mounts:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.mounts = []


def _under(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def _may_enter(info: os.stat_result, identity: PodIdentity) -> bool:
    if info.st_uid == identity.uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == identity.gid:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def open_source(mount: PodMount, identity: PodIdentity, pod_id: str) -> tuple[int, str]:
    """An O_PATH descriptor of the mount's source and its path resolved, inside its root; InvalidInput
    with the sentence for a source outside it (a symlink that leads out), missing, or behind a directory the
    pod's account may not enter."""
    what = f"Pod {pod_id}: mount {mount.source}"
    if not mount.root:
        raise InvalidInput(f"{what} is no longer inside a root its tenant may mount from (the pool's "
                           "configuration changed); resubmit without it.")
    root = os.path.realpath(mount.root)
    real = os.path.realpath(mount.source)
    if not _under(real, root):
        raise InvalidInput(f"{what} leads outside the allowed root {mount.root} (a symlink); mount a path "
                           "that lies inside it.")
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(root, flags | os.O_DIRECTORY)
    except OSError as exc:
        raise InvalidInput(f"{what}: its root {mount.root} cannot be opened on this node "
                           f"({exc.strerror}).") from None
    try:
        for part in [p for p in real[len(root):].split("/") if p]:
            if not _may_enter(os.fstat(fd), identity):
                raise InvalidInput(f"{what}: the pod's account may not enter a directory on the way to it; "
                                   "a mount grants no more than the file system does.")
            try:
                inner = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                raise InvalidInput(f"{what} does not exist on this node.") from None
            os.close(fd)
            fd = inner
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise InvalidInput(f"{what} changed while it was being mounted (a symlink appeared); "
                                   "it was not mounted.")
        return fd, real
    except BaseException:
        os.close(fd)
        raise


def prepare(mounts: Sequence[PodMount], files: Mapping[str, bytes], identity: PodIdentity | None,
            pod_id: str) -> PodNamespace | None:
    """The pod's namespace (None when it needs none); InvalidInput when this node cannot give it one
    (pods run as the agent's own user) or a mount is refused."""
    if not mounts and not files:
        return None
    if identity is None:
        raise InvalidInput(f"Pod {pod_id}: this node runs pods as its own user (it is not root), so it "
                           "cannot give them mounts or secret files; submit without --mount and file "
                           "secrets.")
    for mount in mounts:  # the API refused these; the node does not take them on trust
        parts = mount.target.split("/")[1:]
        plain = mount.target.startswith("/") and mount.target != "/" and all(
            p not in ("", ".", "..") for p in parts)
        if not plain or any(_under(mount.target, r) or _under(r, mount.target) for r in RESERVED):
            raise InvalidInput(f"Pod {pod_id}: mount target {mount.target!r} must be a plain absolute path "
                               f"outside {', '.join(RESERVED)}.")
    namespace = PodNamespace(files=dict(files))
    try:
        for mount in mounts:
            fd, real = open_source(mount, identity, pod_id)
            namespace.mounts.append((fd, mount.target, mount.read_only))
            namespace.sources.append(real)
    except BaseException:
        namespace.close()
        raise
    return namespace
