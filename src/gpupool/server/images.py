"""The pool's image store: tar archives imported into root filesystems that pods' containers run in.

Layout under the store's directory (`Settings.resolved_image_dir`):
- `names/NAME.json`: one image (api.images.ImageOut), replaced atomically by a new import;
- `rootfs/DIGEST/`: the root filesystem of an archive, by the sha256 of the archive's bytes (two
  names of one archive share it); 0755 and root's, read-only to every pod (the agent's crun runs
  as the pod's account and must read it), never written after its import;
- `incoming/`: uploads and extractions in progress (a crash leaves them; the next start clears it).

Every image is the pool's: an admin imports and removes them, every tenant's pods may run in them
and list them (they hold software, not data: a tenant's secrets go in its own files). An archive is
hostile until extracted: a member with an absolute name or a `..` is refused, and so is one that
would pass through a symbolic link (so nothing is ever written outside the image, whatever its links
say); device nodes and FIFOs are left out and set-uid/set-gid bits dropped (each listed in
`skipped`); owners are not kept (everything is the server's user's); links are kept as they are,
since they resolve inside the container's root only.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import lzma
import os
import secrets
import shutil
import stat
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from gpupool.api.images import IMAGE_NAME_PATTERN, IMAGE_NAME_RULE, ImageOut
from gpupool.errors import InvalidInput, NotFound

MOUNT_POINTS = ("proc", "sys", "dev", "tmp", "gpupool", "gpupool/home", "gpupool/work", "gpupool/checkpoint",
                "gpupool/mps", "gpupool/site")
"""Made in every image (agent/container.py binds a pod's own directories there), so a pod's start
never has to create anything in a root filesystem that other pods share."""
MAX_IMAGE_BYTES = 64 * 2**30
"""What one image may unpack to: a compressed layer cannot fill the server's disk."""
_CHUNK = 1 << 20
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Refused(Exception):
    """The archive is refused; the message says which member and why."""


def check_name(name: str) -> str:
    import re

    if not re.match(IMAGE_NAME_PATTERN, name):
        raise InvalidInput(f"Image name {name[:80]!r} is not valid: {IMAGE_NAME_RULE}.")
    return name


class _Tree:
    """Writes members under one directory without ever following a symbolic link on the way."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fd = os.open(root, _DIR_FLAGS)
        self.bytes = 0
        self.files = 0
        self.skipped: list[str] = []
        self.dir_modes: dict[tuple[str, ...], int] = {}

    def close(self) -> None:
        os.close(self.fd)

    @staticmethod
    def parts(name: str) -> tuple[str, ...]:
        if name.startswith("/"):
            raise _Refused(f"member {name[:200]!r} has an absolute name")
        parts = tuple(p for p in name.split("/") if p not in ("", "."))
        if ".." in parts:
            raise _Refused(f"member {name[:200]!r} names a '..'")
        return parts

    @contextlib.contextmanager
    def parent(self, parts: tuple[str, ...], name: str) -> Iterator[int]:
        """The directory holding parts[-1], opened component by component with O_NOFOLLOW (made
        when missing); refuses a component that is a symbolic link or not a directory."""
        fd = os.dup(self.fd)
        try:
            for part in parts[:-1]:
                try:
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    raise _Refused(f"member {name[:200]!r} passes through {part!r}, a symbolic link or not "
                                   "a directory") from None
                os.close(fd)
                fd = next_fd
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    def _clear(fd: int, leaf: str) -> None:
        """Remove what is at `leaf` (a later layer replaces it); a directory stays when `keep_dir`."""
        try:
            info = os.stat(leaf, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(leaf, dir_fd=fd)
        else:
            os.unlink(leaf, dir_fd=fd)

    def add(self, member: tarfile.TarInfo, data: IO[bytes] | None, *, layered: bool) -> None:
        parts = self.parts(member.name)
        if not parts:
            return
        name = member.name
        with self.parent(parts, name) as fd:
            leaf = parts[-1]
            if layered and leaf == ".wh..wh..opq":  # an opaque directory: the lower layers' entries go
                for entry in os.listdir(fd):
                    self._clear(fd, entry)
                return
            if layered and leaf.startswith(".wh."):
                self._clear(fd, leaf[4:])
                return
            if member.isdev() or member.isfifo():
                self.skipped.append(f"{name}: device node or FIFO left out (pods get their devices bound in)")
                return
            mode = member.mode & 0o7777
            if mode & 0o6000:
                self.skipped.append(f"{name}: set-uid/set-gid bit dropped")
                mode &= ~0o6000
            if member.isdir():
                try:
                    os.mkdir(leaf, 0o755, dir_fd=fd)
                except FileExistsError:
                    info = os.stat(leaf, dir_fd=fd, follow_symlinks=False)
                    if not stat.S_ISDIR(info.st_mode):
                        self._clear(fd, leaf)
                        os.mkdir(leaf, 0o755, dir_fd=fd)
                self.dir_modes[parts] = mode | 0o700  # applied at the end: the server must write into it
                self.files += 1
                return
            self._clear(fd, leaf)
            if member.issym():
                os.symlink(member.linkname, leaf, dir_fd=fd)
            elif member.islnk():
                target = self.parts(member.linkname)
                if not target:
                    raise _Refused(f"member {name[:200]!r} links to the image's root")
                try:
                    with self.parent(target, member.linkname) as target_fd:
                        info = os.stat(target[-1], dir_fd=target_fd, follow_symlinks=False)
                        if not stat.S_ISREG(info.st_mode):
                            raise _Refused(f"member {name[:200]!r} is a hard link to "
                                           f"{member.linkname[:200]!r}, which is not a file of the image")
                        os.link(target[-1], leaf, src_dir_fd=target_fd, dst_dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    raise _Refused(f"member {name[:200]!r} is a hard link to {member.linkname[:200]!r}, "
                                   "which is not in the image before it (a hard link follows the file it "
                                   "names)") from None
            elif member.isreg() and data is not None:
                out = os.open(leaf, _NEW_FILE, 0o600, dir_fd=fd)
                try:
                    while chunk := data.read(_CHUNK):
                        self.bytes += len(chunk)
                        if self.bytes > MAX_IMAGE_BYTES:
                            raise _Refused(f"it unpacks to more than {MAX_IMAGE_BYTES // 2**30} GiB")
                        os.write(out, chunk)
                    os.fchmod(out, mode & 0o1777 | 0o400)
                finally:
                    os.close(out)
            else:
                self.skipped.append(f"{name}: entry of an unknown kind left out")
                return
            self.files += 1

    def finish(self) -> None:
        """Apply the directories' modes (deepest first) and make the pods' mount points."""
        for parts in MOUNT_POINTS:
            split = tuple(parts.split("/"))
            with self.parent(split, parts) as fd:
                try:
                    os.mkdir(split[-1], 0o755, dir_fd=fd)
                except FileExistsError:
                    info = os.stat(split[-1], dir_fd=fd, follow_symlinks=False)
                    if split[0] == "gpupool" and not stat.S_ISDIR(info.st_mode):
                        raise _Refused(f"its /{parts} is not a directory (the pool binds pods' directories "
                                       "there)") from None
        for entry in _walk(self.root):  # private to the server until the rename: no one races it
            if entry.is_dir(follow_symlinks=False):
                relative = tuple(Path(entry.path).relative_to(self.root).parts)
                os.chmod(entry.path, self.dir_modes.get(relative, 0o755) & 0o1777 | 0o555)
        os.chmod(self.root, 0o755)


def _members(archive: tarfile.TarFile) -> Iterator[tuple[tarfile.TarInfo, IO[bytes] | None]]:
    for member in archive:
        yield member, archive.extractfile(member) if member.isreg() else None


def _oci_layers(archive: tarfile.TarFile) -> list[str] | None:
    """The layer blobs of an OCI image layout, lowest first; None when it is not one."""
    members = {m.name.removeprefix("./"): m for m in archive.getmembers()}
    if "oci-layout" not in members or "index.json" not in members:
        return None

    def read(name: str) -> Any:
        member = members.get(name)
        handle = archive.extractfile(member) if member is not None else None
        if handle is None:
            raise _Refused(f"its {name} is missing or not a file")
        return json.load(handle)

    def blob_name(digest: object) -> str:
        algorithm, _, value = str(digest).partition(":")
        if not algorithm.isalnum() or not value.isalnum():
            raise _Refused(f"it names a blob {str(digest)[:100]!r}, which is not a digest")
        return f"blobs/{algorithm}/{value}"

    try:
        manifests = read("index.json").get("manifests") or []
        if len(manifests) != 1:
            raise _Refused(f"its index.json lists {len(manifests)} manifests; export exactly one image")
        manifest = read(blob_name(manifests[0]["digest"]))
        layers = [blob_name(layer["digest"]) for layer in manifest.get("layers", [])]
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise _Refused(f"it looks like an OCI image layout, but its index or manifest is not readable "
                       f"({type(exc).__name__})") from None
    return [members[name].name if name in members else name for name in layers]


class ImageStore:
    """The store under `root`; safe to use from several threads (every change is a rename)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made = False

    def _make(self) -> None:
        """Create the store's directories (at the first import: listing an empty store writes
        nothing) and clear what an import cut short by a crash left in `incoming`."""
        if self._made:
            return
        for sub, mode in (("", 0o711), ("names", 0o700), ("rootfs", 0o711), ("incoming", 0o700)):
            path = self.root / sub if sub else self.root
            path.mkdir(parents=True, exist_ok=True, mode=mode)
            os.chmod(path, mode)
        for leftover in (self.root / "incoming").iterdir():
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
        self._made = True

    def spool(self) -> IO[bytes]:
        """An unnamed file in the store's `incoming` directory, for an upload on its way in."""
        self._make()
        return tempfile.TemporaryFile(dir=self.root / "incoming")

    def _record(self, name: str) -> Path:
        return self.root / "names" / f"{check_name(name)}.json"

    def get(self, name: str) -> ImageOut | None:
        try:
            return ImageOut.model_validate_json(self._record(name).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def all(self) -> list[ImageOut]:
        images = []
        for path in sorted((self.root / "names").glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                images.append(ImageOut.model_validate_json(path.read_text()))
        return images

    def names(self) -> list[str]:
        return [image.name for image in self.all()]

    def rootfs(self, name: str) -> Path | None:
        """The root filesystem of image `name`, None when there is no such image."""
        image = self.get(name)
        return None if image is None else self.root / "rootfs" / image.digest.removeprefix("sha256:")

    def import_archive(self, name: str, upload: IO[bytes]) -> ImageOut:
        """Read a tar (plain or compressed) from `upload`, unpack it safely and record it as `name`
        (replacing an image of that name). Raises InvalidInput with the reason for a refused one."""
        check_name(name)
        self._make()
        incoming = self.root / "incoming" / secrets.token_hex(8)
        incoming.mkdir(mode=0o700)
        try:
            archive_path = incoming / "archive"
            digest = hashlib.sha256()
            with open(archive_path, "wb") as out:
                while chunk := upload.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            hexdigest = digest.hexdigest()
            final = self.root / "rootfs" / hexdigest
            tree_dir = incoming / "rootfs"
            tree_dir.mkdir(mode=0o755)
            tree = _Tree(tree_dir)
            try:
                source = self._unpack(archive_path, tree)
                tree.finish()
            except _Refused as exc:
                raise InvalidInput(f"Cannot import image {name!r}: {exc}.") from None
            except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error, lzma.LZMAError) as exc:
                why = "it is not a readable tar archive" if isinstance(exc, tarfile.ReadError) else \
                    f"it is cut short or damaged ({type(exc).__name__})"
                raise InvalidInput(f"Cannot import image {name!r}: {why}; give a .tar (or .tar.gz) of a root "
                                   "filesystem or an OCI image layout.") from None
            finally:
                tree.close()
            size = sum(e.stat(follow_symlinks=False).st_size for e in _walk(tree_dir))
            with contextlib.suppress(FileExistsError, OSError):
                if not final.exists():
                    os.rename(tree_dir, final)
            image = ImageOut(name=name, digest=f"sha256:{hexdigest}", size_bytes=size, files=tree.files,
                             created_s=time.time(), source=source, skipped=tree.skipped[:100])
            record = incoming / "record.json"
            record.write_text(image.model_dump_json())
            os.replace(record, self._record(name))
            return image
        finally:
            shutil.rmtree(incoming, ignore_errors=True)

    @staticmethod
    def _unpack(archive_path: Path, tree: _Tree) -> str:
        with tarfile.open(archive_path, "r:*") as archive:
            layers = _oci_layers(archive)
            if layers is None:
                for member, data in _members(archive):
                    tree.add(member, data, layered=False)
                return "rootfs"
            for layer in layers:
                try:
                    member = archive.getmember(layer)
                except KeyError:
                    raise _Refused(f"its manifest names layer {layer[:200]!r}, which the archive does not "
                                   "hold; export the image again") from None
                handle = archive.extractfile(member) if member.isreg() else None  # never a link's target
                if handle is None:
                    raise _Refused(f"layer {layer[:200]} is not a file of the archive")
                with tarfile.open(fileobj=handle, mode="r|*") as stream:
                    for member in stream:
                        tree.add(member, stream.extractfile(member) if member.isreg() else None, layered=True)
            return "oci"

    def remove(self, name: str) -> ImageOut:
        """Forget image `name`; its root filesystem goes when no other name shares it. NotFound when
        there is no such image."""
        image = self.get(name)
        if image is None:
            raise NotFound(f"No image {name!r} in this pool; `gpupool image ls` lists them.")
        self._record(name).unlink(missing_ok=True)
        if all(other.digest != image.digest for other in self.all()):
            doomed = self.root / "incoming" / f"rm-{secrets.token_hex(8)}"
            with contextlib.suppress(OSError):
                os.rename(self.root / "rootfs" / image.digest.removeprefix("sha256:"), doomed)
                shutil.rmtree(doomed, ignore_errors=True)
        return image


def _walk(root: Path) -> Iterator[os.DirEntry[str]]:
    with os.scandir(root) as entries:
        for entry in entries:
            yield entry
            if entry.is_dir(follow_symlinks=False):
                yield from _walk(Path(entry.path))
