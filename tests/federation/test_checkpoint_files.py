"""Checkpoint archives carried between pools: what the server (root) reads from and writes into a
directory the tenant controls. Links are never followed, names never leave the directory, sizes are
bounded, and a directory that already holds files is not replaced."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from gpupool.agent.checkpoints import CheckpointDirs, pack, unpack
from gpupool.errors import Conflict, InvalidInput, TooLarge


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            archive.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return out.getvalue()


def test_pack_keeps_files_and_directories_and_leaves_links_out(tmp_path: Path) -> None:
    source = tmp_path / "ck"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "weights").write_bytes(b"w" * 100)
    (source / ".checkpoint").touch()
    secret = tmp_path / "secret"
    secret.write_text("not the tenant's")
    (source / "leak").symlink_to(secret)  # a tenant's link to a file of the server's
    (source / "dirlink").symlink_to(tmp_path)
    data = pack(source, 1000)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        assert sorted(archive.getnames()) == [".checkpoint", "sub", "sub/weights"]
    target = tmp_path / "copy"
    target.mkdir()
    assert unpack(target, data, None, None) == 100
    assert (target / "sub" / "weights").read_bytes() == b"w" * 100
    with pytest.raises(TooLarge, match="more than"):
        pack(source, 99)


@pytest.mark.parametrize("name,kind", [("../escape", tarfile.REGTYPE), ("/abs", tarfile.REGTYPE),
                                       ("link", tarfile.SYMTYPE), ("dev", tarfile.CHRTYPE),
                                       ("a/./b", tarfile.REGTYPE)])
def test_unpack_refuses_what_is_not_a_plain_file_inside(tmp_path: Path, name: str, kind: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else ""
    target = tmp_path / "t"
    target.mkdir()
    with pytest.raises(InvalidInput, match="not a plain file"):
        unpack(target, _tar((info, b"x")), None, None)
    assert not (tmp_path / "escape").exists() and not list(target.iterdir())


def test_unpack_never_writes_through_a_link_already_there(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("kept")
    target = tmp_path / "t"
    target.mkdir()
    (target / "state").symlink_to(outside)
    with pytest.raises(FileExistsError):
        unpack(target, _tar((tarfile.TarInfo("state"), b"overwritten")), None, None)
    assert outside.read_text() == "kept"


def test_seed_fills_an_empty_directory_once(tmp_path: Path) -> None:
    dirs = CheckpointDirs(tmp_path / "scratch")
    source = tmp_path / "src"
    source.mkdir()
    (source / "state").write_text("step-7")
    data = pack(source, 1000)
    assert dirs.archive("w-1", 1000) is None  # none yet
    assert dirs.seed("w-1", None, data) == 6
    assert (dirs.path("w-1") / "state").read_text() == "step-7"
    assert os.stat(dirs.path("w-1")).st_mode & 0o777 == 0o700
    with pytest.raises(Conflict, match="already has a checkpoint"):
        dirs.seed("w-1", None, data)
    mark, again = dirs.archive("w-1", 1000) or (None, b"")
    assert mark is None and unpack(_fresh(tmp_path), again, None, None) == 6
    with pytest.raises(InvalidInput, match="not a tar"):
        dirs.seed("w-2", None, b"garbage" * 100)


def _fresh(tmp_path: Path) -> Path:
    path = tmp_path / "fresh"
    path.mkdir()
    return path


def test_pack_refuses_a_tree_deeper_than_it_reads(tmp_path: Path) -> None:
    source = tmp_path / "ck"
    (source / "/".join(["d"] * 70)).mkdir(parents=True)
    with pytest.raises(TooLarge, match="more than 64 deep"):
        pack(source, 1000)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file of another account takes root")
def test_pack_leaves_out_what_the_account_does_not_own(tmp_path: Path) -> None:
    """A hard link to another account's file (where fs.protected_hardlinks is off) is read by root
    like any file: only what the directory's owner (the pod's account) owns is packed."""
    source = tmp_path / "ck"
    source.mkdir()
    (source / "mine").write_text("weights")
    (source / "sub").mkdir()
    (source / "sub" / "mine").write_text("more")
    for path in (source, source / "mine", source / "sub", source / "sub" / "mine"):
        os.chown(path, 4321, 4321)
    (source / "theirs").write_text("root's")  # stands for a link to /etc/shadow: owned by root
    (source / "sub" / "theirs").write_text("root's")
    with tarfile.open(fileobj=io.BytesIO(pack(source, 1000))) as archive:
        assert sorted(archive.getnames()) == ["mine", "sub", "sub/mine"]
