"""Input that is empty or cannot work is refused with one sentence saying what was wrong (exit 2),
not blamed on something else (the network, the port) and never silently taken for something else."""

from __future__ import annotations

import os
import subprocess

import pytest

from cli.cliproc import one_line_error
from cli_inproc import run_cli

NOWHERE = "http://127.0.0.1:9"  # never reached: the arguments are refused first


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUPOOL_URL": NOWHERE, "GPUPOOL_TOKEN": "gp_x", "COLUMNS": "200"}
    return run_cli(args, env, timeout_s=60)


@pytest.mark.parametrize("args", [
    ("exec", "w-0123456789ab", "--", ""),
    ("exec", "w-0123456789ab", "--", " ", "arg"),
    ("exec", "--pty", "w-0123456789ab", "--", ""),
    ("alloc", "--gpus", "1", "--", ""),
], ids=["exec", "exec-blank-with-args", "exec-pty", "alloc"])
def test_an_empty_command_is_said_to_be_empty(args: tuple[str, ...]) -> None:
    line = one_line_error(cli(*args), 2, "Error: the program after `--` is empty; give the command to run")
    assert "reach" not in line
