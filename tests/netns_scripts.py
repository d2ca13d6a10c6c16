"""The two programs the pod network tests run in pods and namespaces: a service that answers every
connection with its secret, and a probe that says whether it reached one (and what it was told);
and `eventually`, their wait for what an agent's thread does off the poll's path.

Each is a Python script for `python -c`; whether the probe got the service's own secret is what a
test of isolation asserts, so every service is given a secret its test names."""

from __future__ import annotations

import time
from collections.abc import Callable

SERVICE_PORT = 7000


def eventually(check: Callable[[], object], timeout_s: float = 20.0) -> bool:
    """Whether `check()` holds within `timeout_s`: a pod's network is kept, lent back or torn down
    by a thread of the agent, off the poll's path, so it may lag the poll that reported the pod's
    end a little."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def listen(secret: str | None, port: int = SERVICE_PORT) -> str:
    """Listen on `port` on every address of the network it is in, print `address <its pod address>`
    (127.0.0.1 outside a pod's namespace) once it listens, then answer each connection with
    `secret`, or with `from <the caller's address>` when `secret` is None, until killed."""
    answer = repr(secret.encode()) if secret is not None else '("from " + peer[0]).encode()'
    return f"""
import os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {port:d}))
s.listen(16)
print("address", os.environ.get("GPUPOOL_POD_ADDRESS", "127.0.0.1"), flush=True)
while True:
    c, peer = s.accept()
    c.sendall({answer})
    c.close()
"""


READ_TIMEOUT_S = 30.0
"""How long a probe that connected waits for the service's answer: the kernel completes a connection
to a listening socket by itself, so only `timeout_s` decides whether one was dropped on the way; the
answer needs the service's process to run, which a loaded machine may delay past that."""


def connect(target: str, port: int = SERVICE_PORT, timeout_s: float = 2.0) -> str:
    """Connect to `target`:`port` and print `reached <what the service said>`, or `blocked <the
    error's name>` (a connection dropped on the way times out: `blocked TimeoutError`)."""
    return f"""
import socket
try:
    c = socket.create_connection(({target!r}, {port:d}), timeout={timeout_s!r})
    c.settimeout({READ_TIMEOUT_S!r})
    print("reached", c.recv(100).decode(), flush=True)
except OSError as exc:
    print("blocked", type(exc).__name__, flush=True)
"""
