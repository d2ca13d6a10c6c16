"""Container images through a real `gpupool up` and the CLI: an admin imports a tiny busybox image, a
tenant's pods run in it as the tenant's account, see the image's root and their own directories only,
exit with their command's code, and end with a cancel; a name the pool lacks is refused at submit.

Needs root (pods run as the tenants' accounts), crun, util-linux's unshare and a static busybox
(`make test-deps` installs crun and busybox-static); elsewhere it skips with the reason.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from upproc import UpProcess, cli, until

from factories import busybox_image_tar, static_busybox
from gpupool.agent import container

RUNTIME, WHY = container.detect()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="pods run as the tenants' accounts only under root"),
    pytest.mark.skipif(RUNTIME is None, reason=f"no container runtime here: {WHY}"),
    pytest.mark.skipif(static_busybox() is None, reason="no static busybox (apt-get install busybox-static)"),
]
IMAGE_ROOT = {"bin", "dev", "etc", "gpupool", "proc", "sys", "tmp"}


@dataclass
class Pool:
    server: UpProcess
    admin: dict[str, str]
    tenant: dict[str, str]
    other: dict[str, str]
    archive: Path


def _marked(pod_id: str) -> list[int]:
    """The processes whose environment carries the pod's marker (the agent's leftover sweep finds them so)."""
    mark = f"GPUPOOL_POD_ID={pod_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _inside(pids: list[int]) -> list[int]:
    """The processes of `pids` whose root is the image's (its /etc/os-release says NAME=tiny)."""
    found = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/root/etc/os-release").read_text() == "NAME=tiny\n":
                found.append(pid)
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    images = Path(tempfile.mkdtemp(prefix="gpupool-images-", dir="/var/tmp"))  # the pods' accounts read it
    os.chmod(images, 0o711)
    base = tmp_path_factory.mktemp("images-live")
    archive = base / "tiny.tar"
    archive.write_bytes(busybox_image_tar())
    server = UpProcess(base / "data", ["--simulate", "1x2xH100"],
                       env={"GPUPOOL_IMAGE_DIR": str(images / "store")}).start()
    try:
        with server.client() as api:
            tokens = {}
            for tenant in ("img-a", "img-b"):
                assert api.post("/tenants", json={"name": tenant}).status_code == 201
                answer = api.post("/tokens", json={"tenant": tenant, "name": "t"})
                assert answer.status_code == 201, answer.text
                tokens[tenant] = answer.json()["token"]
        env = {"GPUPOOL_URL": server.url, "COLUMNS": "300"}
        admin = {**env, "GPUPOOL_TOKEN": server.token()}
        imported = cli(["image", "import", str(archive), "tiny"], admin)
        assert imported.returncode == 0 and "imported tiny" in imported.stdout, imported.stderr
        yield Pool(server, admin, {**env, "GPUPOOL_TOKEN": tokens["img-a"]},
                   {**env, "GPUPOOL_TOKEN": tokens["img-b"]}, archive)
    finally:
        server.stop()
        shutil.rmtree(images, ignore_errors=True)


def _account_uid(pool: Pool, tenant: str) -> int:
    pool_id = (pool.server.data_dir / "pool-id").read_text().strip()
    return pwd.getpwnam(f"gpupool-{pool_id}-{tenant}").pw_uid


def test_a_tenants_pod_runs_in_the_image_as_its_account(pool: Pool) -> None:
    listed = cli(["image", "ls", "-o", "name"], pool.tenant)  # every tenant may list them
    assert listed.returncode == 0 and listed.stdout.split() == ["tiny"], listed.stderr
    done = cli(["run", "--image", "tiny", "--", "sh", "-c", "id -u; cat /etc/os-release; ls /; pwd"],
               pool.tenant)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.split()
    assert lines[0] == str(_account_uid(pool, "img-a")) != "0"
    assert "NAME=tiny" in lines  # the image's, not the host's
    assert set(lines) >= IMAGE_ROOT and "usr" not in lines and "var" not in lines
    assert lines[-1] == "/gpupool/home"  # its private directory, bound in


def test_an_explicit_workdir_is_bound_in_and_the_pod_runs_there(pool: Pool) -> None:
    work = Path(tempfile.mkdtemp(prefix="gpupool-work-", dir="/var/tmp"))  # open to the pods' accounts
    try:
        os.chmod(work, 0o777)
        (work / "marker").write_text("from-the-node\n")
        done = cli(["run", "--image", "tiny", "--workdir", str(work), "--", "sh", "-c",
                    "pwd; cat marker; echo written > out"], pool.tenant)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.split() == ["/gpupool/work", "from-the-node"]
        assert (work / "out").read_text() == "written\n" and (work / "out").stat().st_uid == _account_uid(
            pool, "img-a")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_node_says_what_runs_its_containers(pool: Pool) -> None:
    names = cli(["node", "ls", "-o", "name"], pool.tenant).stdout.split()
    shown = cli(["node", "show", names[0]], pool.tenant)
    assert RUNTIME is not None and f"containers: crun {RUNTIME.version}" in shown.stdout, shown.stderr


def test_its_command_s_exit_code_is_the_pods(pool: Pool) -> None:
    done = cli(["run", "--image", "tiny", "--", "sh", "-c", "echo bye; exit 7"], pool.tenant)
    assert done.returncode == 7 and "bye" in done.stdout, done.stderr


def test_an_image_the_pool_lacks_is_refused_at_submit_with_those_it_has(pool: Pool) -> None:
    done = cli(["submit", "--image", "nope", "--", "true"], pool.tenant)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "No image 'nope' in this pool: it has tiny" in done.stderr and "Traceback" not in done.stderr


def test_only_the_admin_imports_or_removes(pool: Pool) -> None:
    for args in (["image", "import", str(pool.archive), "mine"], ["image", "rm", "tiny"]):
        done = cli(args, pool.tenant)
        assert done.returncode == 3 and "admin" in done.stderr.lower(), done.stdout + done.stderr
    assert cli(["image", "ls", "-o", "name"], pool.admin).stdout.split() == ["tiny"]


def test_a_pod_in_an_image_sees_neither_the_host_nor_another_tenants_files(pool: Pool) -> None:
    plant = 'echo other-secret-7f3 > "$HOME/secret"; echo "$HOME"'
    planted = cli(["run", "--", "sh", "-c", plant], pool.other)
    assert planted.returncode == 0, planted.stderr
    other_home = planted.stdout.strip()
    assert os.path.isabs(other_home) and Path(other_home, "secret").exists()
    probe = (f"cat {other_home}/secret; ls {pool.server.data_dir}; ls /var /usr /root; ls /gpupool/home; "
             "cat /etc/passwd; echo done")
    done = cli(["run", "--image", "tiny", "--", "sh", "-c", probe], pool.tenant)
    out = done.stdout + done.stderr
    assert "done" in out and "other-secret-7f3" not in out, out
    for path in (other_home, str(pool.server.data_dir), "/var", "/usr", "/root", "/etc/passwd"):
        assert any(path in line and "No such file or directory" in line for line in out.splitlines()), out
    assert "root:x:0" not in out  # the host's accounts are not there either


def test_a_cancel_ends_the_container(pool: Pool) -> None:
    command = ["sh", "-c", "sleep 600 & sleep 600; wait"]
    submitted = cli(["submit", "--image", "tiny", "--", *command], pool.tenant)
    assert submitted.returncode == 0, submitted.stderr
    workload = submitted.stdout.strip()
    with pool.server.client() as api:
        def pod_id() -> str:
            body = api.get(f"/workloads/{workload}").json()
            return str(body["pods"][0]["id"]) if body["status"] == "running" and body["pods"] else ""

        until(pod_id, 60, "the workload running")
        pod = pod_id()
        # crun and the container's first process carry the marker before it has pivoted into the image's
        # root, so count only processes that see the image's root: the sh and its two sleeps
        until(lambda: len(_inside(_marked(pod))) >= 3, 30,
              "the container's sh and two sleeps in the image's root")
        assert cli(["cancel", workload], pool.tenant).returncode == 0
        until(lambda: not _marked(pod), 60, "every process of the container ended")
        until(lambda: api.get(f"/workloads/{workload}").json()["status"] == "cancelled", 30, "cancelled")
