"""The pod network tests' probe: whether it reached a service depends on the network, not on how
soon a loaded machine runs the service's process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from netns_scripts import connect, eventually, listen
from ports import free_port


def accepted_by_the_kernel(port: int) -> bool:
    """Whether a connection to local `port` is established (the service has not run to accept it)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
            return True
    return False


def test_a_service_held_up_past_the_connect_timeout_is_still_reached() -> None:
    port = free_port()
    service = subprocess.Popen([sys.executable, "-c", listen("the secret", port)], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert service.stdout is not None and service.stdout.readline().startswith("address")
        os.kill(service.pid, signal.SIGSTOP)  # as a machine too busy to run it for a while would
        probe = subprocess.Popen([sys.executable, "-c", connect("127.0.0.1", port, timeout_s=0.5)],
                                 stdout=subprocess.PIPE, text=True)
        assert probe.stdout is not None
        assert eventually(lambda: accepted_by_the_kernel(port)), "the probe never connected"
        with contextlib.suppress(subprocess.TimeoutExpired):  # the stall, past the probe's timeout
            probe.wait(timeout=1.5)
        os.kill(service.pid, signal.SIGCONT)
        out, _ = probe.communicate(timeout=30)
        assert out.strip() == "reached the secret"
    finally:
        service.kill()
        service.wait()


def test_nothing_listening_is_blocked_at_once() -> None:
    done = subprocess.run([sys.executable, "-c", connect("127.0.0.1", free_port(), timeout_s=0.5)],
                          capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "blocked ConnectionRefusedError"
