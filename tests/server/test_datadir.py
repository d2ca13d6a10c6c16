"""The data directory is closed at start-up: 0700 itself, its direct entries 0600 / 0700."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpupool.errors import InvalidInput
from gpupool.server.datadir import secure_data_dir


def test_an_open_data_dir_from_an_older_version_is_closed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "agents" / "local").mkdir(parents=True)
    data.chmod(0o755)
    (data / "agents").chmod(0o755)
    for name in ("admin-token", "gpupool.sqlite"):
        (data / name).write_text("x")
        (data / name).chmod(0o644)
    previous = os.umask(0o022)
    try:
        secure_data_dir(data)
        assert os.umask(0o022) == 0o077  # what the server creates from now on is private
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (data, data / "agents", data / "admin-token",
                                                        data / "gpupool.sqlite")}
    assert modes == {"data": 0o700, "agents": 0o700, "admin-token": 0o600, "gpupool.sqlite": 0o600}


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user owns needs root")
def test_a_data_dir_another_user_owns_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "theirs"
    data.mkdir()
    os.chown(data, 65534, 65534)
    previous = os.umask(0o022)
    try:
        with pytest.raises(InvalidInput, match="not a directory owned by this user"):
            secure_data_dir(data)
    finally:
        os.umask(previous)
