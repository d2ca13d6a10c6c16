"""The local provider's checkpoint directories and progress marks, and faults on real devices.

A workload's GPUPOOL_CHECKPOINT_DIR is private to its pods' account, the same for every attempt on
this node, closed to other tenants, and gone once the workload is forgotten. The tests that change
users need root (as `make test` runs in CI); elsewhere they skip with the reason.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from factories import pod_python
from gpupool.agent.checkpoints import CHECKPOINT_DIR_ENV, MARK, ROOT_NAME, CheckpointDirs
from gpupool.agent.probes.nvml import NvmlProbe, ProbedDevice, ProbeResult, ProbeStatus, XidEvent
from gpupool.errors import InvalidInput, ProviderError
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.base import Capability
from gpupool.providers.local import LocalProvider

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing a pod's user needs root")

PROBE = (pod_python(), "-c", """
import json, os, sys
directory = os.environ['GPUPOOL_CHECKPOINT_DIR']
info = os.stat(directory)
state = os.path.join(directory, 'state')
before = open(state).read() if os.path.exists(state) else None
if len(sys.argv) > 1:
    open(state, 'w').write(sys.argv[1])
print(json.dumps({'dir': directory, 'uid': os.getuid(), 'dir_uid': info.st_uid,
                  'dir_mode': oct(info.st_mode & 0o777), 'before': before, 'entries': os.listdir(directory)}))
""")

INTRUDER = (pod_python(), "-c", """
import json, os, sys
def attempt(action, *args):
    try:
        getattr(os, action)(*args)
        return 'allowed'
    except OSError as exc:
        return exc.__class__.__name__
victim, fresh = sys.argv[1], sys.argv[2]
own = os.environ['GPUPOOL_CHECKPOINT_DIR']
print(json.dumps({'list': attempt('listdir', victim), 'read': attempt('stat', os.path.join(victim, 'state')),
                  'list_parent': attempt('listdir', os.path.dirname(own)),
                  'claim': attempt('mkdir', fresh), 'move_own': attempt('rename', own, own + '-moved')}))
""")


def wait_final(provider: LocalProvider, pod_id: str, timeout_s: float = 20.0) -> PodStatus:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = {s.pod_id: s for s in provider.poll()}.get(pod_id)
        if status is not None and status.phase.is_final:
            return status
        time.sleep(0.02)
    raise AssertionError(f"{pod_id} did not finish")


def run(provider: LocalProvider, pod_id: str, workload_id: str, command: tuple[str, ...], *,
        tenant: str = "ckpt-a", env: dict[str, str] | None = None) -> PodStatus:
    provider.launch(PodLaunch(pod_id=pod_id, workload_id=workload_id, node="box", command=command,
                              tenant=tenant, env=env or {}))
    status = wait_final(provider, pod_id)
    assert status.phase is PodPhase.SUCCEEDED, (status, provider.read_log(pod_id).text)
    return status


def run_json(provider: LocalProvider, pod_id: str, workload_id: str, *args: str, tenant: str = "ckpt-a",
             env: dict[str, str] | None = None, command: tuple[str, ...] = PROBE) -> dict[str, object]:
    run(provider, pod_id, workload_id, (*command, *args), tenant=tenant, env=env)
    return dict(json.loads(provider.read_log(pod_id).text))


def sh(script: str) -> tuple[str, ...]:
    return ("sh", "-c", script)


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[LocalProvider]:
    p = LocalProvider(tmp_path / "agent", simulate="1xT4", node_name="box")
    yield p
    p.close(stop_pods=True)


@pytest.fixture
def workload(tmp_path: Path) -> str:
    """A workload id of this test's own (the scratch root is shared by the whole session)."""
    return f"w-{tmp_path.name}"


def test_the_directory_is_private_and_the_next_attempt_finds_it(provider: LocalProvider, workload: str,
                                                                pod_scratch_root: Path) -> None:
    first = run_json(provider, "ck-1", workload, "epoch 3")
    expected = pod_scratch_root / ROOT_NAME / workload
    assert first["dir"] == str(expected)
    assert first["dir_mode"] == "0o700" and first["dir_uid"] == first["uid"]
    assert first["before"] is None
    parent = os.lstat(expected.parent)
    assert (stat.S_IMODE(parent.st_mode), parent.st_uid) == (0o711, os.geteuid())
    # The next attempt (a new pod of the same workload) finds it; the user cannot redirect it.
    second = run_json(provider, "ck-2", workload, env={CHECKPOINT_DIR_ENV: "/tmp"})
    assert (second["dir"], second["before"], second["uid"]) == (str(expected), "epoch 3", first["uid"])
    other = run_json(provider, "ck-3", workload + "-other")
    assert other["dir"] != str(expected) and other["entries"] == []


def test_a_directory_left_more_open_is_closed_again(provider: LocalProvider, workload: str) -> None:
    first = run_json(provider, "ck-open-1", workload)
    os.chmod(str(first["dir"]), 0o755)
    assert run_json(provider, "ck-open-2", workload)["dir_mode"] == "0o700"


@needs_root
def test_another_tenants_pod_can_neither_reach_nor_claim_a_checkpoint_directory(
        provider: LocalProvider, workload: str) -> None:
    victim = run_json(provider, "ck-victim", workload, "tenant a's weights", tenant="ckpt-a")
    fresh = str(Path(str(victim["dir"])).parent / f"{workload}-next")
    seen = run_json(provider, "ck-intruder", workload + "-b", str(victim["dir"]), fresh, tenant="ckpt-b",
                    command=INTRUDER)
    assert seen == {"list": "PermissionError", "read": "PermissionError", "list_parent": "PermissionError",
                    "claim": "PermissionError", "move_own": "PermissionError"}
    # A later workload of tenant a with that id gets its own directory, not one tenant b made.
    later = run_json(provider, "ck-later", f"{workload}-next", tenant="ckpt-a")
    assert later["dir_uid"] == victim["uid"] and later["entries"] == []


def test_forget_workload_removes_the_directory_and_nothing_it_links_to(
        provider: LocalProvider, workload: str, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not the tenant's")
    run(provider, "ck-f1", workload, sh(f'cd "$GPUPOOL_CHECKPOINT_DIR" && mkdir -p a/b && echo x > a/b/f '
                                        f'&& ln -s {outside} link && ln -s {tmp_path} dirlink'))
    directory = provider.agent.checkpoints.path(workload)
    assert sorted(os.listdir(directory)) == ["a", "dirlink", "link"]
    provider.forget_workload(workload)
    assert not directory.exists()
    provider.forget_workload(workload)  # idempotent
    # Should the workload id come back, it starts empty; the old files go in the background.
    assert run_json(provider, "ck-f2", workload)["entries"] == []
    deadline = time.monotonic() + 10
    while any(e.name.startswith(f".gone-{workload}-") for e in directory.parent.iterdir()):
        assert time.monotonic() < deadline, "the forgotten directory was not deleted"
        time.sleep(0.02)
    assert outside.read_text() == "not the tenant's" and tmp_path.is_dir()


def test_checkpoint_s_is_the_marks_mtime(provider: LocalProvider, workload: str) -> None:
    assert provider.checkpoint_s(workload) is None
    run(provider, "ck-m1", workload, sh('touch -d @1700000000 "$GPUPOOL_CHECKPOINT_DIR/.checkpoint"'))
    assert provider.checkpoint_s(workload) == 1700000000.0
    run(provider, "ck-m2", workload, sh('touch -d @1700000600 "$GPUPOOL_CHECKPOINT_DIR/.checkpoint"'))
    assert provider.checkpoint_s(workload) == 1700000600.0
    assert provider.checkpoint_s("../" + workload) is None


@pytest.mark.parametrize("make", [
    'touch -d @1700000000 "$HOME/real" && ln -s "$HOME/real" "$GPUPOOL_CHECKPOINT_DIR/.checkpoint"',
    'mkdir "$GPUPOOL_CHECKPOINT_DIR/.checkpoint"',
    'mkfifo "$GPUPOOL_CHECKPOINT_DIR/.checkpoint"',
], ids=["symlink", "directory", "fifo"])
def test_a_mark_that_is_not_a_regular_file_is_refused(provider: LocalProvider, workload: str,
                                                      make: str) -> None:
    run(provider, "ck-bad", workload, sh(make))
    assert os.path.lexists(provider.agent.checkpoints.path(workload) / MARK)
    assert provider.checkpoint_s(workload) is None


def test_checkpoint_dirs_refuse_bad_ids_and_sweep_leftovers(tmp_path: Path) -> None:
    dirs = CheckpointDirs(tmp_path)
    for bad in ("", "../x", ".hidden", "a/b", "x" * 129):
        with pytest.raises(InvalidInput):
            dirs.path(bad)
        assert dirs.mark_s(bad) is None
        dirs.forget(bad)  # nothing to do, nothing raised
    left = dirs.root / ".gone-w-1-abcd"
    (left / "deep").mkdir(parents=True)
    (left / "deep" / "file").write_text("x")
    CheckpointDirs(tmp_path)  # the next agent start
    deadline = time.monotonic() + 10
    while left.exists():
        assert time.monotonic() < deadline, "a leftover was not swept"
        time.sleep(0.02)


class RealDevices(NvmlProbe):
    """One real (not simulated) device, as NVML would report it."""

    def probe(self) -> ProbeResult:
        device = ProbedDevice(index=0, uuid="GPU-real-0", name="NVIDIA H100 80GB HBM3", model="H100-SXM-80GB",
                              profile_known=True, memory_total_mib=81559, memory_used_mib=0,
                              utilization_pct=0, temperature_c=30, mig_enabled=False, processes=())
        return ProbeResult(ProbeStatus.OK, "1 NVIDIA device(s), driver 550.0.", (device,), "550.0")

    def poll_xid_events(self, timeout_ms: int = 0) -> list[XidEvent]:
        return []

    def close(self) -> None:
        pass


def test_faults_cannot_be_injected_into_real_devices(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "agent", node_name="gpu1", probe=RealDevices())
    try:
        assert "real" in provider.missing_capabilities()[Capability.FAULT_INJECTION]
        with pytest.raises(ProviderError, match="'GPU-real-0' of node 'gpu1' is a real device; faults can "
                                                "be injected only into simulated devices"):
            provider.inject_fault("gpu1", "GPU-real-0")
        with pytest.raises(ProviderError, match="'gpu1' is a real node"):
            provider.inject_fault("gpu1")
        with pytest.raises(ProviderError, match="real device"):
            provider.clear_fault("gpu1", "GPU-real-0")
        (node,) = provider.nodes()
        assert node.healthy and node.devices[0].healthy and provider.health_events() == []
    finally:
        provider.close()


def test_a_tree_of_any_depth_is_removed_and_the_remover_keeps_working(tmp_path: Path) -> None:
    """A pod may nest its checkpoint directories deeper than Python's recursion limit; the remover
    (which serves every tenant's checkpoints) removed nothing more once one such tree had ended it."""
    dirs = CheckpointDirs(tmp_path)
    deep = dirs.root / "deep-w"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1500):  # through descriptors: the whole path would pass PATH_MAX
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    other = dirs.root / "other-w"
    other.mkdir()
    (other / "weights").write_text("x")
    dirs.forget("deep-w")
    deadline = time.monotonic() + 20
    while any(dirs.root.glob(".gone-deep-w-*")):
        assert time.monotonic() < deadline, "the deep tree was not removed"
        time.sleep(0.05)
    dirs.forget("other-w")  # the remover still serves the next one
    while other.exists() or any(dirs.root.glob(".gone-other-w-*")):
        assert time.monotonic() < deadline, "the remover stopped after the deep tree"
        time.sleep(0.05)
