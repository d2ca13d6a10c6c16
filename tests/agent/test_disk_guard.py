"""The disk guard's choices (diskguard.py): its reserve, whom it blames for a nearly full disk, what it
ends and removes; and Runner.fail, the end it gives a blamed pod. The whole attack on a real pool is
tests/server/test_disk_guard_live.py."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpupool.agent import diskguard
from gpupool.agent.diskguard import DiskGuard, Pressure, Reserve, blame, owned_bytes, parse_reserve
from gpupool.agent.runner import Runner
from gpupool.errors import InvalidInput
from gpupool.pods import PodPhase

MALLORY, ALICE, MAPPED = 40_001, 40_002, 40_003
"""Uids no account has: root may own files by them."""
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="files owned by other uids are made only by root")


def test_the_reserve_is_a_size_a_share_or_off() -> None:
    default = parse_reserve("")
    assert default.bytes_for(10 * 2**30) == int(10 * 2**30 * 0.05)  # 5 % of a small disk
    assert default.bytes_for(2**40) == 2 * 2**30  # at most 2 GiB of a large one
    assert parse_reserve("512MiB").bytes_for(2**40) == 512 * 2**20
    assert parse_reserve("10%").bytes_for(2**40) == 2**40 // 10  # no cap when a share is chosen
    assert parse_reserve("off").off and parse_reserve("0").off
    for bad in ("lots", "-1GiB", "150%", "0%", "5 apples"):
        with pytest.raises(InvalidInput, match="GPUPOOL_DISK_RESERVE"):
            parse_reserve(bad)


def test_the_largest_owner_is_blamed_only_when_it_owns_the_reserve() -> None:
    assert blame({MALLORY: 900, ALICE: 100}, threshold=500) == (MALLORY, 900)
    assert blame({MALLORY: 400, ALICE: 100}, threshold=500) is None  # no pod account filled it
    assert blame({MALLORY: 700, ALICE: 700}, threshold=500) == (MALLORY, 700)  # ties: the lowest uid
    assert blame({}, threshold=0) is None
    assert blame({ALICE: 0}, threshold=0) is None


def _file(path: Path, size: int, uid: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.chown(path, uid, uid)
    return path


@root_only
def test_bytes_are_counted_for_each_files_owner_once(tmp_path: Path) -> None:
    big = _file(tmp_path / "a" / "big", 1 << 20, MALLORY)
    (tmp_path / "b").mkdir()
    os.chown(tmp_path / "b", ALICE, ALICE)  # alice's directory holds a link to mallory's file
    os.link(big, tmp_path / "b" / "link")
    _file(tmp_path / "b" / "own", 4096, ALICE)
    sparse = tmp_path / "a" / "sparse"
    with open(sparse, "wb") as handle:
        handle.truncate(1 << 30)  # a 1 GiB hole: what it takes on disk is what counts
    os.chown(sparse, MALLORY, MALLORY)
    device = os.stat(tmp_path).st_dev
    owned = owned_bytes([tmp_path, tmp_path / "a"], {MALLORY, ALICE}, device)  # a root twice: counted once
    assert (1 << 20) <= owned[MALLORY] < (1 << 20) + 65536  # the link is the file's owner's, once
    assert 4096 <= owned[ALICE] < 65536  # its directory and its own file, never mallory's bytes
    assert owned_bytes([tmp_path], {MALLORY}, device + 1) == {}  # another filesystem's is not looked at


class Fakes:
    """A DiskGuard's agent: the pods that run, and what it was asked to do."""

    def __init__(self, pods: dict[str, int]) -> None:
        self.pods = dict(pods)
        self.failed: list[tuple[str, str]] = []
        self.removals: list[int] = []

    def fail(self, pod_id: str, reason: str) -> None:
        self.failed.append((pod_id, reason))
        self.pods.pop(pod_id, None)

    def when_idle(self, uid: int, action: Callable[[], object]) -> bool:
        self.removals.append(uid)
        action()
        return True


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(diskguard, "pool_uids", lambda pool_id: {MALLORY: "gpupool-p1-mallory",
                                                                 ALICE: "gpupool-p1-alice"})
    root = tmp_path / "pods"
    root.mkdir()
    yield root


def _guard(scratch: Path, fakes: Fakes, shared: Path) -> DiskGuard:
    return DiskGuard([scratch], scratch_root=scratch, pool_id="p1", reserve=Reserve(size=1 << 20),
                     live_pods=lambda: list(fakes.pods.items()), fail=fakes.fail, drive=lambda: None,
                     when_idle=fakes.when_idle, shared=[shared], node="n1")


def _pressure(scratch: Path) -> Pressure:
    return Pressure(os.stat(scratch).st_dev, scratch, free=0, reserve=1 << 20)


@root_only
def test_the_pool_account_that_filled_the_disk_is_stopped_and_its_files_removed(scratch: Path,
                                                                                 tmp_path: Path) -> None:
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    _file(scratch / "pod-m" / "fill", 3 << 20, MALLORY)
    os.chown(scratch / "pod-m", MALLORY, MALLORY)
    _file(shared / "more", 1 << 20, MALLORY)  # in the host's shared places too
    _file(scratch / "pod-a" / "work", 1 << 19, ALICE)
    os.chown(scratch / "pod-a", ALICE, ALICE)
    os.link(scratch / "pod-a" / "work", shared / "alice-by-mallory")  # a link to alice's file
    fakes = Fakes({"m1": MALLORY, "m2": MALLORY, "a1": ALICE, "x1": MAPPED})
    guard = _guard(scratch, fakes, shared)
    chosen = guard.relieve(_pressure(scratch))
    assert chosen is not None and chosen[0] == MALLORY and chosen[1] >= 4 << 20
    assert sorted(pod for pod, _ in fakes.failed) == ["m1", "m2"]  # mallory's pods only
    reason = fakes.failed[0][1]
    assert reason.startswith("the node's disk is nearly full: this pod's account wrote 4") and "MiB" in reason
    assert "its files there are removed" in reason and "GPUPOOL_DISK_RESERVE" in reason
    assert fakes.removals == [MALLORY]
    assert not (scratch / "pod-m").exists() and not (shared / "more").exists()
    assert (scratch / "pod-a" / "work").exists() and (shared / "alice-by-mallory").exists()  # alice's
    assert set(fakes.pods) == {"a1", "x1"}
    assert guard.relieve(_pressure(scratch)) is None  # the next pass: no one left owns the reserve


@root_only
def test_a_mapped_account_is_stopped_but_its_files_are_kept(scratch: Path, tmp_path: Path) -> None:
    _file(scratch / "pod-x" / "fill", 2 << 20, MAPPED)  # --unix-user: maybe a person's account
    _file(scratch / "pod-a" / "work", 4096, ALICE)
    fakes = Fakes({"x1": MAPPED, "a1": ALICE})
    guard = _guard(scratch, fakes, tmp_path / "none")
    assert guard.relieve(_pressure(scratch)) == (MAPPED, pytest.approx(2 << 20, rel=0.1))
    assert [pod for pod, _ in fakes.failed] == ["x1"]
    assert "its files there are kept" in fakes.failed[0][1]
    assert fakes.removals == [] and (scratch / "pod-x" / "fill").exists()
    assert guard.relieve(_pressure(scratch)) is None  # no pod of it runs any more: not blamed again


@root_only
def test_nobody_is_blamed_for_a_disk_their_pods_did_not_fill(scratch: Path, tmp_path: Path) -> None:
    _file(scratch / "pod-a" / "work", 1 << 19, ALICE)  # less than the reserve
    _file(scratch / "the-admins-own", 8 << 20, 0)
    fakes = Fakes({"a1": ALICE})
    assert _guard(scratch, fakes, tmp_path).relieve(_pressure(scratch)) is None
    assert fakes.failed == [] and fakes.removals == []


def test_the_guard_does_nothing_above_the_reserve(scratch: Path, tmp_path: Path) -> None:
    fakes = Fakes({"a1": ALICE})
    guard = _guard(scratch, fakes, tmp_path)
    guard.reserve = Reserve(size=1)
    assert guard.pressure() == [] and guard.check() == []
    guard.reserve = Reserve(size=1 << 62)
    assert [p.path for p in guard.pressure()] == [scratch]


def test_fail_ends_a_running_pod_failed_with_the_reason_first(tmp_path: Path) -> None:
    runner = Runner(tmp_path)
    try:
        runner.start("p", ["sh", "-c", "trap '' TERM; sleep 60"], env={"PATH": "/usr/bin:/bin"})
        assert runner.fail("p", "the node's disk is nearly full: test")
        assert not runner.fail("p", "again")  # once
        record = runner.wait("p", 10)
        assert record.phase is PodPhase.FAILED and record.exit_code == 137
        assert record.message.startswith("the node's disk is nearly full: test; killed by SIGKILL")
        assert not runner.fail("p", "after its end")
        assert Runner(tmp_path).get("p").message == record.message  # saved: a restart knows it
    finally:
        runner.close(stop_pods=True, grace_s=0.5)
