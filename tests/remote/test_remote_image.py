"""Remote functions in a container image (`pool.function(image=...)`) through a real `gpupool up`: the
call's function and arguments reach a worker running on the image's own Python (not the node's), as
the tenant's account, and its result and exceptions come back; an image without the pool's Python,
or one the pool lacks, is refused when the function is called, in one sentence.

The image is built here from the node's system Python of the pool's minor version (its binary, the
shared libraries it and its extension modules load, and its standard library); nothing is pulled.
Needs root, crun and unshare, and that Python; elsewhere it skips with the reason.
"""

from __future__ import annotations

import io
import os
import pwd
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import gpupool
from factories import busybox_image_tar, static_busybox
from gpupool.agent import container
from gpupool.errors import InvalidInput
from server.upproc import UpProcess, cli

MINOR = f"{sys.version_info.major}.{sys.version_info.minor}"
SYSTEM_PYTHON = Path(f"/usr/bin/python{MINOR}")
STDLIB = Path(f"/usr/lib/python{MINOR}")
LEFT_OUT = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data",
            "site-packages", "dist-packages", "sitecustomize.py", "__phello__"}
BUILDABLE = SYSTEM_PYTHON.exists() and (STDLIB / "os.py").exists() and shutil.which("ldd") is not None
RUNTIME, WHY = container.detect()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="pods run as the tenants' accounts only under root"),
    pytest.mark.skipif(RUNTIME is None, reason=f"no container runtime here: {WHY}"),
    pytest.mark.skipif(not BUILDABLE, reason=(f"no system python{MINOR} with its standard library (and "
                                              "ldd) to build the image from (apt-get install python3)")),
    pytest.mark.skipif(static_busybox() is None,
                       reason="no static busybox (apt-get install busybox-static)"),
]


def _libraries(files: list[Path]) -> set[str]:
    """The shared libraries (and the loader) that `files` load, as ldd names them."""
    found: set[str] = set()
    for start in range(0, len(files), 200):
        out = subprocess.run(["ldd", *map(str, files[start:start + 200])], capture_output=True, text=True,
                             check=False).stdout
        found.update(re.findall(r"(/\S+) \(0x", out))
    return found


def python_image_tar() -> bytes:
    """A root filesystem with the system Python of the pool's minor version and nothing else."""
    dynload = sorted((STDLIB / "lib-dynload").glob("*.so"))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(os.path.realpath(SYSTEM_PYTHON), arcname=str(SYSTEM_PYTHON).lstrip("/"))
        for library in sorted(_libraries([SYSTEM_PYTHON, *dynload])):
            archive.add(os.path.realpath(library), arcname=library.lstrip("/"))

        def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
            return None if Path(info.name).name in LEFT_OUT else info

        archive.add(STDLIB, arcname=str(STDLIB).lstrip("/"), filter=keep)
        data = b"NAME=python-image\n"
        info = tarfile.TarInfo("etc/os-release")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@dataclass
class Pool:
    server: UpProcess
    token: str


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    images = Path(tempfile.mkdtemp(prefix="gpupool-images-", dir="/var/tmp"))  # the pods' accounts read it
    os.chmod(images, 0o711)
    base = tmp_path_factory.mktemp("remote-image")
    server = UpProcess(base / "data", ["--simulate", "1x2xH100"],
                       env={"GPUPOOL_IMAGE_DIR": str(images / "store")}).start()
    try:
        admin = {"GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.token()}
        for name, data in (("py", python_image_tar()), ("tiny", busybox_image_tar())):
            (base / f"{name}.tar").write_bytes(data)
            done = cli(["image", "import", str(base / f"{name}.tar"), name], admin, timeout_s=300)
            assert done.returncode == 0, done.stdout + done.stderr
        with server.client() as api:
            assert api.post("/tenants", json={"name": "fn-a"}).status_code == 201
            answer = api.post("/tokens", json={"tenant": "fn-a", "name": "t"})
            assert answer.status_code == 201, answer.text
        yield Pool(server, answer.json()["token"])
    finally:
        server.stop()
        shutil.rmtree(images, ignore_errors=True)


def where_am_i(numbers: list[int], scale: int) -> dict[str, object]:
    """Runs in the image: what it sees of itself, and a result made from its arguments."""
    import os
    import sys

    with open("/etc/os-release") as handle:
        release = handle.read().strip()
    return {"total": sum(numbers) * scale, "release": release, "uid": os.getuid(),
            "python": sys.executable, "node_tree": os.path.exists("/usr/lib/python3/dist-packages"),
            "version": list(sys.version_info[:2])}


def never_runs(x: int) -> int:
    return x


def fails_inside(text: str) -> None:
    raise ValueError(f"refused {text} in the image")


def test_a_function_runs_on_the_images_python_and_its_result_comes_back(pool: Pool) -> None:
    with gpupool.connect(pool.server.url, pool.token) as remote:
        fn = remote.function(image="py", timeout="5m")(where_am_i)
        out = fn.remote([1, 2, 3], scale=7).result(timeout=240)
        account = pwd.getpwnam(f"gpupool-{(pool.server.data_dir / 'pool-id').read_text().strip()}-fn-a")
        assert out == {"total": 42, "release": "NAME=python-image", "uid": account.pw_uid,
                       "python": str(SYSTEM_PYTHON), "node_tree": False,
                       "version": [sys.version_info.major, sys.version_info.minor]}
        with remote.session(image="py", timeout="5m") as session:  # a warm worker in the image, many calls
            assert [r["total"] for r in session.map(where_am_i, [[1], [2, 3]], [2, 2])] == [2, 10]
            with pytest.raises(ValueError, match="refused secrets in the image"):
                session.call(fails_inside, "secrets")


def test_an_image_without_the_pools_python_is_refused_in_one_sentence(pool: Pool) -> None:
    with gpupool.connect(pool.server.url, pool.token) as remote:
        with pytest.raises(InvalidInput) as refused:
            remote.function(image="tiny")(never_runs).remote(1)
        assert f"Image 'tiny' has no python{MINOR}" in refused.value.message
        assert "leave out image=" in refused.value.message
        with pytest.raises(InvalidInput, match="No image 'nope' in this pool"):
            remote.function(image="nope")(never_runs).remote(1)
        assert remote.client.workloads(name="fn-never_runs").total == 0  # nothing was submitted
