"""Readiness and liveness probes, run by a bounded pool of worker threads off the controller's path:
the controller hands due probes over without waiting and collects the outcomes on its next pass.

An HTTP probe passes on a 2xx or 3xx answer to GET path; a TCP probe when the connection is
accepted. A probe that fails says why in one line (the service shows the last one).
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gpupool.api.services import ProbeKind, ProbeSpec

MAX_STATUS_LINE = 1024


@dataclass(frozen=True, slots=True)
class ProbeResult:
    workload_id: str
    kind: str
    """readiness or liveness."""
    ok: bool
    error: str


def probe_once(probe: ProbeSpec, host: str, port: int) -> str:
    """'' when the probe passes, else a sentence on what it found. Returns within probe.timeout_s
    (plus scheduling slack) whatever the replica does: the deadline covers the connect and the whole
    status line, so a replica that answers one byte at a time cannot hold a probe thread."""
    deadline = time.monotonic() + probe.timeout_s
    http = probe.kind is ProbeKind.HTTP
    what = f"GET {probe.path} on {host}:{port}" if http else f"TCP connect to {host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=probe.timeout_s) as conn:
            if not http:
                return ""
            conn.sendall(f"GET {probe.path} HTTP/1.0\r\nHost: {host}:{port}\r\nUser-Agent: gpupool-probe\r\n"
                         "Connection: close\r\n\r\n".encode())
            line = _status_line(conn, deadline)
    except TimeoutError:
        return f"{what} timed out after {probe.timeout_s:g} s"
    except OSError as exc:
        return f"{what} failed: {exc.strerror or exc.__class__.__name__}"
    parts = line.split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        return f"{what} did not answer HTTP (it sent {line[:60]!r})"
    status = int(parts[1])
    return "" if 200 <= status < 400 else f"{what} answered {status}"


def _status_line(conn: socket.socket, deadline: float) -> bytes:
    """The answer's first line, read by the deadline (TimeoutError past it)."""
    buf = b""
    while b"\r\n" not in buf and len(buf) < MAX_STATUS_LINE:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        conn.settimeout(left)
        chunk = conn.recv(MAX_STATUS_LINE)
        if not chunk:
            break
        buf += chunk
    return buf.split(b"\r\n", 1)[0]


class Prober:
    """At most `concurrency` probes in flight; at most one per (replica, kind)."""

    def __init__(self, concurrency: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="gpupool-probe")
        self._results: queue.SimpleQueue[ProbeResult] = queue.SimpleQueue()
        self._in_flight: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def start(self, workload_id: str, kind: str, probe: ProbeSpec, host: str, port: int) -> bool:
        """Hand one probe over (never waits); False when that replica's probe of this kind still runs."""
        key = (workload_id, kind)
        with self._lock:
            if key in self._in_flight:
                return False
            self._in_flight.add(key)
        self._pool.submit(self._run, key, probe, host, port)
        return True

    def _run(self, key: tuple[str, str], probe: ProbeSpec, host: str, port: int) -> None:
        try:
            error = probe_once(probe, host, port)
        except Exception as exc:  # a probe must never take its worker down
            error = f"probe failed: {exc}"
        with self._lock:
            self._in_flight.discard(key)
        self._results.put(ProbeResult(key[0], key[1], not error, error))

    def results(self) -> list[ProbeResult]:
        """The outcomes that came back since the last call."""
        out: list[ProbeResult] = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
