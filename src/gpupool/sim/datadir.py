"""Locate the shared data directory (real traces and fabric files) for benchmarks and dataset tests."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "GPUPOOL_DATA_DIR"


def data_dir() -> Path | None:
    """GPUPOOL_DATA_DIR if set and present, else ../shared/data beside the repository, else None."""
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env)
        return path if path.is_dir() else None
    repo_root = Path(__file__).resolve().parents[3]
    candidate = repo_root.parent / "shared" / "data"
    return candidate if candidate.is_dir() else None


def require_data_dir() -> Path:
    """Like data_dir() but raise a clear error naming the variable to set."""
    from gpupool.errors import InvalidInput

    path = data_dir()
    if path is None:
        raise InvalidInput(
            f"The shared data directory was not found; set {ENV_VAR} to the folder holding "
            "openb/, philly/, fgd-artifact/ and infiniband/."
        )
    return path
