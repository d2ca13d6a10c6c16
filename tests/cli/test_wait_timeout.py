"""`gpupool wait --timeout S` gives up within about S seconds while the server is down or silent, rather
than riding out the whole --reconnect budget (60 s by default) or a request's own 30 s."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from cli_inproc import run_cli
from ports import free_port

TIMEOUT_S = 2
SLACK_S = 10


def wait(url: str) -> tuple[subprocess.CompletedProcess[str], float]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    started = time.monotonic()
    done = run_cli(["wait", "w-0123456789ab", "--timeout", str(TIMEOUT_S)],
                   {**base, "GPUPOOL_URL": url, "GPUPOOL_TOKEN": "gp_none"}, timeout_s=120)
    return done, time.monotonic() - started


@pytest.fixture
def silent() -> Iterator[str]:
    """A loopback address that takes connections and never answers (a stopped or wedged server)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # connections complete in the backlog; nothing is ever read or written
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_wait_gives_up_at_its_timeout_while_the_server_is_down() -> None:
    done, took = wait(f"http://127.0.0.1:{free_port()}")
    assert took < TIMEOUT_S + SLACK_S, took
    assert done.returncode == 4, (done.returncode, done.stderr)
    *_, error = done.stderr.splitlines()
    assert error.startswith("Error: Cannot reach the gpupool server"), error
    assert error.endswith(f"gave up when --timeout ({TIMEOUT_S} s) passed."), error


def test_wait_gives_up_at_its_timeout_while_the_server_is_silent(silent: str) -> None:
    done, took = wait(silent)
    assert took < TIMEOUT_S + SLACK_S, took
    assert done.returncode == 4, (done.returncode, done.stderr)
    assert done.stderr.splitlines()[-1].endswith(f"gave up when --timeout ({TIMEOUT_S} s) passed.")
