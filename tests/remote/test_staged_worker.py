"""The worker's import tree staged for pods that cannot enter the server's own directories."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from gpupool.server.services import calls


def test_the_staged_worker_is_complete_and_readable_by_every_account() -> None:
    root = Path(calls._staged_worker())
    for path in (root, *root.rglob("*")):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), path
    # an interpreter that sees only the staged copy imports the worker and cloudpickle from it
    found = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(root)!r}); "
         "import gpupool.remote.worker as w, cloudpickle as c; print(w.__file__); print(c.__file__)"],
        capture_output=True, text=True, check=True, env={"PATH": os.environ.get("PATH", "")})
    assert all(line.startswith(str(root)) for line in found.stdout.split()), found.stdout
