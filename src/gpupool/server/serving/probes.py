"""Readiness and liveness probes, run by a bounded pool of worker threads off the controller's path:
the controller hands due probes over without waiting and collects the outcomes on its next pass.

An HTTP probe passes on a 2xx or 3xx answer to GET path; a TCP probe when the connection is
accepted. A probe that fails says why in one line (the service shows the last one).
"""

from __future__ import annotations

import http.client
import queue
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gpupool.api.services import ProbeKind, ProbeSpec


@dataclass(frozen=True, slots=True)
class ProbeResult:
    workload_id: str
    kind: str
    """readiness or liveness."""
    ok: bool
    error: str


def probe_once(probe: ProbeSpec, host: str, port: int) -> str:
    """'' when the probe passes, else a sentence on what it found. Blocks up to probe.timeout_s."""
    try:
        if probe.kind is ProbeKind.TCP:
            with socket.create_connection((host, port), timeout=probe.timeout_s):
                return ""
        conn = http.client.HTTPConnection(host, port, timeout=probe.timeout_s)
        try:
            conn.request("GET", probe.path, headers={"User-Agent": "gpupool-probe"})
            status = conn.getresponse().status
        finally:
            conn.close()
        if 200 <= status < 400:
            return ""
        return f"GET {probe.path} on {host}:{port} answered {status}"
    except TimeoutError:
        return f"{probe.kind.value} probe of {host}:{port} timed out after {probe.timeout_s:g} s"
    except (OSError, http.client.HTTPException) as exc:
        what = f"GET {probe.path}" if probe.kind is ProbeKind.HTTP else "TCP connect"
        return f"{what} on {host}:{port} failed: {exc.strerror or exc}" if isinstance(exc, OSError) and \
            exc.strerror else f"{what} on {host}:{port} failed: {exc.__class__.__name__} {exc}".rstrip()


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
