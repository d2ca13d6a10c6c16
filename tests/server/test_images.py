"""The image store: archives unpacked without trusting them, OCI layouts applied layer by layer,
names replaced and removed; every refusal is one sentence naming the member and why."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from gpupool.errors import InvalidInput, NotFound
from gpupool.server.images import MOUNT_POINTS, ImageStore


def _tar(*members: tuple[tarfile.TarInfo, bytes | None], gz: bool = False) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gz else "w") as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _file(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, data


def _kind(name: str, kind: bytes, linkname: str = "", mode: int = 0o755) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    return info, None


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "images")


def test_a_rootfs_archive_becomes_a_readable_tree_with_the_pods_mount_points(store: ImageStore) -> None:
    archive = _tar(_kind("./bin", tarfile.DIRTYPE), _file("./bin/tool", b"#!/bin/sh\n", 0o755),
                   _kind("./bin/sh", tarfile.SYMTYPE, "/bin/tool"), _file("etc/os-release", b"NAME=tiny\n"),
                   _kind("etc/hard", tarfile.LNKTYPE, "etc/os-release"))
    image = store.import_archive("tiny", io.BytesIO(archive))
    root = store.rootfs("tiny")
    assert root is not None
    assert image.digest == "sha256:" + hashlib.sha256(archive).hexdigest() and image.source == "rootfs"
    assert (root / "etc/os-release").read_text() == "NAME=tiny\n"
    assert os.readlink(root / "bin/sh") == "/bin/tool"  # kept as is: it resolves inside the container only
    assert (root / "etc/hard").stat().st_ino == (root / "etc/os-release").stat().st_ino
    assert stat.S_IMODE((root / "bin/tool").stat().st_mode) == 0o755
    for point in MOUNT_POINTS:  # pods' directories are bound there; nothing is made at a pod's start
        assert (root / point).is_dir() and stat.S_IMODE((root / point).stat().st_mode) == 0o755, point
    assert stat.S_IMODE(root.stat().st_mode) == 0o755  # the pods' accounts read it (rootless crun)
    assert [i.name for i in store.all()] == ["tiny"] and store.names() == ["tiny"]


@pytest.mark.parametrize(("member", "why"), [
    (_file("/etc/cron.d/evil"), "has an absolute name"),
    (_file("../../outside"), "names a '..'"),
    (_file("etc/../../outside"), "names a '..'"),
])
def test_a_member_that_names_a_place_outside_the_image_refuses_the_archive(
        store: ImageStore, tmp_path: Path, member: tuple[tarfile.TarInfo, bytes], why: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        store.import_archive("evil", io.BytesIO(_tar(_file("ok"), member)))
    assert why in refused.value.message and "Cannot import image 'evil'" in refused.value.message
    assert store.get("evil") is None and not (tmp_path / "outside").exists()
    assert list((store.root / "rootfs").iterdir()) == [] and list((store.root / "incoming").iterdir()) == []


def test_a_member_written_through_a_symbolic_link_is_refused_and_nothing_lands_outside(
        store: ImageStore, tmp_path: Path) -> None:
    """Tar-slip through a link: `etc` -> the data directory's parent, then `etc/planted`."""
    victim = tmp_path / "victim"
    victim.mkdir()
    for link_target in (str(victim), "../../../victim"):
        archive = _tar(_kind("etc", tarfile.SYMTYPE, link_target), _file("etc/planted", b"owned"))
        with pytest.raises(InvalidInput, match="passes through 'etc', a symbolic link"):
            store.import_archive("slip", io.BytesIO(archive))
        assert list(victim.iterdir()) == []
    hard = _tar(_kind("link", tarfile.LNKTYPE, "/etc/passwd"))
    with pytest.raises(InvalidInput, match="absolute name"):
        store.import_archive("slip", io.BytesIO(hard))


def test_device_nodes_are_left_out_and_set_uid_bits_dropped_and_both_are_listed(store: ImageStore) -> None:
    archive = _tar(_kind("dev/sda", tarfile.CHRTYPE), _kind("fifo", tarfile.FIFOTYPE),
                   _file("bin/su", b"elf", 0o4755), _file("bin/wall", b"elf", 0o2755))
    image = store.import_archive("devs", io.BytesIO(archive))
    root = store.rootfs("devs")
    assert root is not None
    assert not (root / "fifo").exists() and list((root / "dev").iterdir()) == []
    assert stat.S_IMODE((root / "bin/su").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "bin/wall").stat().st_mode) == 0o755
    assert len(image.skipped) == 4 and any("set-uid" in line for line in image.skipped), image.skipped


def test_an_image_whose_mount_point_is_a_link_is_refused(store: ImageStore) -> None:
    with pytest.raises(InvalidInput, match="gpupool"):
        store.import_archive("bad", io.BytesIO(_tar(_kind("gpupool", tarfile.SYMTYPE, "/etc"))))


def test_an_oci_layout_applies_its_layers_in_order_with_whiteouts(store: ImageStore) -> None:
    lower = _tar(_file("etc/keep", b"1"), _file("etc/gone", b"2"), _file("opt/a/old", b"3"), gz=True)
    upper = _tar(_file("etc/.wh.gone", b""), _file("opt/a/.wh..wh..opq", b""), _file("opt/a/new", b"4"),
                 _file("etc/keep", b"5"))
    blobs = {hashlib.sha256(b).hexdigest(): b for b in (lower, upper)}
    manifest = json.dumps({"layers": [{"digest": f"sha256:{hashlib.sha256(b).hexdigest()}"}
                                      for b in (lower, upper)]}).encode()
    blobs[hashlib.sha256(manifest).hexdigest()] = manifest
    index = json.dumps({"manifests": [{"digest": f"sha256:{hashlib.sha256(manifest).hexdigest()}"}]}).encode()
    archive = _tar(_file("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'), _file("index.json", index),
                   *(_file(f"blobs/sha256/{d}", b) for d, b in blobs.items()))
    image = store.import_archive("layered", io.BytesIO(archive))
    root = store.rootfs("layered")
    assert root is not None and image.source == "oci"
    assert (root / "etc/keep").read_text() == "5" and not (root / "etc/gone").exists()
    assert sorted(p.name for p in (root / "opt/a").iterdir()) == ["new"]


def test_not_a_tar_is_refused_with_what_to_give(store: ImageStore) -> None:
    with pytest.raises(InvalidInput, match=r"not a readable tar archive.*root filesystem or an OCI"):
        store.import_archive("junk", io.BytesIO(b"not a tar at all" * 100))


def test_names_are_checked_replaced_and_removed(store: ImageStore) -> None:
    with pytest.raises(InvalidInput, match="is not valid"):
        store.import_archive("../up", io.BytesIO(_tar(_file("a"))))
    first = store.import_archive("app", io.BytesIO(_tar(_file("v", b"1"))))
    store.import_archive("same", io.BytesIO(_tar(_file("v", b"1"))))  # one archive: one tree, two names
    second = store.import_archive("app", io.BytesIO(_tar(_file("v", b"2"))))
    assert first.digest != second.digest and store.get("app") == second
    old = store.root / "rootfs" / first.digest.removeprefix("sha256:")
    assert store.rootfs("same") == old
    store.remove("same")
    assert not old.exists() and store.get("same") is None  # no name holds that tree any more
    with pytest.raises(NotFound, match="No image 'same'"):
        store.remove("same")
