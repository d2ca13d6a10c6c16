"""Per-workload checkpoint directories on this node, and the progress mark a pod touches in one.

SCRATCH/.checkpoints (0711, the agent's) holds one directory per workload, named by its id, mode
0700 and owned by the pod's account: the same directory for every attempt of the workload on this
node (preemption, eviction, retry), so a requeued pod finds what the previous attempt saved. It goes
when the workload ends for good (forget). Workload ids are not secret: what keeps another tenant out
is the mode (0700, one account per tenant), and that no pod may write in the 0711 parent, so none can
rename, replace or pre-create a workload's directory. The parent's name starts with a dot, which no
pod id does, so no pod's private directory (SCRATCH/<pod id>) can ever be it.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import stat
import tarfile
import threading
from pathlib import Path

from gpupool.agent.identity import PodIdentity, make_private_dir, prepare_scratch_root, remove_tree
from gpupool.errors import Conflict, InvalidInput, TooLarge

CHECKPOINT_DIR_ENV = "GPUPOOL_CHECKPOINT_DIR"
MARK = ".checkpoint"
"""A pod touches $GPUPOOL_CHECKPOINT_DIR/.checkpoint after saving: its mtime is the progress mark."""
ROOT_NAME = ".checkpoints"
_GONE = ".gone-"
_WORKLOAD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

log = logging.getLogger("gpupool.agent")


class CheckpointDirs:
    """The checkpoint directories under one scratch root. Thread-safe; every method returns promptly
    (a directory's files are deleted by a background thread)."""

    def __init__(self, scratch_root: Path) -> None:
        self.root = prepare_scratch_root(Path(scratch_root) / ROOT_NAME)
        self._lock = threading.Lock()
        self._doomed: list[Path] = []
        self._remover: threading.Thread | None = None
        for entry in sorted(self.root.glob(_GONE + "*")):  # left by a removal cut short
            self._remove_soon(entry)

    def path(self, workload_id: str) -> Path:
        """Where the workload's directory is (whether or not it exists). InvalidInput for an id that
        cannot name a directory."""
        if not _WORKLOAD_ID.match(workload_id):
            raise InvalidInput(f"Workload id {workload_id!r} must be 1-128 letters, digits, '.', '_' or "
                               "'-', starting with a letter or digit.")
        return self.root / workload_id

    def prepare(self, workload_id: str, identity: PodIdentity | None) -> Path:
        """The workload's directory, created or reused, 0700 and owned by `identity` (None: this
        process's user)."""
        self.path(workload_id)
        return make_private_dir(self.root, workload_id, identity)

    def mark_s(self, workload_id: str) -> float | None:
        """The mtime (epoch seconds) of the workload's .checkpoint, or None when there is none. The
        tenant controls the directory: the mark is read without following a link, and anything but a
        regular file is refused (None). Never raises."""
        if not _WORKLOAD_ID.match(workload_id):
            return None
        try:
            info = os.lstat(self.root / workload_id / MARK)
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode):
            log.warning("ignoring the checkpoint mark of workload %s: it is not a regular file", workload_id)
            return None
        return info.st_mtime

    def archive(self, workload_id: str, max_bytes: int) -> tuple[float | None, bytes] | None:
        """The workload's directory as a tar (`pack`) and its mark; None when it has no directory or
        an empty one. TooLarge past `max_bytes`."""
        directory = self.path(workload_id)
        try:
            if not any(os.scandir(directory)):
                return None
            return self.mark_s(workload_id), pack(directory, max_bytes)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def seed(self, workload_id: str, identity: PodIdentity | None, data: bytes) -> int:
        """Fill the workload's directory, before its first pod starts, with a checkpoint made elsewhere
        (`unpack`; a federation hub carries one to the member that runs the work next). Conflict when
        the directory already holds files. Returns the bytes written."""
        directory = self.prepare(workload_id, identity)
        if any(os.scandir(directory)):
            raise Conflict(f"Workload {workload_id} already has a checkpoint here; it is not replaced.")
        return unpack(directory, data, identity.uid if identity else None, identity.gid if identity else None)

    def forget(self, workload_id: str) -> None:
        """The workload ended for good: its directory disappears now (renamed aside, so the id is free
        at once) and its files are deleted in the background. Idempotent."""
        if not _WORKLOAD_ID.match(workload_id):
            return
        try:
            os.rmdir(self.root / workload_id)  # the usual case: it never checkpointed (one call)
            return
        except FileNotFoundError:
            return
        except OSError:  # it holds files: renamed aside, deleted in the background
            pass
        aside = self.root / f"{_GONE}{workload_id}-{secrets.token_hex(4)}"
        try:
            os.rename(self.root / workload_id, aside)
        except FileNotFoundError:
            return
        self._remove_soon(aside)

    def _remove_soon(self, path: Path) -> None:
        with self._lock:
            self._doomed.append(path)
            if self._remover is None:
                self._remover = threading.Thread(target=self._remove_all, name="gpupool-checkpoints",
                                                 daemon=True)
                self._remover.start()

    def _remove_all(self) -> None:
        while True:
            with self._lock:
                if not self._doomed:
                    self._remover = None
                    return
                path = self._doomed.pop()
            # never follows a link the tenant made, and takes a tree of any depth (rmtree's recursion
            # failed past about a thousand levels, which ended this thread for every tenant); what a
            # pod still writes meanwhile is left for the next agent start.
            remove_tree(path)


MAX_ARCHIVE_BYTES = 256 * 2**20
"""The most a checkpoint archive may hold (what a federation hub carries to another member)."""
_MAX_ENTRIES = 10_000
_MAX_DEPTH = 64
"""The deepest a checkpoint's directories may nest (`pack` reads them recursively)."""


def pack(directory: Path, max_bytes: int) -> bytes:
    """`directory`'s regular files and subdirectories as an uncompressed tar, read through directory
    descriptors without following any link (the tenant controls the directory, and this runs as
    root): links, devices and sockets are left out, and so is whatever the directory's owner (the
    pod's account) does not own, such as a hard link to another account's file. TooLarge past
    `max_bytes` of file contents, 10,000 entries or 64 levels; FileNotFoundError when the directory
    is gone."""
    import io

    out = io.BytesIO()
    total = 0
    entries = 0
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        top = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        owner = os.fstat(top).st_uid

        def walk(fd: int, prefix: str, depth: int = 1) -> None:
            nonlocal total, entries
            if depth > _MAX_DEPTH:
                raise TooLarge(f"The checkpoint nests directories more than {_MAX_DEPTH} deep; keep "
                               "$GPUPOOL_CHECKPOINT_DIR's tree shallower.")
            for name in sorted(os.listdir(fd)):
                entries += 1
                if entries > _MAX_ENTRIES:
                    raise TooLarge(f"The checkpoint holds more than {_MAX_ENTRIES} files; keep fewer, larger "
                                   "files in $GPUPOOL_CHECKPOINT_DIR.")
                try:
                    child = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
                except OSError:  # a link (ELOOP), or gone meanwhile: not part of the checkpoint
                    continue
                try:
                    info = os.fstat(child)
                    if info.st_uid != owner:  # not the account's (a hard link to another's file)
                        continue
                    member = tarfile.TarInfo(prefix + name)
                    member.mtime = int(info.st_mtime)
                    member.mode = stat.S_IMODE(info.st_mode) & 0o755
                    if stat.S_ISDIR(info.st_mode):
                        member.type = tarfile.DIRTYPE
                        archive.addfile(member)
                        walk(child, prefix + name + "/", depth + 1)
                    elif stat.S_ISREG(info.st_mode):
                        total += info.st_size
                        if total > max_bytes:
                            raise TooLarge(f"The checkpoint holds more than {max_bytes / 2**20:g} MiB, "
                                           "the most that is carried between pools.")
                        with os.fdopen(child, "rb", closefd=False) as data:
                            content = data.read(info.st_size + 1)[:info.st_size]
                        member.size = len(content)
                        archive.addfile(member, io.BytesIO(content))
                finally:
                    os.close(child)

        try:
            walk(top, "")
        finally:
            os.close(top)
    return out.getvalue()


def unpack(directory: Path, data: bytes, uid: int | None, gid: int | None) -> int:
    """Write the tar `data` (from `pack`) into the empty `directory`: regular files and directories
    only, created with O_EXCL under directory descriptors without following links, owned by
    uid:gid (None: left as this process's). InvalidInput for anything else in the archive, a name
    that leaves the directory, or a name that appears twice (all checked before anything is written).
    When writing fails part way, what this call wrote is removed again, so the directory is left as
    it was. Returns the bytes written."""
    import io

    if len(data) > MAX_ARCHIVE_BYTES + 2**20:
        raise TooLarge(f"A checkpoint archive may hold at most {MAX_ARCHIVE_BYTES / 2**20:g} MiB.")
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            members = archive.getmembers()
            if len(members) > _MAX_ENTRIES:
                raise TooLarge(f"A checkpoint archive may hold at most {_MAX_ENTRIES} entries.")
            for member in members:
                _check_member(member)
            _check_names(members)
            return _write_members(directory, archive, members, uid, gid)
    except (tarfile.TarError, EOFError) as exc:
        raise InvalidInput(f"The checkpoint is not a tar archive ({exc}); send what GET "
                           "/workloads/ID/checkpoint answered.") from None


def _check_member(member: tarfile.TarInfo) -> None:
    parts = member.name.split("/")
    if (member.name.startswith("/") or any(p in ("", ".", "..") for p in parts)
            or not (member.isfile() or member.isdir())):
        raise InvalidInput(f"The checkpoint archive holds {member.name[:100]!r}, which is not a plain file "
                           "or directory inside it; send what GET /workloads/ID/checkpoint answered.")


def _check_names(members: list[tarfile.TarInfo]) -> None:
    """InvalidInput when a name appears twice (a file, a directory, or one of each) or comes before
    the directory that holds it: either would fail part way through writing."""
    directories: set[str] = {""}
    seen: set[str] = set()
    for member in members:
        if member.name in seen:
            raise InvalidInput(f"The checkpoint archive holds {member.name[:100]!r} more than once; each "
                               "file and directory may appear only once. Make the tar again "
                               "without the repeat, or send what GET /workloads/ID/checkpoint answered.")
        seen.add(member.name)
        if member.name.rpartition("/")[0] not in directories:
            raise InvalidInput(f"The checkpoint archive names {member.name[:100]!r} before its "
                               "directory; make the tar from the directory itself (tar -C DIR -cf "
                               "- .), which lists each directory before what it holds.")
        if member.isdir():
            directories.add(member.name)


def _write_members(directory: Path, archive: tarfile.TarFile, members: list[tarfile.TarInfo],
                   uid: int | None, gid: int | None) -> int:
    top = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    opened: dict[str, int] = {"": top}
    created: list[tuple[int, str, bool]] = []  # (parent fd, name, is a directory), in creation order
    written = 0
    try:
        for member in members:
            parts = member.name.split("/")
            parent = opened["/".join(parts[:-1])]  # listed before what it holds (`_check_names`)
            if member.isdir():
                os.mkdir(parts[-1], 0o700, dir_fd=parent)
                created.append((parent, parts[-1], True))
                fd = os.open(parts[-1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
                opened[member.name] = fd
            else:
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                             dir_fd=parent)
                created.append((parent, parts[-1], False))
                try:
                    source = archive.extractfile(member)
                    content = source.read() if source is not None else b""
                    with os.fdopen(fd, "wb", closefd=False) as out:
                        out.write(content)
                    written += len(content)
                    os.utime(fd, (member.mtime, member.mtime))
                finally:
                    if uid is not None and gid is not None:
                        os.fchown(fd, uid, gid)
                    os.close(fd)
                continue
            if uid is not None and gid is not None:
                os.fchown(fd, uid, gid)
    except BaseException:
        _remove_created(created)
        raise
    finally:
        for fd in opened.values():
            os.close(fd)
    return written


def _remove_created(created: list[tuple[int, str, bool]]) -> None:
    """Undo a write cut short: remove what it created, newest first (so a directory is empty when
    its turn comes), each by name under its parent's descriptor without following a link. What
    cannot be removed is logged and left."""
    for parent, name, is_dir in reversed(created):
        try:
            if is_dir:
                os.rmdir(name, dir_fd=parent)
            else:
                os.unlink(name, dir_fd=parent)
        except OSError as exc:
            log.warning("could not remove %r left by a checkpoint cut short: %s", name, exc)
