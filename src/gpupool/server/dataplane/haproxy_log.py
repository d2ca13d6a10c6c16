"""Per-request latency from HAProxy: its request log, sent as datagrams to a unix socket of the pool.

`show stat` gives only the mean of a backend's last 1024 requests; HAProxy's own log has each
request's total time (`%Tt`). The pool binds a datagram socket in the router's private directory,
HAProxy logs one short raw line per request to it (`<backend> <Tt ms> <status>`), and a thread keeps
the last LATENCY_SAMPLES times per backend. Bounded everywhere: HAProxy never blocks on the log (a
datagram the socket cannot take is dropped by the kernel and counted by HAProxy), a line is at most
LINE_MAX bytes, and only backends of routed services are kept.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("gpupool.dataplane")
LINE_MAX = 256
LATENCY_SAMPLES = 2048
"""Per backend, as the in-process router keeps (proxy.py)."""
LOG_FORMAT = "%b %Tt %ST"
"""What HAProxy writes per request: the backend, the total time in ms, the status."""


def _quantile(ordered: list[float], q: float) -> float | None:
    """As the in-process router computes it (proxy.py): the sample at rank q."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


class LatencyLog:
    """Receives HAProxy's request log on `path`; `quantiles(backend)` -> (p50, p99) in ms or None."""

    def __init__(self, path: Path, wanted: Callable[[str], bool]) -> None:
        self.path = path
        self.wanted = wanted
        """Whether a backend name is one of a routed service (others' lines are dropped)."""
        self._samples: dict[str, deque[float]] = {}
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        sock.settimeout(0.5)
        self._sock = sock
        self._thread = threading.Thread(target=self._run, name="haproxy-latency-log", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.path.unlink(missing_ok=True)

    def _run(self) -> None:
        while True:
            sock = self._sock
            if sock is None:
                return
            try:
                data = sock.recv(LINE_MAX)
            except TimeoutError:
                continue
            except OSError:
                return  # closed by stop()
            self.take(data)

    def take(self, data: bytes) -> None:
        """One log line: `<backend> <Tt> <status>` (anything else is ignored)."""
        parts = data.decode("ascii", "replace").split()
        if len(parts) < 2 or not self.wanted(parts[0]):
            return
        try:
            total_ms = float(parts[1])
        except ValueError:
            return
        if total_ms < 0:  # -1: the request was aborted before a full answer
            return
        with self._lock:
            self._samples.setdefault(parts[0], deque(maxlen=LATENCY_SAMPLES)).append(total_ms)

    def quantiles(self, backend: str) -> tuple[float | None, float | None]:
        with self._lock:
            ordered = sorted(self._samples.get(backend, ()))
        return _quantile(ordered, 0.5), _quantile(ordered, 0.99)

    def forget(self, keep: set[str]) -> None:
        """Drop the samples of backends no longer routed."""
        with self._lock:
            for name in set(self._samples) - keep:
                del self._samples[name]
