"""Where a pod runs without --workdir: the permission walk the kernel would do for its account."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.agent.identity import PodIdentity
from gpupool.agent.workdir import choose, closed_because

STRANGER = PodIdentity(user="gpupool-team-a", uid=54321, gid=54321)


@pytest.fixture
def tree() -> Iterator[Path]:
    """/tmp/X/open/proj, every step open (pytest's own directories are closed to other accounts)."""
    root = Path(tempfile.mkdtemp(prefix="gpupool-workdir-"))
    os.chmod(root, 0o755)
    (root / "open" / "proj").mkdir(parents=True)  # open by the umask (tests/conftest.py's umask_per_module)
    try:
        yield root
    finally:
        for path in (root, *root.rglob("*")):
            if path.is_dir() and not path.is_symlink():
                os.chmod(path, 0o755)
        shutil.rmtree(root)


def test_an_open_path_is_entered(tree: Path) -> None:
    proj = tree / "open" / "proj"
    assert closed_because(str(proj), STRANGER) is None
    assert choose("", str(proj), STRANGER).path == str(proj)
    assert choose("", str(proj), STRANGER).note == f"workdir: {proj} (where submit ran)"


def test_a_closed_component_on_the_way_is_named(tree: Path) -> None:
    os.chmod(tree / "open", 0o750)
    proj = tree / "open" / "proj"
    assert closed_because(str(proj), STRANGER) == (
        f"{proj} is not open to account gpupool-team-a: {tree / 'open'} is closed to it")
    chosen = choose("", str(proj), STRANGER)
    assert chosen.path == "" and chosen.note.startswith("workdir: private directory (")


def test_group_and_owner_bits_count_for_the_account(tree: Path) -> None:
    os.chmod(tree / "open", 0o710)
    proj = str(tree / "open" / "proj")
    own_group = PodIdentity(user="mate", uid=54321, gid=os.stat(tree / "open").st_gid)
    assert closed_because(proj, own_group) is None
    os.chmod(tree / "open", 0o700)
    owner = PodIdentity(user="me", uid=os.getuid(), gid=54321)
    assert closed_because(proj, owner) is None


def test_links_are_followed_and_missing_paths_said(tree: Path) -> None:
    closed = tree / "closed"
    (closed / "inside").mkdir(parents=True)
    os.chmod(closed, 0o700)
    (tree / "open" / "link").symlink_to(closed / "inside")
    assert f"{closed} is closed to it" in str(closed_because(str(tree / "open" / "link"), STRANGER))
    missing = tree / "open" / "missing"
    assert closed_because(str(missing), STRANGER) == f"{missing} does not exist on this node"
    assert closed_because(str(missing), None) == f"{missing} does not exist on this node"


def test_an_explicit_workdir_is_taken_as_given(tree: Path) -> None:
    assert choose("/nowhere", str(tree), STRANGER).path == "/nowhere"
    assert choose("", "", STRANGER).path == ""
