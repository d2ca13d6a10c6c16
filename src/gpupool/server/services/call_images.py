"""Remote functions in a container image (`@pool.function(image=...)`): the worker's command there.

The server's interpreter and import paths mean nothing inside an image, so the worker runs with the
image's own `python3.X` (the pool's minor version: pickles need it) and brings its code along: the
worker module with its two package stubs and cloudpickle, zipped and base64-encoded as the last
argument of a few lines of bootstrap that write it under the container's private /tmp and run it.
The command ends with `-m gpupool.remote.worker` (which the bootstrap ignores) as every worker's
does, so the launch gives the pod its API address and call token as for any function workload.
Nothing is mounted into the container and nothing is read from the node, so the same works on every
node that runs containers; the payloads and results still travel through the API, as for any worker.
"""

from __future__ import annotations

import base64
import functools
import io
import os
import sys
import zipfile
from pathlib import Path

from gpupool.errors import InvalidInput
from gpupool.server.runtime import Runtime

WORKER_MODULE = "gpupool.remote.worker"
POOL_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
PYTHON_DIRS = ("/usr/local/bin", "/usr/bin", "/bin")
"""Where the image's python3.X is looked for, in this order."""
BOOTSTRAP = (
    "import base64, os, runpy, sys, tempfile\n"
    "fd, path = tempfile.mkstemp(prefix='gpupool-worker-', suffix='.zip')\n"
    "os.write(fd, base64.b64decode(sys.argv[1])); os.close(fd)\n"
    "sys.path.insert(0, path); del sys.argv[1:]\n"
    "runpy.run_module('gpupool.remote.worker', run_name='__main__', alter_sys=True)\n"
)


@functools.cache
def worker_zip() -> str:
    """The worker's code (gpupool's two package stubs, its module, and cloudpickle), zipped, base64."""
    import cloudpickle

    package = Path(str(sys.modules["gpupool"].__file__)).parent
    pickler = Path(str(cloudpickle.__file__)).parent
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for part in ("__init__.py", "remote/__init__.py", "remote/worker.py"):
            archive.write(package / part, f"gpupool/{part}")
        for path in sorted(pickler.rglob("*.py")):
            archive.write(path, f"cloudpickle/{path.relative_to(pickler)}")
    return base64.b64encode(buffer.getvalue()).decode()


def image_python(rt: Runtime, image: str) -> str:
    """The path, inside `image`, of its python3.X (the pool's minor version); InvalidInput saying so
    when it has none (or the image does not exist)."""
    from gpupool.server.services.workloads import check_image

    check_image(rt, image)
    root = rt.images.rootfs(image)
    name = f"python{POOL_PYTHON}"
    if root is not None:
        for directory in PYTHON_DIRS:
            if os.path.lexists(root / directory.lstrip("/") / name):
                return f"{directory}/{name}"
    raise InvalidInput(f"Image {image!r} has no {name} (looked in {', '.join(PYTHON_DIRS)}), and a function "
                       f"runs in the pool's Python {POOL_PYTHON} (its pickles need that version): import an "
                       f"image that holds {name}, or leave out image=.", field="image")


def worker_command(rt: Runtime, image: str) -> list[str]:
    """The worker's command inside `image`."""
    return [image_python(rt, image), "-P", "-c", BOOTSTRAP, worker_zip(), "-m", WORKER_MODULE]
