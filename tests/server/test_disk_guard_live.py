"""A tenant's pod fills the disk the store lives on, tried on a real `gpupool up` whose data directory
and pods' scratch root share a small tmpfs. Without the node's disk guard the store can save
nothing: another tenant's submit and even the admin's cancel of the pod are answered 503. With it,
the hostile pod fails with the reason, its account's files there go, and the pool works again."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from upproc import UpProcess, until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="pods run as other accounts, and a tmpfs is "
                                 "mounted, only under root")]

DISK_MIB = 48
RESERVE = "8MiB"
FILL = "dd if=/dev/zero of=fill bs=1M 2>/dev/null; echo filled; sleep 600"


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A tmpfs of DISK_MIB MiB that every account may enter (not list): the data directory and the pods'
    scratch root go on it."""
    where = Path(tempfile.mkdtemp(prefix="gpupool-test-disk-"))
    os.chmod(where, 0o711)
    options = f"size={DISK_MIB}m,mode=0711"
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()})")
    try:
        (where / "pods").mkdir(mode=0o711)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)
        where.rmdir()


def _start(disk: Path, reserve: str, log: Path) -> UpProcess:
    env = {"GPUPOOL_SCRATCH_DIR": str(disk / "pods"), "GPUPOOL_POD_NETNS": "off",
           "GPUPOOL_DISK_RESERVE": reserve}
    return UpProcess(disk / "data", ["--simulate", "1x4xH100", "--placement", "first-fit"], env=env,
                     log_path=log).start()


def _tenants(server: UpProcess) -> dict[str, httpx.Client]:
    clients = {}
    with server.client() as api:
        for name in ("mallory", "alice"):
            assert api.post("/tenants", json={"name": name}).status_code == 201
            token = api.post("/tokens", json={"tenant": name, "name": "t"}).json()["token"]
            clients[name] = httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {token}"},
                                         timeout=30)
    return clients


def _fill_disk(mallory: httpx.Client) -> str:
    answer = mallory.post("/workloads", json={"command": ["sh", "-c", FILL], "resources": {"gpus": 1},
                                              "max_retries": 0})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _free(disk: Path) -> int:
    fs = os.statvfs(disk)
    return fs.f_bavail * fs.f_frsize


def _uid(server: UpProcess, tenant: str) -> int:
    import pwd

    pool_id = (server.data_dir / "pool-id").read_text().strip()
    return pwd.getpwnam(f"gpupool-{pool_id}-{tenant}").pw_uid


def _end(server: UpProcess, clients: dict[str, httpx.Client]) -> None:
    """Stop the server, and whatever of the tenants' still runs (the guard off: mallory's pod)."""
    from gpupool.agent.identity import pids_of

    for client in clients.values():
        client.close()
    server.stop()
    for tenant in clients:
        try:
            uid = _uid(server, tenant)
        except (KeyError, OSError):
            continue
        for pid in pids_of(uid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def _owned(root: Path, uid: int) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.lstat().st_uid == uid]


def test_without_the_guard_a_pod_that_fills_the_disk_stalls_the_pool(small_disk: Path,
                                                                      tmp_path: Path) -> None:
    server = _start(small_disk, "off", tmp_path / "server.log")
    clients = _tenants(server)
    try:
        wid = _fill_disk(clients["mallory"])
        until(lambda: _free(small_disk) < 1 << 20, 30, "the pod filled the disk")
        refused: list[int] = []

        def alice_refused() -> bool:  # the write-ahead log may hold a last row or two
            answer = clients["alice"].post("/workloads", json={"command": ["true"], "resources": {"gpus": 1}})
            refused.append(answer.status_code)
            return answer.status_code == 503 and "out of disk space" in answer.text

        until(alice_refused, 20, "another tenant's submit refused")
        with server.client() as api:
            cancel = api.post(f"/workloads/{wid}/cancel")
            assert cancel.status_code == 503 and "out of disk space" in cancel.text, cancel.text
            time.sleep(2)
            # not cancelled, and still filling the disk (its start may not even be stored: `admitted`)
            assert api.get(f"/workloads/{wid}").json()["status"] in ("admitted", "running")
    finally:
        _end(server, clients)


def test_the_guard_fails_the_pod_that_filled_the_disk_and_the_pool_works_again(small_disk: Path,
                                                                                 tmp_path: Path) -> None:
    server = _start(small_disk, RESERVE, tmp_path / "server.log")
    clients = _tenants(server)
    try:
        wid = _fill_disk(clients["mallory"])
        mallory = clients["mallory"]
        until(lambda: mallory.get(f"/workloads/{wid}").json()["status"] == "failed", 60,
              "the hostile workload failed")
        events = [e["message"] for e in mallory.get(f"/workloads/{wid}/events").json()]
        said = "the node's disk is nearly full: this pod's account wrote"
        assert any(said in m and "its files there are removed" in m for m in events), events
        uid = _uid(server, "mallory")
        assert _owned(small_disk / "pods", uid) == []  # its private directory and what it wrote there
        assert _free(small_disk) > 32 << 20
        spec = {"command": ["sh", "-c", "echo alice-ran; sleep 600"], "resources": {"gpus": 1}}
        answer = clients["alice"].post("/workloads", json=spec)
        assert answer.status_code == 201, answer.text
        aid = answer.json()["id"]
        until(lambda: "alice-ran" in clients["alice"].get(f"/workloads/{aid}/logs").json()["text"], 60,
              "another tenant's pod ran")
        with server.client() as api:
            assert api.post(f"/workloads/{aid}/cancel").status_code == 200  # the admin's writes work
            until(lambda: api.get(f"/workloads/{aid}").json()["status"] == "cancelled", 30, "cancelled")
    finally:
        _end(server, clients)
