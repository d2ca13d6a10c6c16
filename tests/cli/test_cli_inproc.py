"""tests/cli_inproc.run_cli answers as a child `python -m gpupool.cli.main` does: same exit status,
same stdout and stderr apart, the environment and working directory it is given (and only those),
and the test process's own environment, argv, cwd and streams put back afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_inproc import run_cli
from ports import free_port


def child(args: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpupool.cli.main", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def nowhere() -> dict[str, str]:
    """A clean environment whose server URL nothing answers."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    url = f"http://127.0.0.1:{free_port()}"
    return {**base, "GPUPOOL_URL": url, "GPUPOOL_TOKEN": "gp_x", "COLUMNS": "80"}


@pytest.mark.parametrize("args", [
    ["--help"],                       # help on stdout, exit 0
    ["ls", "--bogus"],                # a usage error: one sentence on stderr, exit 2
    ["show", "w-000000000000"],       # no server answers: the connection error and its exit status
    ["config", "check", "pool.yaml"],  # a file relative to the working directory, with a mistake in it
    ["config", "check", "absent.yaml"],
    ["submit", "--gpus", "x", "--", "true"],  # the fast path without typer
])
def test_in_process_answers_as_a_child_does(args: list[str], nowhere: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "pool.yaml").write_text("scheduling:\n  ordering: nada\n")
    inside = run_cli(args, nowhere, cwd=tmp_path)
    outside = child(args, nowhere, cwd=tmp_path)
    answer = (inside.returncode, inside.stdout, inside.stderr)
    assert answer == (outside.returncode, outside.stdout, outside.stderr)
    assert inside.stdout or inside.stderr  # each case says something


def test_only_the_given_environment_is_seen_and_everything_is_put_back(
        nowhere: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUPOOL_URL", "http://192.0.2.1:9")  # the test process's own: must not be used
    before = (dict(os.environ), list(sys.argv), os.getcwd(), sys.stdin, sys.stdout, sys.stderr)
    shown = run_cli(["show", "w-000000000000"], nowhere, cwd=tmp_path)
    assert nowhere["GPUPOOL_URL"].removeprefix("http://") in shown.stderr, shown.stderr
    assert "192.0.2.1" not in shown.stderr
    assert (dict(os.environ), list(sys.argv), os.getcwd(), sys.stdin, sys.stdout, sys.stderr) == before


def test_the_process_c_environment_is_left_alone(nowhere: dict[str, str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The command sees its environment through os.environ alone: no putenv or unsetenv, which can
    free what another thread's getenv is reading (a pytest worker died of a segfault in libc so)."""
    monkeypatch.setenv("GPUPOOL_URL", "http://192.0.2.1:9")
    calls: list[tuple[str, bytes]] = []
    monkeypatch.setattr(os, "putenv", lambda key, value: calls.append(("putenv", key)))
    monkeypatch.setattr(os, "unsetenv", lambda key: calls.append(("unsetenv", key)))
    before = dict(os.environ)
    shown = run_cli(["show", "w-000000000000"], {**nowhere, "GPUPOOL_TOKEN": "gp_y"})
    assert nowhere["GPUPOOL_URL"].removeprefix("http://") in shown.stderr, shown.stderr
    assert calls == []
    assert dict(os.environ) == before and os.environb[b"GPUPOOL_URL"] == b"http://192.0.2.1:9"


def test_typer_in_process_adds_no_variable_to_the_c_environment(nowhere: dict[str, str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Through typer's CliRunner, as tests beside a live server's thread run the CLI: typer's own
    writes only overwrite a variable the process has (tests/conftest.py sets it), never add or remove
    one, which can free what that thread's getenv is reading."""
    from typer.testing import CliRunner

    from gpupool.cli.main import app

    monkeypatch.setenv("GPUPOOL_URL", nowhere["GPUPOOL_URL"])
    monkeypatch.setenv("GPUPOOL_TOKEN", "gp_x")
    calls: list[tuple[str, bytes]] = []
    monkeypatch.setattr(os, "putenv", lambda key, value: calls.append(("putenv", key)))
    monkeypatch.setattr(os, "unsetenv", lambda key: calls.append(("unsetenv", key)))
    had = set(os.environb)
    result = CliRunner().invoke(app, ["show", "w-000000000000"])
    assert nowhere["GPUPOOL_URL"].removeprefix("http://") in result.output, result.output
    assert any(call[1] == b"PYDANTIC_DISABLE_PLUGINS" for call in calls), calls  # typer still writes it
    assert [call for call in calls if call[0] == "unsetenv" or call[1] not in had] == []


def test_the_test_process_environment_itself_may_be_given(nowhere: dict[str, str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPOOL_URL", nowhere["GPUPOOL_URL"])
    shown = run_cli(["show", "w-000000000000"], os.environ)
    assert nowhere["GPUPOOL_URL"].removeprefix("http://") in shown.stderr, shown.stderr
    assert os.environ["GPUPOOL_URL"] == nowhere["GPUPOOL_URL"]
