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
from collections import deque
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


@dataclass(frozen=True, slots=True)
class _Job:
    key: tuple[str, str]
    probe: ProbeSpec
    host: str
    port: int


class Prober:
    """`concurrency` worker threads; at most one probe per (replica, kind) queued or in flight. The
    workers take tenants in turn, and no tenant holds more than half of them at once: a tenant whose
    replicas hang every probe until its timeout delays only its own. The threads start with the
    first probe: a server whose app is built but never served (or that runs no service) has none,
    and none are left behind when its loops never start or stop."""

    def __init__(self, concurrency: int) -> None:
        self.per_tenant = max(1, concurrency // 2)
        self._results: queue.SimpleQueue[ProbeResult] = queue.SimpleQueue()
        self._waiting: dict[str, deque[_Job]] = {}
        self._busy: dict[str, int] = {}
        self._turn: deque[str] = deque()
        self._known: set[tuple[str, str]] = set()
        self._changed = threading.Condition()
        self._closed = False
        self._workers = [threading.Thread(target=self._work, name=f"gpupool-probe-{i}", daemon=True)
                         for i in range(concurrency)]
        self._started = False

    def start(self, workload_id: str, kind: str, probe: ProbeSpec, host: str, port: int,
              tenant: str = "") -> bool:
        """Queue one probe (never waits); False when that replica's probe of this kind is queued or runs."""
        key = (workload_id, kind)
        with self._changed:
            if key in self._known or self._closed:
                return False
            self._known.add(key)
            if tenant not in self._waiting:
                self._waiting[tenant] = deque()
                self._turn.append(tenant)
            self._waiting[tenant].append(_Job(key, probe, host, port))
            if not self._started:
                self._started = True
                for worker in self._workers:
                    worker.start()
            self._changed.notify()
        return True

    @property
    def threads(self) -> int:
        """Worker threads started (0 until the first probe, then `concurrency`)."""
        return sum(worker.is_alive() for worker in self._workers)

    def _next(self) -> tuple[str, _Job] | None:
        """The first tenant in turn with a queued probe and a free share (under the lock)."""
        for _ in range(len(self._turn)):
            tenant = self._turn[0]
            self._turn.rotate(-1)
            jobs = self._waiting.get(tenant)
            if jobs and self._busy.get(tenant, 0) < self.per_tenant:
                self._busy[tenant] = self._busy.get(tenant, 0) + 1
                return tenant, jobs.popleft()
        return None

    def _work(self) -> None:
        while True:
            with self._changed:
                taken = self._next()
                while taken is None and not self._closed:
                    self._changed.wait()
                    taken = self._next()
                if taken is None:
                    return
            tenant, job = taken
            try:
                error = probe_once(job.probe, job.host, job.port)
            except Exception as exc:  # a probe must never take its worker down
                error = f"probe failed: {exc}"
            with self._changed:
                self._known.discard(job.key)
                self._busy[tenant] = busy = self._busy.get(tenant, 1) - 1
                if not busy and not self._waiting.get(tenant):  # forget a tenant with nothing left
                    self._waiting.pop(tenant, None)
                    self._busy.pop(tenant, None)
                    if tenant in self._turn:
                        self._turn.remove(tenant)
                self._changed.notify_all()
            self._results.put(ProbeResult(job.key[0], job.key[1], not error, error))

    def results(self) -> list[ProbeResult]:
        """The outcomes that came back since the last call."""
        out: list[ProbeResult] = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        """Queued probes are dropped; those running end by their own deadline."""
        with self._changed:
            self._closed = True
            self._waiting.clear()
            self._changed.notify_all()
