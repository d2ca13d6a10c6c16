"""Input that is empty or cannot work is refused with one sentence saying what was wrong (exit 2),
not blamed on something else (the network, the port) and never silently taken for something else."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cli.cliproc import one_line_error
from cli_inproc import run_cli
from ports import free_ports

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


@pytest.mark.parametrize(("flags", "flag"), [
    (("--host", "203.0.113.7"), "--host"),
    (("--serve-host", "203.0.113.7", "--serve-port", "{port}"), "--serve-host"),
], ids=["host", "serve-host"])
def test_up_on_an_address_not_this_machines_blames_the_address(
        tmp_path: Path, flags: tuple[str, ...], flag: str) -> None:
    """203.0.113.7 (TEST-NET-3) is never this machine's: binding it fails at once, nothing is sent."""
    port, serve_port = free_ports(2)
    args = [f.format(port=serve_port) for f in flags]
    done = cli("up", "--data-dir", str(tmp_path / "d"), "--port", str(port), "--simulate", "1x1xH100",
               "--provider", "fake", *args)
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert done.returncode == 2 and len(errors) == 1, (done.returncode, done.stderr)
    assert errors[0].startswith("Error: Cannot listen on 203.0.113.7:"), errors[0]
    assert "203.0.113.7 is not an address of this machine" in errors[0]
    assert f"give {flag} 127.0.0.1 (this machine only), 0.0.0.0 (all its addresses)" in errors[0]
    assert "port" not in errors[0].split(":", 2)[2], errors[0]  # not blamed on the port


@pytest.mark.parametrize(("args", "flag"), [
    (("up", "--data-dir", ""), "--data-dir"),
    (("up", "--data-dir", "data", "--agent-dir", " "), "--agent-dir"),
    (("backup", "pool.tar", "--data-dir", ""), "--data-dir"),
    (("restore", "pool.tar", "--data-dir", ""), "--data-dir"),
], ids=["up", "up-agent-dir", "backup", "restore"])
def test_an_empty_directory_is_refused_not_taken_for_the_current_one(
        tmp_path: Path, args: tuple[str, ...], flag: str) -> None:
    env = {**os.environ, "GPUPOOL_URL": NOWHERE, "GPUPOOL_TOKEN": "gp_x", "COLUMNS": "200"}
    done = run_cli([*args, "--port", str(free_ports(1)[0])] if args[0] == "up" else args, env, cwd=tmp_path,
                   timeout_s=60)
    one_line_error(done, 2, f"Error: {flag} is empty; give a directory, or leave {flag} out for its default.")
    assert list(tmp_path.iterdir()) == []  # nothing was made in the current directory

