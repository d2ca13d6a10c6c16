"""The dashboard tests' browser on a network of its own: a network namespace with only loopback, in
which every TCP connection to 127.0.0.1 is taken (nftables' redirect) to one listener that this
process holds there and carried to the same port of 127.0.0.1 on the host, so a page reaches a server
the tests started at the address the tests know it by.

Why: Chromium aborts the requests it has in flight with ERR_NETWORK_CHANGED whenever an address or
link of its network changes, and the tests beside these ones (pod network namespaces, Ray machines)
add and remove veths and addresses on the host all the time. In a namespace of its own the browser
sees none of that. Where namespaces cannot be made (not root, no `ip` or `nft`), the browser shares
the host's network as before, and so do the tests that would change it (they skip there too).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
SO_ORIGINAL_DST = 80
"""linux/netfilter_ipv4.h: the destination a connection had before NAT redirected it."""


def unavailable() -> str:
    """Why the browser cannot have a namespace of its own here ('' when it can)."""
    if os.geteuid() != 0:
        return "not root"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    return f"{' and '.join(missing)} not installed" if missing else ""


class BrowserNetwork:
    """A namespace of loopback only, its 127.0.0.1 carried to the host's (see the module)."""

    def __init__(self, directory: Path) -> None:
        self.name = f"gpupool-ui-{os.getpid()}"
        self.directory = directory
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        """Make the namespace and its carrying, and check that a connection made inside it reaches
        the host's 127.0.0.1 (RuntimeError with why where it does not: a kernel without NAT, say)."""
        for left in Path("/run/netns").glob("gpupool-ui-*"):  # those of killed runs
            pid = left.name.rsplit("-", 1)[1]
            if pid.isdigit() and (int(pid) == os.getpid() or not Path(f"/proc/{pid}").exists()):
                _run(["ip", "netns", "del", left.name], check=False)
        _run(["ip", "netns", "add", self.name])
        try:
            _run(["ip", "-n", self.name, "link", "set", "lo", "up"])
            self._listener = self._inside(_listener)
            port = self._listener.getsockname()[1]
            rules = ("table ip gpupool_ui {\n chain out {\n"
                     "  type nat hook output priority -100; policy accept;\n"
                     f"  ip daddr 127.0.0.1 tcp dport != {port} redirect to :{port}\n }}\n}}\n")
            _run(["ip", "netns", "exec", self.name, "nft", "-f", "-"], stdin=rules)
            threading.Thread(target=self._accept, name="browser-net", daemon=True).start()
            self._check()
        except BaseException:
            self.close()
            raise

    def _check(self) -> None:
        with socket.create_server(("127.0.0.1", 0)) as host_side:
            host_side.settimeout(10)
            port = host_side.getsockname()[1]

            def answer() -> None:  # the host's side, while the namespace's connects
                with contextlib.suppress(OSError), host_side.accept()[0] as accepted:
                    accepted.sendall(b"ok")

            def reach() -> bytes:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as inside:
                    return inside.recv(2)

            answering = threading.Thread(target=answer)
            answering.start()
            try:
                said = self._inside(reach)
            except OSError as exc:
                raise RuntimeError(f"a connection made in it did not reach the host ({exc})") from None
            finally:
                answering.join()
            if said != b"ok":
                raise RuntimeError(f"the namespace's side of a carried connection read {said!r}")

    def wrap(self, executable: str) -> str:
        """An executable that runs `executable` with its arguments inside the namespace (what the
        browser is launched as: Playwright talks to it over pipes, which no namespace divides)."""
        path = self.directory / "browser-in-namespace"
        path.write_text(f'#!/bin/sh\nexec ip netns exec {self.name} {executable} "$@"\n')
        path.chmod(0o755)
        return str(path)

    def close(self) -> None:
        self._closed = True
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.close()
        _run(["ip", "netns", "del", self.name], check=False)

    def _inside(self, make: Callable[[], T]) -> T:
        """`make()` run by a thread that joins the namespace for that alone (a socket stays in the
        namespace it was made in; a thread's switch is its own)."""
        made: list[T | BaseException] = []

        def run() -> None:
            libc = ctypes.CDLL(None, use_errno=True)
            own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            theirs = os.open(f"/run/netns/{self.name}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(theirs, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns into the browser's namespace")
                try:
                    made.append(make())
                finally:
                    if libc.setns(own, CLONE_NEWNET) != 0:  # never leave a thread behind in it
                        raise OSError(ctypes.get_errno(), "setns back")
            except BaseException as exc:
                made.append(exc)
            finally:
                os.close(own)
                os.close(theirs)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        result = made[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed:
            try:
                inside, _peer = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._carry, args=(inside,), daemon=True).start()

    def _carry(self, inside: socket.socket) -> None:
        try:
            original = inside.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
            (port,) = struct.unpack_from("!H", original, 2)
            outside = socket.create_connection(("127.0.0.1", port), timeout=30)
            outside.settimeout(None)
        except OSError:
            inside.close()  # nothing listens there: the browser sees the connection refused
            return
        with self._lock:
            self._open.update((inside, outside))
        pump = threading.Thread(target=_pump, args=(outside, inside), daemon=True)
        pump.start()
        _pump(inside, outside)
        pump.join()
        with self._lock:
            self._open.difference_update((inside, outside))
        inside.close()
        outside.close()


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until `source` ends, then end `sink`'s sending side (a half-close travels on)."""
    with contextlib.suppress(OSError):
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _run(argv: list[str], *, check: bool = True, stdin: str | None = None) -> None:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
