"""Shared fixtures: the optional shared data directory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from gpupool.sim.datadir import data_dir


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data directory, or skip the test with the reason."""
    path = data_dir()
    if path is None:
        pytest.skip("shared data directory not found (set GPUPOOL_DATA_DIR to enable dataset tests)")
    return path
