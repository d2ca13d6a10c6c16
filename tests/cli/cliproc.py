"""Run the real `gpupool` entry point as a process against a server (stdout is a pipe, not a TTY)."""

from __future__ import annotations

import os
import subprocess

from cli_inproc import run_cli


def gpupool(url: str, token: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUPOOL_URL": url, "GPUPOOL_TOKEN": token, "COLUMNS": "80"}
    return run_cli(args, env, timeout_s=timeout_s)


def one_line_error(result: subprocess.CompletedProcess[str], code: int, starts: str) -> str:
    """Assert exit `code`, nothing on stdout, and one line on stderr that starts with `starts`."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == "", result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(starts), lines[0]
    return lines[0]
