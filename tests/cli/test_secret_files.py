"""`gpupool secret create --from-file` reads at most one byte past what a secret may hold (the server's
MAX_SECRET_BYTES, its values together): a larger file, or one that never ends (/dev/zero), is one
sentence and exit 2 before anything is sent. The server here is unreachable on purpose: a value the
CLI accepts goes on to "Cannot reach" (exit 4), one it refuses never gets that far."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

from cli_inproc import run_cli
from gpupool.api.secrets import MAX_SECRET_BYTES

ENV = {**os.environ, "GPUPOOL_URL": "http://127.0.0.1:9", "GPUPOOL_TOKEN": "gp_x", "COLUMNS": "200"}
TOO_LARGE = "takes the secret past 262,144 bytes (256 KiB), the most a secret's values hold together"


def _file(tmp_path: Path, size: int) -> Path:
    path = tmp_path / f"value-{size}"
    path.write_bytes(b"x" * size)
    return path


def _refused(done: subprocess.CompletedProcess[str], said: str) -> None:
    assert done.returncode == 2 and said in done.stderr, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_file_one_byte_past_the_limit_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    big = _file(tmp_path, MAX_SECRET_BYTES + 1)
    _refused(run_cli(["secret", "create", "s", "--from-file", f"K={big}"], ENV), f"{big} {TOO_LARGE}")


def test_the_files_and_literals_count_together(tmp_path: Path) -> None:
    exact = _file(tmp_path, MAX_SECRET_BYTES)
    done = run_cli(["secret", "create", "s", "--from-file", f"K={exact}"], ENV)
    assert done.returncode == 4 and "Cannot reach" in done.stderr, done.stderr  # accepted, then sent
    done = run_cli(["secret", "create", "s", "--from-literal", "user=a", "--from-file", f"K={exact}"], ENV)
    _refused(done, f"{exact} {TOO_LARGE}")


def _small_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def test_a_file_that_never_ends_is_refused(tmp_path: Path) -> None:
    # a child with 1 GiB of address space: reading /dev/zero whole would fail there within a second
    done = subprocess.run([sys.executable, "-m", "gpupool.cli.main", "secret", "create", "s", "--from-file",
                           "K=/dev/zero"], env=ENV, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, preexec_fn=_small_address_space)
    _refused(done, f"/dev/zero {TOO_LARGE}")
