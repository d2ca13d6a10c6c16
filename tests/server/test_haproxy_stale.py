"""`stop_stale`: the HAProxy a killed run of the pool left behind is ended at the next start, also
when it does not end on SIGTERM (it is then killed), and a process that does not name the pool's
configuration is never signalled. Needs no HAProxy: a Python process stands in for it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from gpupool.server.dataplane.haproxy import stop_stale
from gpupool.server.dataplane.haproxy_config import HAProxyPaths

DEAF = ("import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n")


def _stand_in(*argv: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", DEAF, *argv], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # SIGTERM ignored from here
    return proc


def test_a_stale_haproxy_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    paths = HAProxyPaths(tmp_path / "dataplane")
    paths.directory.mkdir()
    proc = _stand_in("-f", str(paths.config))
    try:
        paths.pidfile.write_text(f"{proc.pid}\n")
        start = time.monotonic()
        assert stop_stale(paths.directory, timeout_s=2.0)
        assert proc.wait(timeout=10) == -9  # killed: SIGTERM alone left it running
        assert time.monotonic() - start < 10
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_does_not_name_the_configuration_is_left_alone(tmp_path: Path) -> None:
    paths = HAProxyPaths(tmp_path / "dataplane")
    paths.directory.mkdir()
    proc = _stand_in("-f", str(tmp_path / "elsewhere" / "haproxy.cfg"))
    try:
        paths.pidfile.write_text(f"{proc.pid}\n")
        assert not stop_stale(paths.directory, timeout_s=2.0)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
